// Command bench measures nodeops at scale (`make bench`): for each K it starts nodeops-local with K
// simulated nodes (the manager and the shared no-op agent as real processes) and measures the API
// server's raw write limit, a one-command custom operation at maxUnavailable 100% and 10%, and an
// autoProvision NodeProfile, and the ClusterTarget at rest. It prints a markdown table beside the targets of issue 8 and writes it
// to bench/results.md with the machine and the commit. Nothing asserts times: it is a measurement.
//
//	go run ./bench [-k 100,1000,5000,10000] [-quick] [-out bench/results.md] [-raw-creates 5000] [-raw-clients 32] [-only op100] [-profile DIR]
//
// It only measures: it changes no default of nodeops, and no binary nodeops ships links it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeops/nodeops/internal/localcluster"
)

// options of one bench run.
type options struct {
	ks         []int
	quick      bool
	rawCreates int
	rawClients int
	out        string
	binDir     string
	workDir    string
	keep       bool
	timeout    time.Duration
	// scenarios to run, by name (raw, target, op100, op10, opgate, profile); all when empty.
	only map[string]bool
	// profileDir, when set, receives a CPU profile of the manager and the sim agent for each
	// operation or profile run, profileSeconds long from just before its create.
	profileDir     string
	profileSeconds int
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

func parseOptions(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ks := fs.String("k", "100,1000,5000,10000", "comma-separated numbers of simulated nodes, one cluster each")
	fs.BoolVar(&o.quick, "quick", false, "smoke run: K=50 and 1,000 raw creates unless -k/-raw-creates say otherwise")
	fs.IntVar(&o.rawCreates, "raw-creates", 5000, "ConfigMaps created to measure the API server's raw write limit")
	fs.IntVar(&o.rawClients, "raw-clients", 32, "parallel clients (own connections) for the raw write limit")
	fs.StringVar(&o.out, "out", "bench/results.md", "markdown file to write the results to; empty writes none")
	fs.StringVar(&o.binDir, "bin", "", "directory of the binaries (default $NODEOPS_BIN, else bin/ of the repository)")
	fs.StringVar(&o.workDir, "dir", "", "directory for the clusters' directories (default a new temporary directory)")
	fs.BoolVar(&o.keep, "keep", false, "keep the clusters' directories (logs) after the run")
	fs.DurationVar(&o.timeout, "timeout", 15*time.Minute, "deadline of each measured run")
	fs.StringVar(&o.profileDir, "profile", "", "directory for CPU profiles (pprof) of the manager and the sim agent, one per operation or profile run; empty takes none")
	fs.IntVar(&o.profileSeconds, "profile-seconds", 20, "length of each -profile profile, from just before the run's create")
	only := fs.String("only", "", "comma-separated scenarios to run: raw,target,op100,op10,opgate,profile (default all)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	kSet, rawSet := false, false
	fs.Visit(func(f *flag.Flag) {
		kSet = kSet || f.Name == "k"
		rawSet = rawSet || f.Name == "raw-creates"
	})
	if o.quick && !kSet {
		*ks = "50"
	}
	if o.quick && !rawSet {
		o.rawCreates = 1000
	}
	for _, s := range strings.Split(*ks, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || k < 1 {
			return o, fmt.Errorf("-k: %q is not a positive number", s)
		}
		o.ks = append(o.ks, k)
	}
	if *only != "" {
		o.only = map[string]bool{}
		for _, s := range strings.Split(*only, ",") {
			s = strings.TrimSpace(s)
			switch s {
			case scenarioRaw, scenarioTarget, scenarioOp100, scenarioOp10, scenarioOpGate, scenarioProfile:
				o.only[s] = true
			default:
				return o, fmt.Errorf("-only: unknown scenario %q", s)
			}
		}
	}
	if o.profileDir != "" {
		if o.profileSeconds < 1 {
			return o, fmt.Errorf("-profile-seconds must be positive")
		}
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return o, fmt.Errorf("-profile: %w", err)
		}
	}
	if o.rawCreates < 1 || o.rawClients < 1 {
		return o, fmt.Errorf("-raw-creates and -raw-clients must be positive")
	}
	if o.binDir == "" {
		d, err := localcluster.DefaultBinDir()
		if err != nil {
			return o, err
		}
		o.binDir = d
	}
	return o, nil
}

func (o options) wants(s string) bool { return o.only == nil || o.only[s] }

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseOptions(args, stderr)
	if err != nil {
		return err
	}
	// controller-runtime's client logs through this; warnings only.
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if o.workDir == "" {
		d, err := os.MkdirTemp("", "nodeops-bench-")
		if err != nil {
			return fmt.Errorf("creating a work directory: %w", err)
		}
		o.workDir = d
		if !o.keep {
			defer os.RemoveAll(d)
		}
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(stderr, "bench: %s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	rep := report{Machine: describeMachine(ctx, o.binDir), Quick: o.quick}
	logf("machine: %s", rep.Machine.oneLine())
	for _, k := range o.ks {
		if ctx.Err() != nil {
			break
		}
		res, err := benchK(ctx, o, k, filepath.Join(o.workDir, fmt.Sprintf("k%d", k)), logf)
		if err != nil {
			logf("K=%d: %v", k, err)
			res.Err = err.Error()
		}
		rep.Clusters = append(rep.Clusters, res)
	}
	rep.LoadAfter = readLoadAvg()
	md := rep.markdown()
	fmt.Fprint(stdout, md)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(md), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", o.out, err)
		}
		logf("wrote %s", o.out)
	}
	for _, c := range rep.Clusters {
		if c.Err != "" {
			return fmt.Errorf("the run at K=%d did not complete: %s", c.K, c.Err)
		}
	}
	return ctx.Err()
}
