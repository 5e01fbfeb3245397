package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The cluster the demo runs on.
const (
	controlPlanes = 3
	workers       = 3
	simNodes      = 50
)

// Deadlines: the whole demo takes a few minutes; these only stop a hung step.
const (
	clusterTimeout = 8 * time.Minute
	stepTimeout    = 4 * time.Minute
	stopTimeout    = 2 * time.Minute
)

// demo holds what every step needs: where things are and how to talk to the cluster.
type demo struct {
	opts       options
	out        io.Writer
	color      bool
	bin        string // absolute
	work       string // the demo's directory
	clusterDir string
	kubeconfig string
	env        []string // for every command: KUBECONFIG, PATH with bin first
}

// step is one narrated part of the demo.
type step struct {
	short string // its row in the summary
	title string // its heading
	why   string // what it shows and why, under the heading
	run   func(ctx context.Context) error
}

// run is the whole demo; it returns the process's exit code.
func run(ctx context.Context, o options, out io.Writer) int {
	d := &demo{opts: o, out: out, color: isTerminal(out)}
	start := time.Now()
	var results []result

	cl, res := d.setUp(ctx)
	results = append(results, res)
	steps := d.steps()
	failed := res.err != nil
	for i, s := range steps {
		r := result{name: fmt.Sprintf("%d  %s", i+1, s.short), status: statusNotRun}
		if !failed {
			d.heading(fmt.Sprintf("%d/%d  %s", i+1, len(steps), s.title), s.why)
			r = d.timed(r.name, func() error {
				sctx, cancel := context.WithTimeout(ctx, stepTimeout)
				defer cancel()
				return s.run(sctx)
			})
			failed = r.err != nil
			if failed {
				d.sayf("%s", d.paint(red, fmt.Sprintf("step %d failed: %v", i+1, r.err)))
			}
		}
		results = append(results, r)
	}
	if !failed {
		d.heading("All operations", "Nothing nodeops made is deleted on its own: every operation stays, with its tasks, for later inspection.")
		_ = d.sh(ctx, "kubectl", "nodeops", "get")
	}

	// Stop everything it started: always on interruption, else unless --keep.
	keep := o.keep && ctx.Err() == nil && cl != nil && d.kubeconfig != ""
	if cl != nil {
		if keep {
			results = append(results, result{name: "-  stop", status: "left running (--keep)"})
		} else {
			d.heading("Stop", "Stop nodeops-local: the control plane, kwok, the manager and every agent.")
			results = append(results, d.timed("-  stop everything", func() error { return cl.stop(stopTimeout) }))
		}
	}
	failed = false
	for _, r := range results {
		failed = failed || r.err != nil || r.status == statusNotRun
	}
	if !keep && d.work != "" {
		d.cleanUp(failed)
	}
	d.printSummary(results, time.Since(start), failed)
	if keep {
		d.printKeep()
	}
	if failed {
		return 1
	}
	return 0
}

// setUp makes the demo's directory and starts nodeops-local.
func (d *demo) setUp(ctx context.Context) (*cluster, result) {
	name := fmt.Sprintf("cluster  nodeops-local: %d control planes, %d workers, %d sim nodes", controlPlanes, workers, simNodes)
	d.heading(fmt.Sprintf("Start a local cluster: %d control planes, %d workers, %d simulated nodes", controlPlanes, workers, simNodes),
		"nodeops-local runs a real etcd, kube-apiserver, controller-manager and scheduler, kwok in place of the\n"+
			"kubelets, the nodeops manager, and one agent per node with a host root: a small directory tree with\n"+
			"real kubeadm PKI. The 50 sim-* nodes share one agent that records commands without running them.")
	var cl *cluster
	r := d.timed(name, func() error {
		if err := d.prepare(); err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, clusterTimeout)
		defer cancel()
		var err error
		cl, err = startCluster(d.bin, d.clusterDir, filepath.Join(d.work, "nodeops-local.log"), d.opts.keep,
			fmt.Sprintf("--control-planes=%d", controlPlanes), fmt.Sprintf("--workers=%d", workers), fmt.Sprintf("--sim-nodes=%d", simNodes))
		if err != nil {
			return err
		}
		d.sayf("$ %s", d.paint(bold, fmt.Sprintf("nodeops-local up --dir %s --control-planes %d --workers %d --sim-nodes %d", d.clusterDir, controlPlanes, workers, simNodes)))
		kc, err := cl.waitReady(cctx, d.out)
		if err != nil {
			return err
		}
		d.kubeconfig = kc
		d.env = append(os.Environ(), "KUBECONFIG="+kc, "PATH="+d.bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		d.sayf("\nEvery command below runs with these (kubectl finds the plugin kubectl-nodeops on PATH):")
		d.sayf("  export KUBECONFIG=%s", kc)
		d.sayf("  export PATH=%s:$PATH", d.bin)
		return d.showNodes(cctx)
	})
	return cl, r
}

