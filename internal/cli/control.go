package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/plan"
)

// resolveTasks finds the tasks NAME stands for: an operation's tasks, or the one task of that name.
func resolveTasks(ctx context.Context, c Client, name, node string) (*nodeopsv1.NodeOperation, []nodeopsv1.NodeTask, error) {
	op := &nodeopsv1.NodeOperation{}
	err := c.Get(ctx, client.ObjectKey{Name: name}, op)
	var tasks []nodeopsv1.NodeTask
	switch {
	case err == nil:
		if tasks, err = listTasks(ctx, c, op); err != nil {
			return nil, nil, err
		}
	case apierrors.IsNotFound(err):
		op = nil
		t := &nodeopsv1.NodeTask{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, t); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, nil, fmt.Errorf("no nodeoperation or nodetask named %q", name)
			}
			return nil, nil, fmt.Errorf("getting nodetask %q: %w", name, err)
		}
		tasks = []nodeopsv1.NodeTask{*t}
	default:
		return nil, nil, fmt.Errorf("getting nodeoperation %q: %w", name, err)
	}
	if node == "" {
		return op, tasks, nil
	}
	var kept []nodeopsv1.NodeTask
	for _, t := range tasks {
		if t.Spec.NodeName == node {
			kept = append(kept, t)
		}
	}
	if len(kept) == 0 {
		return nil, nil, fmt.Errorf("%s has no task on node %q", name, node)
	}
	return op, kept, nil
}

func patchTask(ctx context.Context, c Client, t *nodeopsv1.NodeTask, mutate func(*nodeopsv1.NodeTask)) error {
	orig := t.DeepCopy()
	mutate(t)
	if err := c.Patch(ctx, t, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("updating nodetask %s: %w", t.Name, err)
	}
	return nil
}

func patchOperation(ctx context.Context, c Client, op *nodeopsv1.NodeOperation, mutate func(*nodeopsv1.NodeOperation)) error {
	orig := op.DeepCopy()
	mutate(op)
	if err := c.Patch(ctx, op, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("updating nodeoperation %s: %w", op.Name, err)
	}
	return nil
}

type approveFlags struct {
	all, auto bool
	node      string
	gate      string
}

// hasGate reports whether the operation, or one of its groups, declares gate name.
func hasGate(op *nodeopsv1.NodeOperation, name string) bool {
	gates := append([]nodeopsv1.Gate(nil), op.Spec.Gates...)
	// A built-in operation's groups may carry gates too (a rotation's complete-rotation approval).
	if groups, err := plan.Expand(&op.Spec); err == nil {
		for _, g := range groups {
			gates = append(gates, g.Gates...)
		}
	}
	for _, g := range gates {
		if g.Name == name {
			return true
		}
	}
	return false
}

// annotateGate sets the annotation prefix+gate on operation name: how a person approves,
// retries or skips a gate (the manager acts on it; the spec stays as created).
// NAME may also be nodeprofile/PROFILE (or nodeprofiles/, nprof/): a NodeProfile's gates take the
// same annotations.
func (o *Options) annotateGate(ctx context.Context, c Client, name, gate, prefix, value, done string) error {
	if kind, profile, ok := strings.Cut(name, "/"); ok {
		switch kind {
		case "nodeprofile", "nodeprofiles", "nprof":
			return o.annotateProfileGate(ctx, c, profile, gate, prefix, value, strings.Replace(done, "the operation", "the profile", 1))
		case "nodeoperation", "nodeoperations", "nop":
			name = profile
		default:
			return fmt.Errorf("--gate takes an operation's NAME or nodeprofile/NAME, not %q", name)
		}
	}
	op := &nodeopsv1.NodeOperation{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, op); err != nil {
		return fmt.Errorf("getting nodeoperation %q: %w", name, err)
	}
	if !hasGate(op, gate) {
		return fmt.Errorf("nodeoperation %s has no gate %q", name, gate)
	}
	if err := patchOperation(ctx, c, op, func(op *nodeopsv1.NodeOperation) {
		if op.Annotations == nil {
			op.Annotations = map[string]string{}
		}
		op.Annotations[prefix+gate] = value
	}); err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "nodeoperation/%s: gate %s %s\n", name, gate, done)
	return nil
}

// annotateProfileGate is annotateGate for a NodeProfile.
func (o *Options) annotateProfileGate(ctx context.Context, c Client, name, gate, prefix, value, done string) error {
	p := &nodeopsv1.NodeProfile{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, p); err != nil {
		return fmt.Errorf("getting nodeprofile %q: %w", name, err)
	}
	if !slices.ContainsFunc(p.Spec.Gates, func(g nodeopsv1.Gate) bool { return g.Name == gate }) {
		return fmt.Errorf("nodeprofile %s has no gate %q", name, gate)
	}
	orig := p.DeepCopy()
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[prefix+gate] = value
	if err := c.Patch(ctx, p, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("updating nodeprofile %s: %w", name, err)
	}
	fmt.Fprintf(o.Out, "nodeprofile/%s: gate %s %s\n", name, gate, done)
	return nil
}

