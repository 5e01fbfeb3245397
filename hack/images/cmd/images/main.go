// Command images builds nodeops' manager and agent images as OCI layouts (`make images`).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	images "github.com/nodeops/nodeops/hack/images"
)

func main() {
	o := images.Options{Images: images.Images(), Platforms: images.Platforms()}
	var out string
	flag.StringVar(&o.Repo, "repo", ".", "the nodeops repository root")
	flag.StringVar(&out, "out", "bin/images", "directory for the layouts, digests.env, values.yaml and kustomization.yaml")
	flag.StringVar(&o.Registry, "registry", "ghcr.io/nodeops", "repository prefix the images are named under")
	flag.StringVar(&o.Source, "source", "https://github.com/nodeops/nodeops", "org.opencontainers.image.source")
	flag.StringVar(&o.Version, "version", "", "org.opencontainers.image.version and tag, stamped into the binaries too (default: git describe --always --dirty)")
	flag.StringVar(&o.Revision, "revision", "", "org.opencontainers.image.revision, stamped into the binaries too (default: git rev-parse HEAD)")
	flag.Parse()
	o.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, out); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o images.Options, out string) error {
	var err error
	if o.Repo, err = filepath.Abs(o.Repo); err != nil {
		return err
	}
	if out, err = filepath.Abs(out); err != nil {
		return err
	}
	if o, err = images.FromGit(ctx, o); err != nil {
		return err
	}
	results, err := images.Build(ctx, o, out)
	if err != nil {
		return err
	}
	if err := images.PrintTable(os.Stdout, results); err != nil {
		return err
	}
	fmt.Printf("\ndigests: %s\nhelm:      helm install nodeops charts/nodeops -n nodeops-system --create-namespace -f %s\nkustomize: kubectl apply --server-side -k %s\n",
		filepath.Join(out, images.DigestsFile), filepath.Join(out, images.HelmValuesFile), out)
	return nil
}
