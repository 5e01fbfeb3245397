package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
)

// outcome is how a watched operation ended, or nil while it goes on.
type outcome struct {
	phase  nodeopsv1.OperationPhase
	code   int
	reason string
	msg    string
}

// operationOutcome decides whether watching is over. Blocked ends the watch unless a person
// already asked for recovery (or abort) and the agent has not acted yet.
func operationOutcome(op *nodeopsv1.NodeOperation, tasks []nodeopsv1.NodeTask) *outcome {
	switch op.Status.Phase {
	case nodeopsv1.OperationSucceeded, nodeopsv1.OperationFailed, nodeopsv1.OperationAborted:
	case nodeopsv1.OperationBlocked:
		// Blocked by another owner's failed task, the operation has nothing of its own to recover.
		if op.Spec.Abort || blockedByOthers(op) == nil && !blockedSettled(tasks) {
			return nil
		}
	default:
		return nil
	}
	out := &outcome{phase: op.Status.Phase, code: phaseExit(op.Status.Phase)}
	if c := phaseCondition(op); c != nil {
		out.reason, out.msg = c.Reason, c.Message
	}
	return out
}

// blockedSettled: the tasks agree that the operation waits for a person. It does while a failed
// task carries no Retry or Skip. It does not while every failed task has one the agent has not
// acted on yet, nor when a task was just recovered and the operation's status has not caught up.
func blockedSettled(tasks []nodeopsv1.NodeTask) bool {
	recovering := false
	for i := range tasks {
		t := &tasks[i]
		switch {
		case t.EffectivePhase() == nodeopsv1.TaskFailed && t.Spec.RecoveryMode == "":
			return true
		case t.EffectivePhase() == nodeopsv1.TaskFailed, t.Status.RecoveredGeneration > 0:
			recovering = true
		}
	}
	return !recovering
}

// blockedByOthers is the Blocked condition of an operation that has no failed task of its own but
// waits only for nodes other owners' failed tasks hold, or nil.
func blockedByOthers(op *nodeopsv1.NodeOperation) *metav1.Condition {
	if op == nil || op.Status.Phase != nodeopsv1.OperationBlocked {
		return nil
	}
	c := meta.FindStatusCondition(op.Status.Conditions, nodeopsv1.ConditionBlocked)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != nodeopsv1.ReasonNodeHeldByFailedTask {
		return nil
	}
	return c
}

// phaseCondition is the condition that explains the phase.
func phaseCondition(op *nodeopsv1.NodeOperation) *metav1.Condition {
	byPhase := map[nodeopsv1.OperationPhase]string{
		nodeopsv1.OperationSucceeded: nodeopsv1.ConditionSucceeded,
		nodeopsv1.OperationFailed:    nodeopsv1.ConditionFailed,
		nodeopsv1.OperationBlocked:   nodeopsv1.ConditionBlocked,
	}
	if t, ok := byPhase[op.Status.Phase]; ok {
		if c := meta.FindStatusCondition(op.Status.Conditions, t); c != nil {
			return c
		}
	}
	for _, t := range []string{nodeopsv1.ConditionFailed, nodeopsv1.ConditionBlocked, nodeopsv1.ConditionSucceeded} {
		if c := meta.FindStatusCondition(op.Status.Conditions, t); c != nil && c.Status == metav1.ConditionTrue {
			return c
		}
	}
	return meta.FindStatusCondition(op.Status.Conditions, nodeopsv1.ConditionProgressing)
}

func (r *outcome) text(op *nodeopsv1.NodeOperation, tasks []nodeopsv1.NodeTask) string {
	var b strings.Builder
	fmt.Fprintf(&b, "nodeoperation %s %s", op.Name, r.phase)
	if op.Status.StartTime != nil && op.Status.CompletionTime != nil {
		fmt.Fprintf(&b, " after %s", op.Status.CompletionTime.Sub(op.Status.StartTime.Time).Round(time.Second))
	}
	if op.Status.Progress != "" {
		fmt.Fprintf(&b, " (%s)", op.Status.Progress)
	}
	if r.reason != "" || r.msg != "" {
		fmt.Fprintf(&b, ": %s: %s", orDash(r.reason), r.msg)
	}
	for i := range tasks {
		t := &tasks[i]
		if t.EffectivePhase() != nodeopsv1.TaskFailed {
			continue
		}
		fmt.Fprintf(&b, "\n  failed: %s", failureLine(t))
	}
	switch {
	case r.phase == nodeopsv1.OperationBlocked && blockedByOthers(op) != nil:
		fmt.Fprintf(&b, "\n  next: retry or skip the other owner's task named above, or kubectl nodeops abort %s", op.Name)
	case r.phase == nodeopsv1.OperationBlocked:
		fmt.Fprintf(&b, "\n  next: kubectl nodeops describe %s, then retry, skip or abort it", op.Name)
	}
	return b.String()
}

