package host

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"strings"
)

// DryRun is h as a DryRun sees it: files are read as they are, and every change to a file, a service,
// a static pod or a program run is reported to out instead of made. Kubeadm is left as it is:
// its dry run is a real invocation with --dry-run, which the kubeadm commands make themselves.
func (h *Host) DryRun(out io.Writer) *Host {
	if out == nil {
		out = io.Discard
	}
	return &Host{
		Root:       h.Root,
		Exec:       &DryRunRunner{Out: out},
		Kubeadm:    h.Kubeadm,
		Files:      &DryRunFiles{Files: h.Files, Out: out},
		Services:   &DryRunServices{Services: h.Services, Out: out},
		StaticPods: DryRunStaticPods{},
		// Reading the kubelet's pods changes nothing.
		KubeletPods: h.KubeletPods,
	}
}

// DryRunFiles reads through Files and reports each change to Out. It implements every method itself
// (no embedding), so a write method added to Files cannot slip through to the real files.
type DryRunFiles struct {
	Files Files
	Out   io.Writer
}

func (d *DryRunFiles) report(format string, args ...any) {
	_, _ = fmt.Fprintf(d.Out, "dry run: would "+format+"\n", args...)
}

func (d *DryRunFiles) Path(p string) (string, error)           { return d.Files.Path(p) }
func (d *DryRunFiles) ReadFile(p string) ([]byte, error)       { return d.Files.ReadFile(p) }
func (d *DryRunFiles) Open(p string) (io.ReadCloser, error)    { return d.Files.Open(p) }
func (d *DryRunFiles) Stat(p string) (fs.FileInfo, error)      { return d.Files.Stat(p) }
func (d *DryRunFiles) Exists(p string) bool                    { return d.Files.Exists(p) }
func (d *DryRunFiles) ReadDir(p string) ([]fs.DirEntry, error) { return d.Files.ReadDir(p) }
func (d *DryRunFiles) FreeBytes(p string) (uint64, error)      { return d.Files.FreeBytes(p) }

// WriteFileAtomic reports the write; a bad path still fails, as the real write would.
func (d *DryRunFiles) WriteFileAtomic(p string, data []byte, mode fs.FileMode) error {
	if _, err := d.Files.Path(p); err != nil {
		return err
	}
	d.report("write %s (%d bytes, mode %04o)", p, len(data), mode)
	return nil
}

// CreateTemp gives a file that takes the data (so a download can still be verified) and keeps none of it.
func (d *DryRunFiles) CreateTemp(p string) (TempFile, error) {
	if _, err := d.Files.Path(p); err != nil {
		return nil, err
	}
	return &dryRunTemp{files: d, dest: p}, nil
}

func (d *DryRunFiles) Chmod(p string, mode fs.FileMode) error {
	d.report("set the mode of %s to %04o", p, mode)
	return nil
}

func (d *DryRunFiles) Remove(p string) error {
	d.report("remove %s", p)
	return nil
}

func (d *DryRunFiles) RemoveAll(p string) error {
	d.report("remove %s and everything under it", p)
	return nil
}

func (d *DryRunFiles) Rename(from, to string) error {
	d.report("move %s to %s", from, to)
	return nil
}

func (d *DryRunFiles) KeepPrevious(p, prev string) error {
	if d.Files.Exists(p) {
		d.report("keep %s as %s", p, prev)
	}
	return nil
}

type dryRunTemp struct {
	files *DryRunFiles
	dest  string
	n     int
}

func (t *dryRunTemp) Write(b []byte) (int, error) {
	t.n += len(b)
	return len(b), nil
}

func (t *dryRunTemp) Commit(mode fs.FileMode) error {
	t.files.report("write %s (%d bytes, mode %04o)", t.dest, t.n, mode)
	return nil
}

func (t *dryRunTemp) Discard() error { return nil }

// DryRunServices reports restarts instead of making them.
type DryRunServices struct {
	Services ServiceManager
	Out      io.Writer
}

// Name implements ServiceManager.
func (d *DryRunServices) Name() string { return d.Services.Name() }

// Supported implements ServiceManager: a DryRun's preflight asks the real one.
func (d *DryRunServices) Supported() error { return d.Services.Supported() }

// Restart implements ServiceManager.
func (d *DryRunServices) Restart(_ context.Context, name string) error {
	_, _ = fmt.Fprintf(d.Out, "dry run: would restart %s with %s\n", name, d.Services.Name())
	return nil
}

// DryRunRunner reports the programs it is asked to run and runs none.
type DryRunRunner struct {
	Out io.Writer
}

// Run implements Runner.
func (d *DryRunRunner) Run(_ context.Context, c Cmd) error {
	_, _ = fmt.Fprintf(d.Out, "dry run: would run %s\n", firstLineOf(strings.Join(append([]string{c.Path}, c.Args...), " ")))
	return nil
}

// firstLineOf keeps a command line short enough for a status tail (a script can be 16 KiB).
func firstLineOf(s string) string {
	line, rest, _ := strings.Cut(s, "\n")
	if len(line) > 80 {
		return line[:77] + "..."
	}
	if rest != "" {
		line += " ..."
	}
	return line
}

// DryRunStaticPods reports static pod restarts instead of making them, and checks nothing: a
// manifest an interrupted run left out stays where it is.
type DryRunStaticPods struct{}

// Restart implements StaticPods.
func (DryRunStaticPods) Restart(_ context.Context, out io.Writer, pods ...StaticPod) error {
	for _, p := range pods {
		_, _ = fmt.Fprintf(out, "dry run: would restart static pod %s\n", p.Component)
	}
	return nil
}
