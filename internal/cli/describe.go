package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/gate"
	"github.com/nodeops/nodeops/internal/schedule"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

func newDescribeCommand(o *Options) *cobra.Command {
	var tail int
	cmd := &cobra.Command{
		Use:   "describe NAME|TASK",
		Short: "Show an operation (its groups, tasks and the output of a failed command), or one task",
		Long: `Show a node operation in full: what it does, its mode, its conditions, its groups
in order with their node counts, one line per task, and for each failed task the
last lines of the failed command's output, with the commands that would unblock it.
Given a task's name instead (a profile's install task, say), show that task's commands.`,
		Example: `  kubectl nodeops describe renew-certs-x7k2p

  # More of the failed command's output
  kubectl nodeops describe renew-certs-x7k2p --tail 100

  # One task
  kubectl nodeops describe renew-certs-x7k2p-control-planes-cp-2-7d793037a0760186   # (kubectl get nodetasks)`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.NewClient()
			if err != nil {
				return err
			}
			return o.runDescribe(cmd.Context(), c, args[0], tail)
		},
	}
	cmd.Flags().IntVar(&tail, "tail", 20, "Lines of a failed command's output to show")
	return cmd
}

func (o *Options) runDescribe(ctx context.Context, c Client, name string, tail int) error {
	op, err := getOperation(ctx, c, name)
	if err != nil {
		// A task (of a profile, say) can be described too.
		task := &nodeopsv1.NodeTask{}
		if terr := c.Get(ctx, client.ObjectKey{Name: name}, task); terr == nil {
			var b strings.Builder
			writeTaskDescription(&b, task, tail)
			_, err = io.WriteString(o.Out, trimLines(b.String()))
			return err
		}
		return err
	}
	tasks, err := listTasks(ctx, c, op)
	if err != nil {
		return err
	}
	writeDescription(o.Out, op, tasks, tail)
	return nil
}

// writeDescription is pure so that its output can be compared with golden files.
func writeDescription(out io.Writer, op *nodeopsv1.NodeOperation, tasks []nodeopsv1.NodeTask, tail int) {
	var b strings.Builder
	describeTo(&b, op, tasks, tail)
	_, _ = io.WriteString(out, trimLines(b.String()))
}

// trimLines drops the spaces tabwriter leaves after an empty last column.
func trimLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	return strings.Join(lines, "\n")
}

// soakText is the operation's soak delays in a line.
func soakText(s nodeopsv1.Scheduling) string {
	var parts []string
	if s.PostNodeDelay != nil {
		parts = append(parts, s.PostNodeDelay.Duration.String()+" after each node")
	}
	if s.PostGroupDelay != nil {
		parts = append(parts, s.PostGroupDelay.Duration.String()+" after each group")
	}
	return strings.Join(parts, ", ")
}

// pauseBeforeText lists the operation's pauseBefore nodes, marking those a person has resumed.
func pauseBeforeText(op *nodeopsv1.NodeOperation) string {
	parts := make([]string, 0, len(op.Spec.PauseBefore))
	for _, n := range op.Spec.PauseBefore {
		if slices.Contains(op.Spec.ResumedBefore, n) {
			n += " (resumed)"
		}
		parts = append(parts, n)
	}
	return strings.Join(parts, ", ")
}

