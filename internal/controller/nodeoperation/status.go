package nodeoperation

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/statuswrite"
)

// statusRule: the operation's status is recomputed whole from its tasks every reconcile, so it
// goes without a lock: a lock would refuse every write of a reconcile running ahead of the cache's
// copy of the last one, writes the budget (at most 4 per node) counts. What it records beyond its
// tasks (the end of a task deleted since) a reconcile on a copy older than the API server's could
// undo: Reconcile decides nothing on such a copy (cacheBehind).
var statusRule = statuswrite.Rule{Kind: kind, Owned: []string{
	v1alpha1.ConditionProgressing, v1alpha1.ConditionSucceeded, v1alpha1.ConditionFailed, v1alpha1.ConditionBlocked,
	v1alpha1.ConditionPreflightFailed,
}}

// writeStatus writes the operation's new status when it differs: at once when the phase, a
// group's phase, a condition's status or reason, or the generation changed; otherwise at most
// once per StatusInterval, asking to be called again when the interval is up.
func (r *Reconciler) writeStatus(ctx context.Context, s *scope) (ctrl.Result, error) {
	st := &s.d.status
	if equality.Semantic.DeepEqual(s.before, st) {
		return ctrl.Result{}, nil
	}
	for _, k := range s.checked {
		// Checks that changed nothing wrote nothing; this write carries when they happened.
		for i := range st.Gates {
			if st.Gates[i].Group == k.group && st.Gates[i].Name == k.name {
				st.Gates[i].LastChecked = metav1.NewTime(r.now())
			}
		}
	}
	orig := s.op.DeepCopy()
	orig.Status = *s.before
	s.op.Status = *st
	now := r.now()
	wrote, res, err := statuswrite.Write(ctx, r.Client, statusRule, &r.status, statuswrite.Change{
		Orig: orig, Obj: s.op, Urgent: significant(s.before, st), Interval: r.StatusInterval, Now: now,
	})
	if wrote != statuswrite.Wrote {
		s.op.Status = *s.before // s.op.Status is the status as last written (see act)
		return res, err
	}
	r.versions.Wrote(s.op.Name, s.op.ResourceVersion, orig.ResourceVersion)
	r.emit(s.op, transitions(s.before, st))
	r.emit(s.op, hookTransitions(s.before, st))
	return res, nil
}

// significant reports a change a watcher must see at once, rather than a count moving.
func significant(before, after *v1alpha1.NodeOperationStatus) bool {
	if before.Phase != after.Phase || before.ObservedGeneration != after.ObservedGeneration ||
		len(before.Groups) != len(after.Groups) || (before.StartTime == nil) != (after.StartTime == nil) ||
		(before.CompletionTime == nil) != (after.CompletionTime == nil) {
		return true
	}
	if !equality.Semantic.DeepEqual(before.Hooks, after.Hooks) {
		// A delivered event is recorded at once, so that no later look sends it again.
		return true
	}
	for i := range before.Groups {
		if before.Groups[i].Phase != after.Groups[i].Phase {
			return true
		}
	}
	if !equality.Semantic.DeepEqual(before.Silences, after.Silences) {
		// A silence's id is recorded before its node's task is created, so a restarted manager finds it.
		return true
	}
	for _, c := range after.Conditions {
		old := meta.FindStatusCondition(before.Conditions, c.Type)
		if old == nil || old.Status != c.Status || old.Reason != c.Reason {
			return true
		}
	}
	return false
}

// opEvent is one Kubernetes event to record.
type opEvent struct {
	kind, reason, action, note string
}

// transitions are the events a status change deserves; per-node progress gets none, so events
// cost no writes per node.
func transitions(before, after *v1alpha1.NodeOperationStatus) []opEvent {
	var out []opEvent
	if before.StartTime == nil && after.StartTime != nil && after.Phase != v1alpha1.OperationFailed {
		out = append(out, opEvent{corev1.EventTypeNormal, "Started", "Start", fmt.Sprintf("started with %d groups", len(after.Groups))})
	}
	old := map[string]v1alpha1.GroupPhase{}
	for _, g := range before.Groups {
		old[g.Name] = g.Phase
	}
	for _, g := range after.Groups {
		if old[g.Name] == g.Phase {
			continue
		}
		switch g.Phase {
		case v1alpha1.GroupRunning:
			if was := old[g.Name]; was != "" && was != v1alpha1.GroupPending {
				continue // going on after Blocked: the operation's Resumed says so
			}
			out = append(out, opEvent{corev1.EventTypeNormal, "GroupStarted", "StartGroup", fmt.Sprintf("group %s started on %d nodes", g.Name, g.Nodes.Total)})
		case v1alpha1.GroupSucceeded:
			out = append(out, opEvent{corev1.EventTypeNormal, "GroupSucceeded", "FinishGroup", fmt.Sprintf("group %s: %s", g.Name, g.Message)})
		}
	}
	cond := func(st *v1alpha1.NodeOperationStatus) *metav1.Condition {
		return meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionProgressing)
	}
	if p := cond(after); p != nil && p.Reason == ReasonWaitingForNode {
		if q := cond(before); q == nil || q.Reason != ReasonWaitingForNode {
			out = append(out, opEvent{corev1.EventTypeNormal, ReasonWaitingForNode, "Wait", p.Message})
		}
	}
	if before.Phase != after.Phase {
		msg := ""
		if c := phaseCondition(after); c != nil {
			msg = c.Message
		}
		switch after.Phase {
		case v1alpha1.OperationBlocked:
			reason := "Blocked"
			if c := meta.FindStatusCondition(after.Conditions, v1alpha1.ConditionBlocked); c != nil && c.Reason == ReasonPreflightFailed {
				reason = ReasonPreflightFailed
			}
			out = append(out, opEvent{corev1.EventTypeWarning, reason, "Block", msg})
		case v1alpha1.OperationPaused:
			out = append(out, opEvent{corev1.EventTypeNormal, "Paused", "Pause", msg})
		case v1alpha1.OperationSucceeded:
			out = append(out, opEvent{corev1.EventTypeNormal, "Succeeded", "Finish", msg})
		case v1alpha1.OperationFailed:
			reason := "Failed"
			if c := meta.FindStatusCondition(after.Conditions, v1alpha1.ConditionFailed); c != nil {
				reason = c.Reason
			}
			out = append(out, opEvent{corev1.EventTypeWarning, reason, "Fail", msg})
		case v1alpha1.OperationAborted:
			out = append(out, opEvent{corev1.EventTypeNormal, "Aborted", "Abort", msg})
		case v1alpha1.OperationRunning:
			if before.Phase == v1alpha1.OperationBlocked || before.Phase == v1alpha1.OperationPaused {
				out = append(out, opEvent{corev1.EventTypeNormal, "Resumed", "Resume", msg})
			}
		}
	}
	return out
}

func phaseCondition(st *v1alpha1.NodeOperationStatus) *metav1.Condition {
	for _, t := range []string{v1alpha1.ConditionFailed, v1alpha1.ConditionBlocked, v1alpha1.ConditionSucceeded} {
		if c := meta.FindStatusCondition(st.Conditions, t); c != nil && c.Status == "True" {
			return c
		}
	}
	return meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionProgressing)
}

func (r *Reconciler) emit(op *v1alpha1.NodeOperation, evs []opEvent) {
	if r.Recorder == nil {
		return
	}
	for _, e := range evs {
		r.Recorder.Eventf(op, nil, e.kind, e.reason, e.action, "%s", e.note)
	}
}
