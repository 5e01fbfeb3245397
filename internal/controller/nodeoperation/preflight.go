package nodeoperation

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Reasons of the PreflightFailed condition, and of Progressing and Blocked while it is true.
const (
	ReasonPreflightFailed  = "PreflightFailed"
	ReasonPreflightRunning = "PreflightRunning"
	ReasonPreflightPassed  = "PreflightPassed"
)

// defaultPreflightAnswer is how long a node's agent has to start its preflight task: a live agent
// takes a task within seconds, so one that has not after this long is taken not to answer.
const defaultPreflightAnswer = 2 * time.Minute

// preflightOutcome sets the PreflightFailed condition and status.preflight of an operation whose
// first group is the preflight, and returns its phase, reason and message: Blocked, reason
// PreflightFailed, while any node failed it, including a node whose agent has not started its
// preflight task in time (a gate that cannot be evaluated blocks, rule 14). running says the
// preflight group is the current one. Nothing of the next group starts until every node passed,
// as groups run strictly in order; a person fixes the node and retries its task.
func preflightOutcome(in *input, st *v1alpha1.NodeOperationStatus, d *decision, running bool, phase v1alpha1.OperationPhase, reason, message string) (v1alpha1.OperationPhase, string, string) {
	set := func(status metav1.ConditionStatus, r, m string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionPreflightFailed, Status: status, Reason: r, Message: m, ObservedGeneration: in.op.Generation})
	}
	if !running {
		st.Preflight = nil
		if len(st.Groups) > 0 && st.Groups[0].Phase == v1alpha1.GroupSucceeded {
			set(metav1.ConditionFalse, ReasonPreflightPassed, fmt.Sprintf("every node passed the preflight (%s)", st.Groups[0].Message))
		}
		return phase, reason, message
	}
	answer := in.preflightAnswer
	if answer <= 0 {
		answer = defaultPreflightAnswer
	}
	g := &in.groups[0]
	var failed []v1alpha1.PreflightFailure
	for _, t := range in.tasks[g.Name] {
		switch {
		case t.Phase == v1alpha1.TaskFailed && !t.Recovering:
			reason := t.Message
			// The agent's "command 1/1 (preflight) failed: preflight failed: ..." says twice what the list says once.
			if _, after, ok := strings.Cut(reason, "preflight failed: "); ok {
				reason = after
			}
			failed = append(failed, v1alpha1.PreflightFailure{Node: t.Node, Task: t.Name, Reason: reason})
		case t.Phase == v1alpha1.TaskPending && !t.Started && !t.Created.IsZero():
			due := t.Created.Add(answer)
			if !due.After(in.now.Time) {
				failed = append(failed, v1alpha1.PreflightFailure{Node: t.Node, Task: t.Name,
					Reason: fmt.Sprintf("the node's agent has not answered the preflight for %s (since %s)", in.now.Sub(t.Created).Round(time.Second), t.Created.UTC().Format(time.RFC3339))})
			} else if d.recheck.IsZero() || due.Before(d.recheck) {
				d.recheck = due.Add(100 * time.Millisecond)
			}
		}
	}
	if len(failed) == 0 {
		st.Preflight = nil
		set(metav1.ConditionFalse, ReasonPreflightRunning, fmt.Sprintf("checking %d nodes before the first task", len(g.Nodes)))
		return phase, reason, message
	}
	sort.Slice(failed, func(a, b int) bool { return failed[a].Node < failed[b].Node })
	st.Preflight = &v1alpha1.PreflightStatus{Failed: failed}
	parts := make([]string, 0, 3)
	for i, f := range failed {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more (status.preflight)", len(failed)-3))
			break
		}
		parts = append(parts, fmt.Sprintf("node %s: %s", f.Node, f.Reason))
	}
	msg := fmt.Sprintf("%d of %d nodes failed the preflight, so no task has started: %s; fix the nodes, then retry their preflight tasks (kubectl nodeops retry TASK), or abort the operation",
		len(failed), len(g.Nodes), strings.Join(parts, "; "))
	set(metav1.ConditionTrue, ReasonPreflightFailed, msg)
	if in.op.Spec.Abort || phase.Finished() {
		return phase, reason, message
	}
	if len(st.Groups) > 0 {
		st.Groups[0].Phase, st.Groups[0].Message = v1alpha1.GroupBlocked, msg
	}
	return v1alpha1.OperationBlocked, ReasonPreflightFailed, msg
}
