// Command kubectl-nodeops is the nodeops kubectl plugin: `kubectl nodeops ...`.
//
// It only calls internal/cli, where the commands live.
package main

import (
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/nodeops/nodeops/internal/cli"
)

func main() {
	streams := genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
	os.Exit(cli.Execute(cli.NewOptions(streams)))
}
