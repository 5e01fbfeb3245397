package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
)

type logsFlags struct {
	node    string
	command string
	failed  bool
}

func newLogsCommand(o *Options) *cobra.Command {
	f := logsFlags{}
	cmd := &cobra.Command{
		Use:   "logs TASK|OPERATION",
		Short: "Print the output of a task's commands (the last 4 KiB of each), or of every task of an operation",
		Long: `Print what commands printed on their nodes. Agents keep the last 4 KiB of each
command's output in the task's status; 'logs' prints it with a header per command
(its phase, exit code and attempt). Commands that have not run are left out.`,
		Example: `  # Every command of every task of an operation
  kubectl nodeops logs renew-certs-x7k2p

  # One node's task
  kubectl nodeops logs renew-certs-x7k2p --node cp-2

  # Only what failed
  kubectl nodeops logs renew-certs-x7k2p --failed

  # A task by name, one command
  kubectl nodeops logs renew-certs-x7k2p-control-planes-cp-2-7d793037a0760186 --command kubeadmRenewCertificates`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.NewClient()
			if err != nil {
				return err
			}
			return o.runLogs(cmd.Context(), c, args[0], f)
		},
	}
	cmd.Flags().StringVar(&f.node, "node", "", "Only the task on this node")
	cmd.Flags().StringVar(&f.command, "command", "", "Only the command of this name (or kind)")
	cmd.Flags().BoolVar(&f.failed, "failed", false, "Only failed commands")
	return cmd
}

func (o *Options) runLogs(ctx context.Context, c Client, name string, f logsFlags) error {
	_, tasks, err := resolveTasks(ctx, c, name, f.node)
	if err != nil {
		return err
	}
	printed := 0
	for i := range tasks {
		printed += writeTaskLogs(o.Out, &tasks[i], f)
	}
	if printed == 0 {
		fmt.Fprintf(o.ErrOut, "No command output recorded for %s yet.\n", name)
	}
	return nil
}

// writeTaskLogs prints the outputs of a task's commands and returns how many it printed.
func writeTaskLogs(w io.Writer, t *nodeopsv1.NodeTask, f logsFlags) int {
	n := 0
	for i := range t.Status.Commands {
		cs := &t.Status.Commands[i]
		if cs.Phase == "" || cs.Phase == nodeopsv1.CommandPending || cs.Phase == nodeopsv1.CommandAwaitingApproval {
			continue
		}
		if f.failed && cs.Phase != nodeopsv1.CommandFailed {
			continue
		}
		if f.command != "" && cs.Name != f.command && (i >= len(t.Spec.Commands) || t.Spec.Commands[i].Kind() != f.command) {
			continue
		}
		head := fmt.Sprintf("==> node %s, task %s, command %d/%d %s: %s", t.Spec.NodeName, t.Name, i+1, len(t.Spec.Commands), cs.Name, cs.Phase)
		if cs.ExitCode != nil {
			head += fmt.Sprintf(", exit %d", *cs.ExitCode)
		}
		if cs.Attempt > 1 {
			head += fmt.Sprintf(", attempt %d", cs.Attempt)
		}
		fmt.Fprintln(w, head+" <==")
		if cs.Message != "" {
			fmt.Fprintln(w, "# "+cs.Message)
		}
		if out := strings.TrimRight(cs.OutputTail, "\n"); out != "" {
			fmt.Fprintln(w, out)
		}
		fmt.Fprintln(w)
		n++
	}
	return n
}
