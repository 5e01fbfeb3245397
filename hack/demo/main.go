// Command nodeops-demo is `make demo`: it starts nodeops-local (3 control planes, 3 workers, 50
// simulated nodes) and walks through nodeops with the real CLI, each step narrated and followed live:
// a certificate renewal with the real kubeadm, an upgrade in DryRun, WebAssembly shims provisioned on
// annotated workers, a custom operation over the simulated nodes at maxUnavailable 20%, and a failure
// that is skipped. It ends with a summary table, stops everything it started (also on failure or
// interruption) and exits non-zero when a step failed.
//
//	hack/demo.sh [--keep] [--dir DIR] [--bin DIR]
//
// It runs from the repository's root (hack/demo.sh sees to that) and needs root, as nodeops-local does.
//
// It drives nodeops as a user would, through kubectl nodeops and kubectl, and changes none of nodeops'
// defaults for the show.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

type options struct {
	keep bool
	dir  string
	bin  string
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nodeops-demo: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, o, os.Stdout)
	stop()
	os.Exit(code)
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{}
	fs := flag.NewFlagSet("nodeops-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&o.keep, "keep", false, "leave the cluster running at the end and print its export KUBECONFIG=... line")
	fs.StringVar(&o.dir, "dir", "", "directory for the cluster and the demo's files (default: a new temporary directory, removed after a successful run without --keep)")
	fs.StringVar(&o.bin, "bin", "", "directory of the built binaries (default $NODEOPS_BIN, else ./bin)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.bin == "" {
		o.bin = os.Getenv("NODEOPS_BIN")
	}
	if o.bin == "" {
		o.bin = "bin"
	}
	return o, nil
}