func describeTo(w io.Writer, op *nodeopsv1.NodeOperation, tasks []nodeopsv1.NodeTask, tail int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	field := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	field("Name", op.Name)
	field("Operation", operationDetail(op))
	field("Mode", modeOf(op))
	field("Nodes", selectorText(op.Spec.NodeSelector))
	field("Max unavailable", maxUnavailableText(op))
	if len(op.Spec.Windows) > 0 {
		field("Windows", schedule.DescribeAll(op.Spec.Windows))
	}
	if op.Spec.PostNodeDelay != nil || op.Spec.PostGroupDelay != nil {
		field("Soak", soakText(op.Spec.Scheduling))
	}
	for i := range op.Spec.Gates {
		field("Gate", gate.Describe(&op.Spec.Gates[i]))
	}
	if len(op.Spec.PauseBefore) > 0 {
		field("Pause before", pauseBeforeText(op))
	}
	for _, h := range hookLines(op.Spec.Hooks) {
		field("Hook", h)
	}
	field("Phase", phaseOf(op))
	if op.Status.NextStart != nil && !op.Status.Phase.Finished() {
		field("Next start", timeText(op.Status.NextStart))
	}
	field("Progress", orDash(op.Status.Progress))
	field("Started", timeText(op.Status.StartTime))
	completed := timeText(op.Status.CompletionTime)
	if op.Status.StartTime != nil && op.Status.CompletionTime != nil {
		completed += " (took " + op.Status.CompletionTime.Sub(op.Status.StartTime.Time).Round(time.Second).String() + ")"
	}
	field("Completed", completed)
	_ = tw.Flush()

	if len(op.Status.Conditions) > 0 {
		fmt.Fprintln(w, "\nConditions:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  TYPE\tSTATUS\tREASON\tMESSAGE")
		for _, cd := range op.Status.Conditions {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", cd.Type, cd.Status, cd.Reason, cd.Message)
		}
		_ = tw.Flush()
	}

	printGates(w, op.Status.Gates, true)

	if len(op.Status.Hooks) > 0 {
		fmt.Fprintln(w, "\nHooks (running, failed, or done and not yet shown by a task or a group):")
		for i := range op.Status.Hooks {
			fmt.Fprintf(w, "  %s\n", hookRunLine(&op.Status.Hooks[i]))
		}
	}

	fmt.Fprintln(w, "\nGroups:")
	if len(op.Status.Groups) == 0 {
		fmt.Fprintln(w, "  (none yet: the manager has not planned this operation)")
	} else {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  #\tGROUP\tPHASE\tNODES\tDONE\tRUNNING\tFAILED\tSKIPPED\tPENDING\tMESSAGE")
		for i, g := range op.Status.Groups {
			n := g.Nodes
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", i+1, g.Name, g.Phase, n.Total,
				n.Succeeded, n.Running, n.Failed, n.Skipped, n.Pending, g.Message)
		}
		_ = tw.Flush()
	}

	fmt.Fprintln(w, "\nTasks:")
	if len(tasks) == 0 {
		fmt.Fprintln(w, "  (none yet)")
	} else {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  NODE\tGROUP\tPHASE\tPROGRESS\tCOMMAND\tATTEMPT\tTASK")
		for i := range tasks {
			t := &tasks[i]
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Spec.NodeName, t.Spec.Group, taskPhaseText(t),
				taskProgress(t), orDash(taskCommandText(t)), attemptText(t), t.Name)
		}
		_ = tw.Flush()
	}

	writeTimes(w, tasks)

	for i := range tasks {
		t := &tasks[i]
		if t.EffectivePhase() != nodeopsv1.TaskFailed {
			continue
		}
		writeFailure(w, t, tail)
	}

	if hint := nextSteps(op, tasks); hint != "" {
		fmt.Fprintln(w)
		fmt.Fprintln(w, hint)
	}
}

func writeFailure(w io.Writer, t *nodeopsv1.NodeTask, tail int) {
	i := failedCommand(t)
	fmt.Fprintf(w, "\nFailed on %s (task %s)", t.Spec.NodeName, t.Name)
	if i >= 0 {
		fmt.Fprintf(w, ", command %d/%d %s", i+1, len(t.Spec.Commands), t.Spec.Commands[i].DisplayName())
	}
	fmt.Fprintln(w, ":")
	if reason, msg := taskReason(t); reason != "" || msg != "" {
		fmt.Fprintf(w, "  %s: %s\n", orDash(reason), msg)
	}
	cs := commandStatus(t, i)
	if cs == nil {
		return
	}
	if cs.ExitCode != nil {
		fmt.Fprintf(w, "  exit code %d, attempt %d\n", *cs.ExitCode, cs.Attempt)
	}
	if cs.Message != "" && cs.Message != t.Status.Message {
		fmt.Fprintf(w, "  %s\n", cs.Message)
	}
	if out := tailLines(cs.OutputTail, tail); out != "" {
		fmt.Fprintf(w, "  output (last %d lines at most):\n", tail)
		for _, l := range strings.Split(out, "\n") {
			fmt.Fprintf(w, "    | %s\n", l)
		}
	}
}