func newApproveCommand(o *Options) *cobra.Command {
	f := approveFlags{}
	cmd := &cobra.Command{
		Use:   "approve NAME",
		Short: "Let the next command of a Controlled operation's waiting tasks start",
		Long: `In Controlled mode every command waits for approval. 'approve' lets the next
command of each task that is waiting start (it raises the task's
spec.approvedCommands by one past its current command).

  --all   approves every remaining command of the operation's current tasks (the
          running group); tasks of later groups still wait, so each group is
          still started by a person.
  --auto  switches the operation and its unfinished tasks to Auto: nothing waits
          for approval any more. This cannot be undone (Auto never goes back to
          Controlled).

  --gate  approves an approval gate of the operation: its nodes start once its
          other gates pass. With --gate, NAME may also be nodeprofile/PROFILE:
          a NodeProfile's approval gate.

NAME is an operation, or a single task.`,
		Example: `  # Approve the next command on every waiting node
  kubectl nodeops approve upgrade-v1-37-2-abcde

  # Only on one node
  kubectl nodeops approve upgrade-v1-37-2-abcde --node worker-1

  # Let the current group run to its end
  kubectl nodeops approve upgrade-v1-37-2-abcde --all

  # Stop asking: run the rest of the operation automatically
  kubectl nodeops approve upgrade-v1-37-2-abcde --auto

  # Pass the approval gate change-board
  kubectl nodeops approve upgrade-v1-37-2-abcde --gate change-board

  # Pass the approval gate change-board of the NodeProfile wasm-shims
  kubectl nodeops approve nodeprofile/wasm-shims --gate change-board`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.NewClient()
			if err != nil {
				return err
			}
			if f.gate != "" {
				if f.all || f.auto || f.node != "" {
					return fmt.Errorf("--gate approves a gate for the whole operation: it takes no --all, --auto or --node")
				}
				return o.annotateGate(cmd.Context(), c, args[0], f.gate, nodeopsv1.AnnotationApproveGatePrefix, "true", "approved")
			}
			return o.runApprove(cmd.Context(), c, args[0], f)
		},
	}
	cmd.Flags().BoolVar(&f.all, "all", false, "Approve every remaining command of the current tasks, not just the next one")
	cmd.Flags().BoolVar(&f.auto, "auto", false, "Switch the operation and its unfinished tasks to Auto mode")
	cmd.Flags().StringVar(&f.node, "node", "", "Only the task on this node")
	cmd.Flags().StringVar(&f.gate, "gate", "", "Approve this approval gate of the operation (or of nodeprofile/NAME)")
	return cmd
}

func (o *Options) runApprove(ctx context.Context, c Client, name string, f approveFlags) error {
	op, tasks, err := resolveTasks(ctx, c, name, f.node)
	if err != nil {
		return err
	}
	if f.auto {
		if op != nil && op.Spec.ExecutionMode == nodeopsv1.ExecutionControlled {
			if err := patchOperation(ctx, c, op, func(op *nodeopsv1.NodeOperation) {
				op.Spec.ExecutionMode = nodeopsv1.ExecutionAuto
			}); err != nil {
				return err
			}
			fmt.Fprintf(o.Out, "nodeoperation/%s switched to Auto: no command waits for approval any more\n", op.Name)
		}
		for i := range tasks {
			t := &tasks[i]
			if t.Spec.ExecutionMode != nodeopsv1.ExecutionControlled || taskFinished(t) {
				continue
			}
			if err := patchTask(ctx, c, t, func(t *nodeopsv1.NodeTask) { t.Spec.ExecutionMode = nodeopsv1.ExecutionAuto }); err != nil {
				return err
			}
			fmt.Fprintf(o.Out, "nodetask/%s (node %s) switched to Auto\n", t.Name, t.Spec.NodeName)
		}
		return nil
	}
	if op != nil && op.Spec.ExecutionMode != nodeopsv1.ExecutionControlled {
		return fmt.Errorf("nodeoperation %s runs in %s mode: only Controlled operations wait for approval", op.Name, modeOf(op))
	}
	approved := 0
	for i := range tasks {
		t := &tasks[i]
		total := int32(len(t.Spec.Commands))
		var to int32
		switch {
		case f.all && t.Spec.ExecutionMode == nodeopsv1.ExecutionControlled && !taskFinished(t) && t.Spec.ApprovedCommands < total:
			to = total
		case awaitingApproval(t):
			to = t.Status.CurrentCommand + 1
		default:
			continue
		}
		from := t.Spec.ApprovedCommands
		if err := patchTask(ctx, c, t, func(t *nodeopsv1.NodeTask) { t.Spec.ApprovedCommands = to }); err != nil {
			return err
		}
		approved++
		if to == from+1 {
			fmt.Fprintf(o.Out, "node %s: approved command %d/%d %s (task %s)\n", t.Spec.NodeName, to, total, t.Spec.Commands[to-1].DisplayName(), t.Name)
		} else {
			fmt.Fprintf(o.Out, "node %s: approved commands %d-%d of %d (task %s)\n", t.Spec.NodeName, from+1, to, total, t.Name)
		}
	}
	if approved == 0 {
		return fmt.Errorf("no task of %s is waiting for approval", name)
	}
	return nil
}

