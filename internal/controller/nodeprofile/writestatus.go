package nodeprofile

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/statuswrite"
)

// statusRule: with a lock, because the status says which generation and spec hash it describes,
// and a write decided on an older copy of the profile would set them back.
var statusRule = statuswrite.Rule{Kind: kind, Lock: true, Owned: []string{
	v1alpha1.ConditionReady, v1alpha1.ConditionProvisioning, v1alpha1.ConditionDegraded, v1alpha1.ConditionBlocked,
}}

func (r *Reconciler) removeFinalizer(ctx context.Context, s *scope) error {
	p := s.profile
	patch := client.MergeFromWithOptions(p.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(p, Finalizer)
	if err := r.Client.Patch(ctx, p, patch); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer from NodeProfile %s: %w", p.Name, err)
	}
	r.event(p, corev1.EventTypeNormal, "Uninstalled", "Delete", "every node is uninstalled; the profile goes")
	log.FromContext(ctx).Info("every node uninstalled, finalizer removed")
	return nil
}

// writeStatus computes the status from the decision, the tasks about to start counted, and
// writes it when it changed: at once when a condition's status or reason, the failures or the
// hash changed, else at most every StatusInterval. A deleted profile with nothing left to do
// gets no status: act removes its finalizer.
func (r *Reconciler) writeStatus(ctx context.Context, s *scope) (ctrl.Result, error) {
	p := s.profile
	if !s.decided && s.invalid == "" {
		// Nothing was decided: keep the last status rather than report zeros.
		return ctrl.Result{}, nil
	}
	if s.deleting && s.decided && s.decision.Done {
		return ctrl.Result{}, nil
	}
	counts, conds, failures := ComputeStatus(StatusInput{
		Decision: s.decision, Deleting: s.deleting, Started: len(s.starts), Problems: s.problems, Invalid: s.invalid, Window: s.window,
		GateReason: s.gateReason, GateMessage: s.gateMessage,
	})
	p.Status.NextStart = nil
	if s.window != "" && !s.nextStart.IsZero() {
		p.Status.NextStart = &metav1.Time{Time: s.nextStart}
	}
	if s.decided {
		p.Status.Nodes = counts
		p.Status.Failures = failures
		p.Status.Hashes = s.decision.Hashes
		p.Status.Gates = s.gates
	}
	if s.silences != nil {
		p.Status.Silences = *s.silences
	}
	p.Status.SpecHash = s.hash
	p.Status.ObservedGeneration = p.Generation
	for _, c := range conds {
		c.ObservedGeneration = p.Generation
		meta.SetStatusCondition(&p.Status.Conditions, c)
	}
	old := &s.orig.Status
	if statusEqual(old, &p.Status) {
		return ctrl.Result{}, nil
	}
	urgent := !sameConditionStates(old.Conditions, p.Status.Conditions) || !failuresEqual(old.Failures, p.Status.Failures) ||
		old.SpecHash != p.Status.SpecHash || old.ObservedGeneration != p.Status.ObservedGeneration ||
		!sameGateStates(old.Gates, p.Status.Gates) ||
		// A silence is recorded before its node's task is created, and its end at once (intent before action).
		!equality.Semantic.DeepEqual(old.Silences, p.Status.Silences)
	wrote, res, err := statuswrite.Write(ctx, r.Client, statusRule, &r.status, statuswrite.Change{
		Orig: s.orig, Obj: p, Urgent: urgent, Interval: r.StatusInterval, Now: r.Now.Now(),
	})
	if wrote != statuswrite.Wrote {
		return res, err
	}
	r.versions.Wrote(p.Name, p.ResourceVersion, s.orig.ResourceVersion)
	r.recordTransitions(s.orig, p)
	return ctrl.Result{}, nil
}

// recordTransitions records an event for each condition that turned True and each newly failed
// node: events per transition, never per node provisioned, so they stay out of the write budget.
func (r *Reconciler) recordTransitions(old, cur *v1alpha1.NodeProfile) {
	turnedTrue := func(t string) (*metav1.Condition, bool) {
		c := meta.FindStatusCondition(cur.Status.Conditions, t)
		o := meta.FindStatusCondition(old.Status.Conditions, t)
		return c, c != nil && c.Status == metav1.ConditionTrue && (o == nil || o.Status != metav1.ConditionTrue)
	}
	if c, ok := turnedTrue(v1alpha1.ConditionReady); ok {
		r.event(cur, corev1.EventTypeNormal, c.Reason, "Provision", c.Message)
	}
	if c, ok := turnedTrue(v1alpha1.ConditionBlocked); ok {
		r.event(cur, corev1.EventTypeWarning, c.Reason, "Provision", c.Message)
	}
	if c, ok := turnedTrue(v1alpha1.ConditionProvisioning); ok {
		r.event(cur, corev1.EventTypeNormal, "Provisioning", "Provision", c.Message)
	}
	known := map[string]string{}
	for _, f := range old.Status.Failures {
		known[f.Node] = f.Task
	}
	for _, f := range cur.Status.Failures {
		if known[f.Node] != f.Task {
			r.event(cur, corev1.EventTypeWarning, "NodeFailed", "Provision", fmt.Sprintf("node %s, task %s: %s", f.Node, f.Task, f.Message))
		}
	}
}

// sameGateStates compares gate records by name, state, since and retry, ignoring messages and check times.
func sameGateStates(a, b []v1alpha1.GateStatus) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].State != b[i].State || !a[i].Since.Equal(&b[i].Since) || a[i].Retried != b[i].Retried {
			return false
		}
	}
	return true
}
