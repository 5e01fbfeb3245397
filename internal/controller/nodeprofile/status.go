package nodeprofile

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Condition reasons of a NodeProfile.
const (
	ReasonProvisioned          = "Provisioned"
	ReasonNoNodes              = "NoMatchingNodes"
	ReasonInProgress           = "InProgress"
	ReasonNodesFailed          = "NodesFailed"
	ReasonIdle                 = "Idle"
	ReasonNoFailures           = "NoFailures"
	ReasonDeleting             = "Deleting"
	ReasonInvalidSpec          = "InvalidSpec"
	ReasonRuntimeClassConflict = "RuntimeClassConflict"
	// ReasonBlocked: a failed task stops new tasks until a person retries or skips it.
	ReasonBlocked = "Blocked"
	// ReasonWaitingForWindow: nodes wait for a maintenance window to open.
	ReasonWaitingForWindow = "WaitingForWindow"
)

// maxFailures bounds status.failures (the API's MaxItems) and maxNamed the nodes a message names.
const (
	maxFailures = 100
	maxNamed    = 10
)

// StatusInput is what the profile's status is computed from.
type StatusInput struct {
	Decision decision
	Deleting bool
	// Started counts the tasks this reconcile starts (chosen by plan.Select, created after the
	// status is written), not yet in decision.
	Started int
	// Problems are profile-level faults besides failed nodes, such as a RuntimeClass owned by someone else.
	Problems []string
	// Invalid explains a spec the controller cannot act on; Decision is then empty.
	Invalid string
	// Window, when set, says why waiting nodes start nothing now: outside the maintenance
	// windows, and the next opening.
	Window string
	// GateReason, when set, says that the gates hold the waiting nodes (ReasonWaitingForGate or
	// ReasonGateTimedOut), with GateMessage, the gate's own words.
	GateReason, GateMessage string
}