func failureLine(t *nodeopsv1.NodeTask) string {
	s := "node " + t.Spec.NodeName
	if i := failedCommand(t); i >= 0 {
		s += ", command " + t.Spec.Commands[i].DisplayName()
		if cs := commandStatus(t, i); cs != nil && cs.ExitCode != nil {
			s += fmt.Sprintf(", exit %d", *cs.ExitCode)
		}
	}
	if t.Status.Message != "" {
		s += ": " + t.Status.Message
	}
	return s
}

// view is one frame of the live display.
type view struct {
	header string
	groups []groupLine
	nodes  []string
}

type groupLine struct {
	name                                  string
	phase                                 string
	total, done, running, failed, skipped int32
	message                               string
}

// activeTask: the live display shows a line for it.
func activeTask(t *nodeopsv1.NodeTask) bool {
	p := t.EffectivePhase()
	return p == nodeopsv1.TaskRunning || p == nodeopsv1.TaskFailed ||
		(awaitingApproval(t) && len(t.Status.Commands) > 0)
}

func buildView(op *nodeopsv1.NodeOperation, tasks []nodeopsv1.NodeTask, now time.Time) view {
	v := view{}
	h := fmt.Sprintf("%s | %s | %s | %s", op.Name, operationKind(op), modeOf(op), phaseOf(op))
	if op.Status.Progress != "" {
		h += " | " + op.Status.Progress
	}
	if op.Status.StartTime != nil {
		end := now
		if op.Status.CompletionTime != nil {
			end = op.Status.CompletionTime.Time
		}
		h += " | " + max(end.Sub(op.Status.StartTime.Time), 0).Round(time.Second).String()
	}
	v.header = h
	for _, g := range op.Status.Groups {
		v.groups = append(v.groups, groupLine{
			name: g.Name, phase: string(g.Phase), total: g.Nodes.Total,
			done: g.Nodes.Succeeded, running: g.Nodes.Running, failed: g.Nodes.Failed, skipped: g.Nodes.Skipped,
			message: g.Message,
		})
	}
	for i := range tasks {
		t := &tasks[i]
		if activeTask(t) {
			v.nodes = append(v.nodes, nodeLine(t, now))
		}
	}
	return v
}

// nodeLine is a running (or stopped) node: where it is and for how long.
func nodeLine(t *nodeopsv1.NodeTask, now time.Time) string {
	var state string
	switch {
	case t.EffectivePhase() == nodeopsv1.TaskFailed:
		state = "FAILED"
		if i := failedCommand(t); i >= 0 {
			state += " at " + t.Spec.Commands[i].DisplayName()
		}
		if t.Status.Message != "" {
			state += ": " + t.Status.Message
		}
		if t.Spec.RecoveryMode != "" {
			state += " (" + string(t.Spec.RecoveryMode) + " requested)"
		}
	case awaitingApproval(t):
		state = "awaiting approval: " + currentCommandName(t)
	default:
		state = currentCommandName(t)
		if cs := commandStatus(t, int(t.Status.CurrentCommand)); cs != nil && cs.StartTime != nil && cs.Phase == nodeopsv1.CommandRunning {
			state += fmt.Sprintf(" (%s)", max(now.Sub(cs.StartTime.Time), 0).Round(time.Second))
		}
		if t.Status.Message != "" && !taskFinished(t) {
			state += ": " + t.Status.Message // "node busy: held by task X" (exclusion that cannot be bypassed, rule 8)
		}
	}
	return fmt.Sprintf("%-20s %-14s %5s  %s", t.Spec.NodeName, t.Spec.Group, taskProgress(t), state)
}

// bar draws done, failed and running nodes over width cells: "[####x>>.....]".
func bar(g groupLine, width int) string {
	if width < 1 {
		width = 1
	}
	cells := make([]byte, width)
	for i := range cells {
		cells[i] = '.'
	}
	if g.total > 0 {
		pos := 0
		fill := func(n int32, c byte, cum *int32) {
			*cum += n
			end := int(int64(*cum) * int64(width) / int64(g.total))
			for ; pos < end && pos < width; pos++ {
				cells[pos] = c
			}
		}
		var cum int32
		fill(g.done+g.skipped, '#', &cum)
		fill(g.failed, 'x', &cum)
		fill(g.running, '>', &cum)
	} else if g.phase == string(nodeopsv1.GroupSucceeded) {
		for i := range cells {
			cells[i] = '#'
		}
	}
	return "[" + string(cells) + "]"
}

