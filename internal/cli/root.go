// Package cli is kubectl-nodeops: thin cobra commands over a small Client.
//
// It holds no policy of its own: what it shows comes from the API types, plan and taskpolicy, and it
// writes only what a person could with kubectl (new operations; a task's recoveryMode; an operation's
// paused, abort or executionMode).
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// Options is shared by every command: streams, kubeconfig flags and the seams tests replace.
type Options struct {
	genericiooptions.IOStreams
	ConfigFlags *genericclioptions.ConfigFlags

	// NewClient builds the client; defaults to one from ConfigFlags.
	NewClient func() (Client, error)
	// Now is the clock used for ages and elapsed times.
	Now func() time.Time
	// Terminal reports whether Out is a terminal and its width and height.
	Terminal func() (ok bool, width, height int)
}

// NewOptions returns Options for a real terminal session.
func NewOptions(streams genericiooptions.IOStreams) *Options {
	o := &Options{
		IOStreams:   streams,
		ConfigFlags: genericclioptions.NewConfigFlags(true),
		Now:         time.Now,
	}
	// Every nodeops kind is cluster-scoped: no --namespace flag.
	o.ConfigFlags.Namespace = nil
	o.NewClient = func() (Client, error) { return clientFromFlags(o.ConfigFlags) }
	o.Terminal = func() (bool, int, int) { return fileTerminal(o.Out) }
	return o
}

func fileTerminal(w io.Writer) (bool, int, int) {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return false, 0, 0
	}
	width, height, err := term.GetSize(int(f.Fd()))
	if err != nil || width <= 0 || height <= 0 {
		return true, 80, 24
	}
	return true, width, height
}

// ExitError ends the program with Code; its message has already been printed when Silent.
type ExitError struct {
	Code   int
	Msg    string
	Silent bool
}

func (e *ExitError) Error() string { return e.Msg }

// Exit codes of `watch` (and of `upgrade`/`renew-certs --watch`).
const (
	CodeSucceeded = 0
	CodeError     = 1 // could not run: bad flags, API errors, timeout
	CodeFailed    = 2
	CodeBlocked   = 3
	CodeAborted   = 4
)

// NewCommand is the root command, `kubectl nodeops`.
func NewCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kubectl-nodeops",
		Short: "Plan, run, watch and steer node operations (upgrades, certificate renewals, custom workflows)",
		Long: `kubectl nodeops drives nodeops, the operator that performs node-level operations
on the nodes of a cluster: kubeadm upgrades, certificate renewals, profiles (extra
runtime pieces such as WebAssembly shims) and custom ordered workflows of host commands.

See what an operation would do with 'plan', start one with 'upgrade' or 'renew-certs'
(or kubectl apply), follow it with 'watch', and step in with 'approve', 'retry',
'skip', 'pause', 'resume' and 'abort' when it waits or stops.`,
		Example: `  # What would an upgrade to v1.37.2 do? Nothing is created.
  kubectl nodeops plan upgrade v1.37.2

  # Renew certificates, one control-plane node at a time, and follow it live
  kubectl nodeops renew-certs --watch

  # A task failed: see why, then skip the failed command (or retry it)
  kubectl nodeops describe renew-certs-x7k2p
  kubectl nodeops skip renew-certs-x7k2p`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl nodeops"},
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	o.ConfigFlags.AddFlags(cmd.PersistentFlags())
	cmd.AddCommand(
		newPlanCommand(o),
		newGetCommand(o),
		newDescribeCommand(o),
		newWatchCommand(o),
		newLogsCommand(o),
		newApproveCommand(o),
		newRecoveryCommand(o, recoveryRetry),
		newRecoveryCommand(o, recoverySkip),
		newPauseCommand(o, true),
		newPauseCommand(o, false),
		newAbortCommand(o),
		newUpgradeCommand(o),
		newRenewCertsCommand(o),
		newReconfigureCommand(o),
		newProfileCommand(o),
		newTargetCommand(o),
		newVersionCommand(o),
	)
	return cmd
}

// Execute runs the root command with os.Args and returns the process exit code.
func Execute(o *Options) int {
	return Run(o, os.Args[1:])
}

// Run runs the root command with args and returns the process exit code.
func Run(o *Options, args []string) int {
	cmd := NewCommand(o)
	cmd.SetArgs(args)
	cmd.SetIn(o.In)
	cmd.SetOut(o.Out)
	cmd.SetErr(o.ErrOut)
	err := cmd.Execute()
	if err == nil {
		return 0
	}
	var e *ExitError
	if errors.As(err, &e) {
		if !e.Silent && e.Msg != "" {
			fmt.Fprintln(o.ErrOut, "error:", e.Msg)
		}
		return e.Code
	}
	fmt.Fprintln(o.ErrOut, "error:", err)
	return CodeError
}