type recovery struct {
	mode  nodeopsv1.RecoveryMode
	use   string
	short string
	long  string
	ex    string
}

var (
	recoveryRetry = recovery{
		mode:  nodeopsv1.RecoveryRetry,
		use:   "retry NAME",
		short: "Run the failed command of a blocked operation's failed tasks again",
		long: `Set recoveryMode Retry on the failed tasks of an operation (or on the named task):
the node's agent puts the failed command back to Pending (attempt + 1) and runs
it again, which unblocks the operation. Every failed task of the operation is
retried unless --node names one.

With --gate G, check the timed-out gate G of the operation again with a fresh
timeout instead; NAME may then also be nodeprofile/PROFILE, a NodeProfile's gate.`,
		ex: `  kubectl nodeops retry upgrade-v1-37-2-abcde
  kubectl nodeops retry upgrade-v1-37-2-abcde --node worker-2
  kubectl nodeops retry upgrade-v1-37-2-abcde-workers-worker-2-5d41402abc4b2a76   # a task by name (kubectl get nodetasks)
  kubectl nodeops retry nodeprofile/wasm-shims --gate storage-healthy   # a profile's timed-out gate`,
	}
	recoverySkip = recovery{
		mode:  nodeopsv1.RecoverySkip,
		use:   "skip NAME",
		short: "Skip the failed command of a blocked operation's failed tasks and go on",
		long: `Set recoveryMode Skip on the failed tasks of an operation (or on the named task):
the node's agent marks the failed command Skipped and the task goes on with its next
command (or succeeds if it was the last), which unblocks the operation. Every
failed task of the operation is skipped unless --node names one.

With --gate G, pass gate G for the rest of the operation instead; NAME may then
also be nodeprofile/PROFILE: the profile's gate passes until the annotation
skip.gate.nodeops.io/G is removed.`,
		ex: `  kubectl nodeops skip custom-rollout
  kubectl nodeops skip custom-rollout --node sim-0007
  kubectl nodeops skip nodeprofile/wasm-shims --gate storage-healthy`,
	}
)

func newRecoveryCommand(o *Options, r recovery) *cobra.Command {
	var node, gate, hookName string
	cmd := &cobra.Command{
		Use:     r.use,
		Short:   r.short,
		Long:    r.long,
		Example: r.ex,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.NewClient()
			if err != nil {
				return err
			}
			if hookName != "" {
				return o.recoverHook(cmd.Context(), c, args[0], hookName, node, r.mode)
			}
			if gate != "" {
				if node != "" {
					return fmt.Errorf("--gate acts on the operation's gate: it takes no --node")
				}
				if r.mode == nodeopsv1.RecoverySkip {
					return o.annotateGate(cmd.Context(), c, args[0], gate, nodeopsv1.AnnotationSkipGatePrefix, "true", "skipped for the rest of the operation")
				}
				// A new value each time: the manager checks the gate again once per value.
				return o.annotateGate(cmd.Context(), c, args[0], gate, nodeopsv1.AnnotationRetryGatePrefix, time.Now().UTC().Format(time.RFC3339Nano), "checked again, with a fresh timeout")
			}
			return o.runRecovery(cmd.Context(), c, args[0], node, r.mode)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "Only the failed task on this node")
	cmd.Flags().StringVar(&gate, "gate", "", "A gate of the operation (or of nodeprofile/NAME) that timed out, instead of failed tasks")
	cmd.Flags().StringVar(&hookName, "hook", "", "A hook of the operation that failed, instead of failed tasks")
	return cmd
}