// lines lays out a frame for a terminal of the given size.
func (v view) lines(width, height int) []string {
	nameW := 8
	for _, g := range v.groups {
		if len(g.name) > nameW {
			nameW = len(g.name)
		}
	}
	barW := width - nameW - 40
	if barW > 40 {
		barW = 40
	}
	if barW < 10 {
		barW = 10
	}
	out := []string{v.header}
	if len(v.groups) == 0 {
		out = append(out, "  waiting for the manager to plan the operation")
	}
	for i, g := range v.groups {
		l := fmt.Sprintf("  %d %-*s %s %4d/%-4d %s", i+1, nameW, g.name, bar(g, barW), g.done+g.skipped, g.total, g.phase)
		var extra []string
		if g.running > 0 {
			extra = append(extra, fmt.Sprintf("%d running", g.running))
		}
		if g.failed > 0 {
			extra = append(extra, fmt.Sprintf("%d failed", g.failed))
		}
		if g.skipped > 0 {
			extra = append(extra, fmt.Sprintf("%d skipped", g.skipped))
		}
		if len(extra) > 0 {
			l += " (" + strings.Join(extra, ", ") + ")"
		}
		if g.message != "" {
			l += " " + g.message
		}
		out = append(out, l)
	}
	room := height - len(out) - 2
	if room < 1 {
		room = 1
	}
	nodes := v.nodes
	more := 0
	if len(nodes) > room {
		more = len(nodes) - (room - 1)
		nodes = nodes[:room-1]
	}
	for _, n := range nodes {
		out = append(out, "    "+n)
	}
	if more > 0 {
		out = append(out, fmt.Sprintf("    ... and %d more nodes", more))
	}
	for i, l := range out {
		out[i] = truncate(l, width-1)
	}
	return out
}

func truncate(s string, n int) string {
	if n <= 0 {
		return ""
	}
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n])
}

// ttyRenderer redraws the frame in place.
type ttyRenderer struct {
	w             io.Writer
	width, height int
	prev          int
}

func (r *ttyRenderer) start() { fmt.Fprint(r.w, "\x1b[?25l") }

func (r *ttyRenderer) draw(v view) {
	var b strings.Builder
	if r.prev > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", r.prev)
	}
	lines := v.lines(r.width, r.height)
	for _, l := range lines {
		b.WriteString("\r\x1b[2K")
		b.WriteString(l)
		b.WriteString("\n")
	}
	b.WriteString("\x1b[J")
	r.prev = len(lines)
	_, _ = io.WriteString(r.w, b.String())
}

func (r *ttyRenderer) stop() { fmt.Fprint(r.w, "\x1b[?25h") }

// plainRenderer prints a line whenever the operation, a group or a node changes.
type plainRenderer struct {
	w    io.Writer
	now  func() time.Time
	last map[string]string
}

func (r *plainRenderer) emit(key, line string) {
	if r.last[key] == line {
		return
	}
	r.last[key] = line
	fmt.Fprintf(r.w, "%s %s\n", r.now().Format("15:04:05"), line)
}

func (r *plainRenderer) draw(op *nodeopsv1.NodeOperation, tasks []nodeopsv1.NodeTask) {
	l := fmt.Sprintf("%s: %s", op.Name, phaseOf(op))
	if op.Status.Progress != "" {
		l += ", " + op.Status.Progress
	}
	if op.Spec.Paused {
		l += ", paused"
	}
	r.emit("op", l)
	for _, g := range op.Status.Groups {
		n := g.Nodes
		gl := fmt.Sprintf("group %s: %s, %d/%d done", g.Name, g.Phase, n.Succeeded+n.Skipped, n.Total)
		if n.Running > 0 {
			gl += fmt.Sprintf(", %d running", n.Running)
		}
		if n.Failed > 0 {
			gl += fmt.Sprintf(", %d failed", n.Failed)
		}
		if n.Skipped > 0 {
			gl += fmt.Sprintf(", %d skipped", n.Skipped)
		}
		if g.Message != "" {
			gl += ": " + g.Message
		}
		r.emit("group/"+g.Name, gl)
	}
	for i := range tasks {
		t := &tasks[i]
		if t.Status.Phase == "" && !awaitingApproval(t) {
			continue
		}
		tl := fmt.Sprintf("node %s (%s): %s", t.Spec.NodeName, t.Spec.Group, t.EffectivePhase())
		switch {
		case t.EffectivePhase() == nodeopsv1.TaskFailed:
			if i := failedCommand(t); i >= 0 {
				tl += " at " + t.Spec.Commands[i].DisplayName()
			}
			if t.Status.Message != "" {
				tl += ": " + t.Status.Message
			}
			if t.Spec.RecoveryMode != "" {
				tl += " (" + string(t.Spec.RecoveryMode) + " requested)"
			}
		case awaitingApproval(t):
			tl += ", awaiting approval of " + currentCommandName(t)
		case !taskFinished(t):
			tl += fmt.Sprintf(" %s %s", taskProgress(t), currentCommandName(t))
		}
		r.emit("task/"+t.Name, tl)
	}
}