// prepare checks the binaries and makes the demo's directory.
func (d *demo) prepare() error {
	bin, err := filepath.Abs(d.opts.bin)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", d.opts.bin, err)
	}
	d.bin = bin
	for _, name := range []string{"nodeops-local", "manager", "agent", "kubectl", "kubectl-nodeops", "kubeadm"} {
		if _, err := os.Stat(filepath.Join(bin, name)); err != nil {
			return fmt.Errorf("%s is not built (run make demo, which builds everything): %w", filepath.Join(bin, name), err)
		}
	}
	for _, f := range []string{sampleFile, simRolloutFile, maintenanceFile} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("run from the repository's root (hack/demo.sh does): %w", err)
		}
	}
	if d.opts.dir != "" {
		if err := os.MkdirAll(d.opts.dir, 0o755); err != nil {
			return fmt.Errorf("making %s: %w", d.opts.dir, err)
		}
		d.work, err = filepath.Abs(d.opts.dir)
		if err != nil {
			return fmt.Errorf("resolving %s: %w", d.opts.dir, err)
		}
	} else {
		d.work, err = os.MkdirTemp("", "nodeops-demo.")
		if err != nil {
			return fmt.Errorf("making the demo's directory: %w", err)
		}
	}
	d.clusterDir = filepath.Join(d.work, "cluster")
	return nil
}

// cleanUp removes a temporary directory after a successful run; a given --dir, or one with the logs
// of a failure, is left.
func (d *demo) cleanUp(failed bool) {
	switch {
	case failed:
		d.sayf("Logs and node roots are left in %s (nodeops-local's own log: %s, its children's: %s).",
			d.work, filepath.Join(d.work, "nodeops-local.log"), filepath.Join(d.clusterDir, "logs"))
	case d.opts.dir != "":
		d.sayf("Logs and node roots are in %s.", d.work)
	default:
		if err := os.RemoveAll(d.work); err != nil {
			d.sayf("could not remove %s: %v", d.work, err)
		}
	}
}

func (d *demo) printKeep() {
	d.sayf("")
	d.sayf("The cluster is still running (--keep). To use it:")
	d.sayf("export KUBECONFIG=%s", d.kubeconfig)
	d.sayf("export PATH=%s:$PATH", d.bin)
	d.sayf("Then for example: kubectl nodeops get; kubectl get nodes. Logs: %s. Stop it with:", filepath.Join(d.clusterDir, "logs"))
	d.sayf("  %s down --dir %s", filepath.Join(d.bin, "nodeops-local"), d.clusterDir)
	d.sayf("(The shim files' HTTP server stopped with the demo.)")
}

func (d *demo) timed(name string, f func() error) result {
	start := time.Now()
	err := f()
	r := result{name: name, status: statusOK, took: time.Since(start), err: err}
	if err != nil {
		r.status = statusFailed
	}
	return r
}

// Output.

const (
	bold = "1"
	cyan = "1;36"
	red  = "1;31"
)

func (d *demo) paint(code, s string) string {
	if !d.color {
		return s
	}
	return "\x1b[" + code + "m" + s + "\x1b[0m"
}

func (d *demo) heading(title, why string) {
	rule := strings.Repeat("─", 78)
	fmt.Fprintf(d.out, "\n%s\n%s\n%s\n", d.paint(cyan, rule), d.paint(cyan, " "+title), d.paint(cyan, rule))
	if why != "" {
		fmt.Fprintln(d.out, why)
	}
}

func (d *demo) sayf(format string, args ...any) {
	fmt.Fprintf(d.out, format+"\n", args...)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// Commands.

// execOpts says how a command is shown and what counts as success.
type execOpts struct {
	show     string // shown after "$ " instead of the arguments
	wantExit int
	capture  bool          // keep the standard output instead of printing it
	quiet    bool          // do not print the "$ ..." line
	started  chan struct{} // closed once the command started
}

// sh shows and runs a command; its output goes to the screen.
func (d *demo) sh(ctx context.Context, args ...string) error {
	_, err := d.exec(ctx, execOpts{}, args...)
	return err
}

// output runs a command without showing it and returns its standard output.
func (d *demo) output(ctx context.Context, args ...string) (string, error) {
	return d.exec(ctx, execOpts{capture: true, quiet: true}, args...)
}

func (d *demo) exec(ctx context.Context, o execOpts, args ...string) (string, error) {
	if !o.quiet {
		show := o.show
		if show == "" {
			show = shellJoin(args)
		}
		fmt.Fprintf(d.out, "\n$ %s\n", d.paint(bold, show))
	}
	path := args[0]
	if p := filepath.Join(d.bin, args[0]); !strings.Contains(args[0], "/") && fileExists(p) {
		path = p
	}
	cmd := exec.CommandContext(ctx, path, args[1:]...)
	cmd.Env = d.env
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	if o.capture {
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
	} else {
		cmd.Stdout, cmd.Stderr = d.out, d.out
	}
	err := cmd.Start()
	if o.started != nil {
		close(o.started)
	}
	if err == nil {
		err = cmd.Wait()
	}
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		return "", fmt.Errorf("running %s: %w", args[0], err)
	}
	if ctx.Err() != nil {
		return stdout.String(), fmt.Errorf("%s: %w", shellJoin(args), context.Cause(ctx))
	}
	if code != o.wantExit {
		msg := strings.TrimSpace(stderr.String())
		if msg != "" {
			msg = ": " + msg
		}
		return stdout.String(), fmt.Errorf("%s exited %d, expected %d%s", shellJoin(args), code, o.wantExit, msg)
	}
	return stdout.String(), nil
}

// shellJoin quotes what a shell would need quoted.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$`\\|&;<>()*?[]{}!#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
