// Command realnode builds, starts and tears down one real single-node kubeadm cluster on this
// machine, with nodeops installed on it (see docs/development/evidence/realnode.md):
//
//	realnode build      build Kubernetes v1.36, containerd, runc, the CNI plugins and their images
//	realnode up         build, then start containerd and the kubelet, kubeadm init, import the
//	                    images `make images` built (--images) and install nodeops with its chart
//	realnode down       tear everything down and leave the machine as it was
//	realnode supervise  the node supervisor, the stand-in for systemd (started by up)
//	realnode post-render API-HOST
//	                    helm's post-renderer while up installs the chart: the API address
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/nodeops/nodeops/hack/realnode/internal/realnode"
)

type options struct {
	repo   string
	bin    string
	images string
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "realnode: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("realnode", flag.ContinueOnError)
	var o options
	wd, _ := os.Getwd()
	fs.StringVar(&o.repo, "repo", wd, "nodeops checkout")
	fs.StringVar(&o.bin, "bin", "", "the checkout's bin/ with the v1.37.2 tools (default REPO/bin)")
	fs.StringVar(&o.images, "images", "", "the output of `make images`: nodeops' layouts, digests.env, values.yaml (default BIN/images)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 2 && fs.Arg(0) == "post-render" {
		return realnode.PostRender(os.Stdin, os.Stdout, fs.Arg(1))
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: realnode [--repo DIR] [--bin DIR] [--images DIR] build|up|down|supervise")
	}
	if o.bin == "" {
		o.bin = filepath.Join(o.repo, "bin")
	}
	if o.images == "" {
		o.images = filepath.Join(o.bin, "images")
	}
	l := realnode.Layout{Repo: o.repo, Bin: o.bin, Images: o.images}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	switch fs.Arg(0) {
	case "build":
		return realnode.Build(ctx, l)
	case "up":
		if err := realnode.Build(ctx, l); err != nil {
			return err
		}
		return realnode.Up(ctx, l)
	case "down":
		return realnode.Down(context.Background())
	case "supervise":
		cancel() // the supervisor handles its own signals
		logger := log.New(os.Stderr, "supervisor: ", log.LstdFlags|log.Lmicroseconds)
		s := realnode.NewSupervisor(realnode.NodeUnits(), realnode.LogDir, logger)
		return s.Run(context.Background(), realnode.SupervisorSock)
	default:
		return fmt.Errorf("unknown command %q: want build, up, down or supervise", fs.Arg(0))
	}
}