// nextSteps tells the person what they can do now, when the operation waits for them.
func nextSteps(op *nodeopsv1.NodeOperation, tasks []nodeopsv1.NodeTask) string {
	if op.Status.Phase.Finished() || op.Spec.Abort {
		return ""
	}
	failed, waiting := 0, 0
	for i := range tasks {
		if tasks[i].EffectivePhase() == nodeopsv1.TaskFailed && tasks[i].Spec.RecoveryMode == "" {
			failed++
		}
		if awaitingApproval(&tasks[i]) {
			waiting++
		}
	}
	var lines []string
	if failed > 0 {
		lines = append(lines, fmt.Sprintf("Blocked on %d failed %s. Next: kubectl nodeops retry %s, kubectl nodeops skip %s, or kubectl nodeops abort %s",
			failed, plural(failed, "task", "tasks"), op.Name, op.Name, op.Name))
	}
	if b := blockedByOthers(op); b != nil {
		lines = append(lines, fmt.Sprintf("Blocked with no failed task of its own: %s", b.Message))
	}
	if waiting > 0 {
		lines = append(lines, fmt.Sprintf("%d %s waiting for approval. Next: kubectl nodeops approve %s [--all]",
			waiting, plural(waiting, "task is", "tasks are"), op.Name))
	}
	if op.Spec.Paused {
		lines = append(lines, "Paused. Next: kubectl nodeops resume "+op.Name)
	} else if n := op.Status.PausedBefore; n != "" {
		lines = append(lines, fmt.Sprintf("Paused before node %s (pauseBefore). Next: kubectl nodeops resume %s", n, op.Name))
	}
	return strings.Join(lines, "\n")
}

func operationDetail(op *nodeopsv1.NodeOperation) string {
	switch {
	case op.Spec.Upgrade != nil:
		u := op.Spec.Upgrade
		s := "upgrade to " + u.KubernetesVersion
		if u.UpgradeKubeletAndKubectl == nil || *u.UpgradeKubeletAndKubectl {
			s += ", kubelet and kubectl too"
		} else {
			s += ", kubeadm only"
		}
		if u.BinarySource != nil {
			s += " (binaries from " + u.BinarySource.BaseURL + ")"
		}
		if u.PackageSource != "" && u.PackageSource != nodeopsv1.PackageSourceBinaries {
			s += " (packages with " + u.PackageSource
			if u.PackageRepository != nil {
				s += " from " + u.PackageRepository.URL
			}
			s += ")"
		}
		return s
	case op.Spec.RenewCertificates != nil:
		certs := op.Spec.RenewCertificates.Certificates
		if len(certs) == 0 {
			return "renew all certificates"
		}
		return "renew certificates " + strings.Join(certs, ", ")
	case op.Spec.Reconfigure != nil:
		s := "reconfigure: patch " + strings.Join(op.Spec.Reconfigure.Changes(), " and ")
		if op.Spec.Reconfigure.Drain != nil {
			s += ", workers drained"
		}
		return s
	case op.Spec.RotateCertificateAuthorities != nil:
		r := op.Spec.RotateCertificateAuthorities
		s := "rotate the " + strings.Join(nodeopsv1.OrAllAuthorities(r.Authorities), ", ") + " certificate authorities"
		if r.ServiceAccountKey {
			s += " and the service-account key"
		}
		completion := r.Completion
		if completion == "" {
			completion = nodeopsv1.CompletionManual
		}
		return s + ", completion " + string(completion)
	case op.Spec.Custom != nil:
		var names []string
		for _, g := range op.Spec.Custom.Groups {
			names = append(names, g.Name)
		}
		return "custom: " + strings.Join(names, " -> ")
	}
	return "unknown"
}

func selectorText(sel *metav1.LabelSelector) string {
	if sel == nil {
		return "all"
	}
	s := metav1.FormatLabelSelector(sel)
	if s == "<none>" {
		return "all"
	}
	return s
}