func (o *Options) runRecovery(ctx context.Context, c Client, name, node string, mode nodeopsv1.RecoveryMode) error {
	op, tasks, err := resolveTasks(ctx, c, name, node)
	if err != nil {
		return err
	}
	n := 0
	for i := range tasks {
		t := &tasks[i]
		if t.EffectivePhase() != nodeopsv1.TaskFailed {
			continue
		}
		cmdName := "its failed command"
		if j := failedCommand(t); j >= 0 {
			cmdName = fmt.Sprintf("command %d/%d %s", j+1, len(t.Spec.Commands), t.Spec.Commands[j].DisplayName())
		}
		if err := patchTask(ctx, c, t, func(t *nodeopsv1.NodeTask) { t.Spec.RecoveryMode = mode }); err != nil {
			return err
		}
		n++
		fmt.Fprintf(o.Out, "node %s: %s requested for %s (task %s)\n", t.Spec.NodeName, mode, cmdName, t.Name)
	}
	if n == 0 {
		if b := blockedByOthers(op); b != nil {
			return fmt.Errorf("%s has no failed task of its own; it is Blocked because %s", name, b.Message)
		}
		return fmt.Errorf("%s has no failed task", name)
	}
	return nil
}

// steerableOperation fetches an operation that pause, resume and abort may still change, refusing one that has ended.
func steerableOperation(ctx context.Context, o *Options, name string) (Client, *nodeopsv1.NodeOperation, error) {
	c, err := o.NewClient()
	if err != nil {
		return nil, nil, err
	}
	op, err := getOperation(ctx, c, name)
	if err != nil {
		return nil, nil, err
	}
	if op.Status.Phase.Finished() {
		return nil, nil, fmt.Errorf("nodeoperation %s has already ended (%s)", op.Name, op.Status.Phase)
	}
	return c, op, nil
}

func newPauseCommand(o *Options, pause bool) *cobra.Command {
	use, short, ex := "pause NAME", "Pause an operation: running commands finish, no new command starts", "  kubectl nodeops pause upgrade-v1-37-2-abcde"
	if !pause {
		use, short, ex = "resume NAME", "Resume a paused operation", "  kubectl nodeops resume upgrade-v1-37-2-abcde"
	}
	return &cobra.Command{
		Use:     use,
		Short:   short,
		Example: ex,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, op, err := steerableOperation(cmd.Context(), o, args[0])
			if err != nil {
				return err
			}
			// Resuming a pause before a node records the node, so that it pauses there once.
			before := ""
			if node := op.Status.PausedBefore; !pause && node != "" && !slices.Contains(op.Spec.ResumedBefore, node) {
				before = node
			}
			if op.Spec.Paused == pause && before == "" {
				fmt.Fprintf(o.Out, "nodeoperation/%s is already %s\n", op.Name, map[bool]string{true: "paused", false: "running (not paused)"}[pause])
				return nil
			}
			if err := patchOperation(cmd.Context(), c, op, func(op *nodeopsv1.NodeOperation) {
				op.Spec.Paused = pause
				if before != "" && !slices.Contains(op.Spec.ResumedBefore, before) {
					op.Spec.ResumedBefore = append(op.Spec.ResumedBefore, before)
				}
			}); err != nil {
				return err
			}
			switch {
			case pause:
				fmt.Fprintf(o.Out, "nodeoperation/%s paused: running commands finish, no new command starts\n", op.Name)
			case before != "":
				fmt.Fprintf(o.Out, "nodeoperation/%s resumed before node %s (it will not pause there again)\n", op.Name, before)
			default:
				fmt.Fprintf(o.Out, "nodeoperation/%s resumed\n", op.Name)
			}
			return nil
		},
	}
}

func newAbortCommand(o *Options) *cobra.Command {
	return &cobra.Command{
		Use:   "abort NAME",
		Short: "Stop an operation for good: running commands finish, nothing new starts, it ends Aborted",
		Long: `Abort a node operation. Commands already running finish; no new command starts on
any node; failed and pending tasks end Aborted and release their nodes; the
operation ends Aborted. This cannot be undone: create a new operation instead.`,
		Example: `  kubectl nodeops abort upgrade-v1-37-2-abcde
  kubectl nodeops abort upgrade-v1-37-2-abcde && kubectl nodeops watch upgrade-v1-37-2-abcde`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, op, err := steerableOperation(cmd.Context(), o, args[0])
			if err != nil {
				return err
			}
			if !op.Spec.Abort {
				if err := patchOperation(cmd.Context(), c, op, func(op *nodeopsv1.NodeOperation) { op.Spec.Abort = true }); err != nil {
					return err
				}
			}
			fmt.Fprintf(o.Out, "nodeoperation/%s aborting: running commands finish, nothing new starts\n", op.Name)
			return nil
		},
	}
}