// ComputeStatus derives counts, conditions (each with a Reason) and failures from a decision.
// Conditions carry no LastTransitionTime; meta.SetStatusCondition sets it when the status changes.
func ComputeStatus(in StatusInput) (v1alpha1.ProfileNodeCounts, []metav1.Condition, []v1alpha1.ProfileNodeFailure) {
	if in.Invalid != "" {
		msg := "the spec cannot be acted on: " + in.Invalid
		return v1alpha1.ProfileNodeCounts{}, []metav1.Condition{
			{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonInvalidSpec, Message: msg},
			{Type: v1alpha1.ConditionProvisioning, Status: metav1.ConditionFalse, Reason: ReasonInvalidSpec, Message: msg},
			{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: ReasonInvalidSpec, Message: msg},
			{Type: v1alpha1.ConditionBlocked, Status: metav1.ConditionTrue, Reason: ReasonInvalidSpec, Message: msg},
		}, nil
	}
	d := in.Decision
	counts := d.Counts
	counts.Provisioning += int32(in.Started)

	var failures []v1alpha1.ProfileNodeFailure
	var named []string
	waiting, installing, uninstalling, failed := 0, 0, 0, 0
	for _, n := range d.Nodes {
		switch n.State {
		case StateWaitingInstall, StateWaitingUninstall:
			waiting++
		case StateInstalling, StateLabelling:
			installing++
		case StateUninstalling, StateUnlabelling:
			uninstalling++
		case StateInstallFailed, StateUninstallFailed:
			failed++
			what := "install"
			if n.State == StateUninstallFailed {
				what = "uninstall"
			}
			if len(failures) < maxFailures {
				failures = append(failures, v1alpha1.ProfileNodeFailure{Node: n.Node, Task: n.Task, Message: n.Message})
			}
			if len(named) < maxNamed {
				named = append(named, fmt.Sprintf("%s: %s failed: %s", n.Node, what, n.Message))
			}
		}
	}
	// Tasks just created moved nodes from waiting to in progress.
	moved := min(in.Started, waiting)
	waiting -= moved
	inProgress := installing + uninstalling + moved

	degraded := metav1.Condition{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: ReasonNoFailures, Message: "no node failed"}
	if failed > 0 || len(in.Problems) > 0 {
		degraded.Status = metav1.ConditionTrue
		var parts []string
		if failed > 0 {
			degraded.Reason = ReasonNodesFailed
			msg := fmt.Sprintf("%d node(s) failed: %s", failed, strings.Join(named, "; "))
			if failed > len(named) {
				msg += fmt.Sprintf("; and %d more", failed-len(named))
			}
			parts = append(parts, msg+". Set spec.recoveryMode Retry or Skip on the failed task (kubectl nodeops retry|skip), fix the spec (a new task replaces it), or take the node out of the profile; until then no other node starts")
		} else {
			degraded.Reason = ReasonRuntimeClassConflict
		}
		parts = append(parts, in.Problems...)
		degraded.Message = strings.Join(parts, "; ")
	}

	blocked := metav1.Condition{Type: v1alpha1.ConditionBlocked, Status: metav1.ConditionFalse, Reason: ReasonNotBlocked, Message: "nothing stops new tasks but maxUnavailable, the node lock and the windows"}
	progressing := metav1.Condition{Type: v1alpha1.ConditionProvisioning, Status: metav1.ConditionFalse, Reason: ReasonIdle, Message: "nothing to do"}
	if inProgress > 0 || waiting > 0 {
		progressing.Status = metav1.ConditionTrue
		progressing.Reason = ReasonInProgress
		progressing.Message = fmt.Sprintf("%d installing, %d uninstalling, %d waiting (maxUnavailable, node lock, readiness or cordon)", installing+moved, uninstalling, waiting)
		if b := d.Blocked; len(b) > 0 && waiting > 0 {
			// a failure blocks until a person decides (rule 3).
			progressing.Reason = ReasonBlocked
			progressing.Message = fmt.Sprintf("%d waiting: blocked by the failed task %s on node %s", waiting, b[0].Task, b[0].Node)
			if len(b) > 1 {
				progressing.Message += fmt.Sprintf(" (and %d more failed)", len(b)-1)
			}
			progressing.Message += "; no other node starts until it is retried or skipped (kubectl nodeops retry|skip) or the node leaves the profile"
			blocked.Status, blocked.Reason, blocked.Message = metav1.ConditionTrue, ReasonBlocked, progressing.Message
		} else if in.GateReason != "" && waiting > 0 {
			progressing.Reason = in.GateReason
			progressing.Message = fmt.Sprintf("%d waiting: %s; %d installing, %d uninstalling go on to their end", waiting, in.GateMessage, installing, uninstalling)
			if in.GateReason == ReasonGateTimedOut {
				// A gate's timeout blocks until a person decides, as a failed command does (rule 3).
				blocked.Status, blocked.Reason, blocked.Message = metav1.ConditionTrue, ReasonGateTimedOut, in.GateMessage
			}
		} else if in.Window != "" && waiting > 0 {
			progressing.Reason = ReasonWaitingForWindow
			progressing.Message = fmt.Sprintf("%d waiting %s; %d installing, %d uninstalling go on to their end", waiting, in.Window, installing, uninstalling)
		}
	}

	ready := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse}
	allDone := int(counts.Provisioned) == len(d.Nodes) && in.Started == 0
	switch {
	case in.Deleting:
		ready.Reason, ready.Message = ReasonDeleting, fmt.Sprintf("the profile is being deleted: %d node(s) left to uninstall", len(d.Nodes))
	case allDone && counts.Matched == 0:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, ReasonNoNodes, "no node is in the profile"
	case allDone:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, ReasonProvisioned, fmt.Sprintf("all %d node(s) provisioned", counts.Provisioned)
	case failed > 0:
		ready.Reason, ready.Message = ReasonNodesFailed, fmt.Sprintf("%d of %d node(s) provisioned, %d failed", counts.Provisioned, counts.Matched, failed)
	default:
		ready.Reason, ready.Message = ReasonInProgress, fmt.Sprintf("%d of %d node(s) provisioned", counts.Provisioned, counts.Matched)
	}
	return counts, []metav1.Condition{ready, progressing, degraded, blocked}, failures
}