func maxUnavailableText(op *nodeopsv1.NodeOperation) string {
	if op.Spec.MaxUnavailable == nil {
		return "1"
	}
	return op.Spec.MaxUnavailable.String()
}

func timeText(t *metav1.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// taskReason is why the task is where it is: the manager's AgentLost condition (a lost agent fails its task in bounded time, rule 9:
// AgentLost, NodeDeleted, or Skipped on a deleted node) when set, else the agent's reason.
func taskReason(t *nodeopsv1.NodeTask) (reason, message string) {
	if c := t.Lost(); c != nil && t.Status.Phase != nodeopsv1.TaskSucceeded && t.Status.Phase != nodeopsv1.TaskAborted {
		return c.Reason, c.Message
	}
	return t.Status.Reason, t.Status.Message
}

func taskPhaseText(t *nodeopsv1.NodeTask) string {
	p := string(t.EffectivePhase())
	switch {
	case t.Spec.RecoveryMode != "" && t.EffectivePhase() == nodeopsv1.TaskFailed:
		p += " (" + string(t.Spec.RecoveryMode) + " requested)"
	case awaitingApproval(t):
		p += " (awaiting approval)"
	case t.Spec.Abort && !taskFinished(t):
		p += " (aborting)"
	case t.Spec.Paused && !taskFinished(t):
		p += " (paused)"
	case t.Status.Message != "" && !taskFinished(t) && t.EffectivePhase() != nodeopsv1.TaskFailed:
		// The agent's word on a task it cannot start yet: "node busy: held by task X" (exclusion that cannot be bypassed, rule 8).
		p += " (" + t.Status.Message + ")"
	}
	return p
}

func taskProgress(t *nodeopsv1.NodeTask) string {
	if t.Status.Progress != "" {
		return t.Status.Progress
	}
	return taskpolicy.Progress(&t.Status, len(t.Spec.Commands))
}

// taskCommandText names the command that matters now: the failed one, the running or next one.
func taskCommandText(t *nodeopsv1.NodeTask) string {
	if i := failedCommand(t); i >= 0 {
		return t.Spec.Commands[i].DisplayName() + " (Failed)"
	}
	if taskFinished(t) {
		return ""
	}
	name := currentCommandName(t)
	if name == "" {
		return ""
	}
	if cs := commandStatus(t, int(t.Status.CurrentCommand)); cs != nil && cs.Phase != "" {
		return name + " (" + string(cs.Phase) + ")"
	}
	return name
}

func attemptText(t *nodeopsv1.NodeTask) string {
	a := t.Status.Attempt
	if cs := commandStatus(t, int(t.Status.CurrentCommand)); cs != nil && cs.Attempt > a {
		a = cs.Attempt
	}
	if a == 0 {
		return "-"
	}
	return fmt.Sprint(a)
}

func tailLines(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	if s == "" || n <= 0 {
		return ""
	}
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func writeTaskDescription(w io.Writer, t *nodeopsv1.NodeTask, tail int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	field := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	field("Task", t.Name)
	field("Node", t.Spec.NodeName)
	owner := t.Labels[nodeopsv1.LabelOperation]
	if owner != "" {
		owner = "nodeoperation/" + owner
	} else if p := t.Labels[nodeopsv1.LabelProfile]; p != "" {
		owner = "nodeprofile/" + p
	}
	field("Owner", orDash(owner))
	field("Group", orDash(t.Spec.Group))
	field("Mode", fmt.Sprintf("%s (%d approved)", t.Spec.ExecutionMode, t.Spec.ApprovedCommands))
	field("Phase", taskPhaseText(t))
	field("Progress", taskProgress(t))
	if reason, msg := taskReason(t); reason != "" || msg != "" {
		field("Reason", orDash(reason)+": "+msg)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\nCommands:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  #\tNAME\tPHASE\tATTEMPT\tEXIT\tTOOK\tRAN\tWAITED\tDOES")
	for i := range t.Spec.Commands {
		c := &t.Spec.Commands[i]
		phase, attempt, code, took, ran, waited := string(nodeopsv1.CommandPending), "-", "-", "-", "-", "-"
		if cs := commandStatus(t, i); cs != nil {
			phase = string(cs.Phase)
			if cs.Attempt > 0 {
				attempt = fmt.Sprint(cs.Attempt)
			}
			if cs.ExitCode != nil {
				code = fmt.Sprint(*cs.ExitCode)
			}
			took, ran, waited = commandTimes(cs)
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", i+1, c.DisplayName(), phase, attempt, code, took, ran, waited, commandText(c))
	}
	_ = tw.Flush()
	if t.EffectivePhase() == nodeopsv1.TaskFailed {
		writeFailure(w, t, tail)
		fmt.Fprintf(w, "\nNext: kubectl nodeops retry %s, or kubectl nodeops skip %s\n", t.Name, t.Name)
	}
}

// maxTimedTasks bounds the per-command time table of an operation's description; past it the
// table would bury the rest (describe a task for its own).
const maxTimedTasks = 50

// writeTimes shows, per node and finished command, the time the work ran apart from the time it
// waited (for a mirror pod, the control plane, the manager's drain), and how long each task queued
// between its creation and its first command.
func writeTimes(w io.Writer, tasks []nodeopsv1.NodeTask) {
	if len(tasks) == 0 || len(tasks) > maxTimedTasks {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	rows := 0
	for i := range tasks {
		t := &tasks[i]
		for j := range t.Status.Commands {
			cs := &t.Status.Commands[j]
			if cs.StartTime == nil || cs.CompletionTime == nil {
				continue
			}
			if rows == 0 {
				fmt.Fprintln(w, "\nTime per node and command (ran: the work itself; waited: for something else):")
				fmt.Fprintln(tw, "  NODE\t#\tCOMMAND\tQUEUED\tTOOK\tRAN\tWAITED\tWAITED FOR")
			}
			rows++
			queued := "-"
			if j == 0 && t.Status.StartTime != nil {
				queued = max(t.Status.StartTime.Sub(t.CreationTimestamp.Time), 0).Round(time.Millisecond).String()
			}
			took, ran, waited := commandTimes(cs)
			fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Spec.NodeName, j+1, cs.Name, queued, took, ran, waited, orDash(waitsText(cs.Waits)))
		}
	}
	_ = tw.Flush()
}

// commandTimes are a finished command run's duration, the part its work ran and the part it
// waited; "-" while it runs.
func commandTimes(cs *nodeopsv1.CommandStatus) (took, ran, waited string) {
	if cs.StartTime == nil || cs.CompletionTime == nil {
		return "-", "-", "-"
	}
	d := cs.CompletionTime.Sub(cs.StartTime.Time)
	wt := min(cs.Waited(), d)
	return d.Round(time.Millisecond).String(), (d - wt).Round(time.Millisecond).String(), wt.Round(time.Millisecond).String()
}

// waitsText lists what a command waited for, such as "MirrorPodGone 21.2s, MirrorPodBack 9.8s".
func waitsText(waits []nodeopsv1.CommandWait) string {
	parts := make([]string, 0, len(waits))
	for _, wt := range waits {
		parts = append(parts, fmt.Sprintf("%s %s", wt.For, wt.Duration.Round(100*time.Millisecond)))
	}
	return strings.Join(parts, ", ")
}

// printGates prints gate records as a table, each with its last result and when it was checked,
// with a GROUP column for an operation's (a profile's have no group); nothing when there are none.
func printGates(w io.Writer, gates []nodeopsv1.GateStatus, groups bool) {
	if len(gates) == 0 {
		return
	}
	fmt.Fprintln(w, "\nGates (last result of each, and when it was checked):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "  GATE\tSTATE\tSINCE\tCHECKED\tMESSAGE"
	if groups {
		head = "  GROUP\t" + head[2:]
	}
	fmt.Fprintln(tw, head)
	for _, g := range gates {
		since, checked := g.Since, g.LastChecked
		row := fmt.Sprintf("%s\t%s\t%s\t%s\t%s", g.Name, g.State, timeText(&since), timeText(&checked), g.Message)
		if groups {
			row = g.Group + "\t" + row
		}
		fmt.Fprintln(tw, "  "+row)
	}
	_ = tw.Flush()
}
