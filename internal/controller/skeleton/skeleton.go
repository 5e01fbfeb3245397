// Package skeleton is the reconcile skeleton the nodeops controllers follow (NodeOperation,
// NodeProfile, ClusterTarget, and nodetask's secret holders), and the pieces the controllers that
// create NodeTasks share.
//
// The skeleton, after cluster-api's machine controller (phases over a scope, results merged by
// the lowest non-zero RequeueAfter), is: get -> (finalizer) -> observe -> decide -> write status
// -> act. Observe reads the cache and the node lock table's View; decide is pure, takes no locks
// and does no IO; the status write records the decision before anything acts on it (intent
// before action); act acquires node locks and writes. A task whose lock act cannot take is not
// created this round: the next reconcile decides again.
//
// It also holds the protocols the controllers share, each written once: the status write
// (statuswrite.Write, under each controller's statuswrite.Rule; a package of its own, which the
// agent writes NodeTask status through too), taking the node lock then creating the task
// (LockThenCreate), and cache lag after a create (the lock table's reservations, which
// LockThenCreate makes and every decide reads). It holds no controller's policy: what differs
// between controllers is a parameter with its reason, and it writes only what a controller asks.
package skeleton

import (
	"context"
	"errors"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/statuswrite"
)

// StaleRetry is when a reconcile whose status write met a newer object (or none) looks again.
const StaleRetry = 100 * time.Millisecond

// Locker is the manager's node lock table (internal/nodelock.Table), one for every controller
// that creates NodeTasks (one task per node, rule 1).
type Locker interface {
	// Snapshot is the table as plain data, for decide.
	Snapshot() nodelock.View
	// TryAcquire gives node to task unless another task holds it; act calls it before a create.
	TryAcquire(node, task, owner string) (nodelock.Holder, bool)
	// AcquireWithin acquires several nodes at once within a maxUnavailable budget that counts
	// every task's holds, across controllers and (through the budget ledger) managers; act calls
	// it before the creates.
	AcquireWithin(ctx context.Context, owner string, claims []nodelock.Claim, b nodelock.Budget) (ok []bool, holders []nodelock.Holder, err error)
	// Release gives back a node whose task was not created.
	Release(node, task string)
	// Observe records a task read from the API server (after a create found it already there).
	Observe(task *v1alpha1.NodeTask)
	// Created records the task a create made, so that news of an earlier task of its name never frees it.
	Created(task *v1alpha1.NodeTask)
	// Synced reports whether the table has seen every task; nothing is acquired before.
	Synced() bool
}

var _ Locker = (*nodelock.Table)(nil)

// Steps are one controller's reconcile steps over its scope S, run in order by Run.
type Steps[S any] struct {
	// Observe reads the world into the scope: cache reads and the lock table's View; no writes.
	Observe func(context.Context, S) error
	// Decide computes, from the scope alone, the new status and the actions.
	Decide func(S)
	// WriteStatus records the decision (statuswrite.Write); when it fails nothing is acted on.
	WriteStatus func(context.Context, S) (ctrl.Result, error)
	// Act carries the decision out: lock acquisition, then creates, patches and deletes.
	Act func(context.Context, S) (ctrl.Result, error)
}

// Run runs observe, decide, write status and act over s, stopping at the first error, and
// merges the results of the status write and the act step with LowestNonZero.
func Run[S any](ctx context.Context, s S, steps Steps[S]) (ctrl.Result, error) {
	if err := steps.Observe(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	steps.Decide(s)
	status, err := steps.WriteStatus(ctx, s)
	if errors.Is(err, statuswrite.ErrStale) {
		// Decided on a stale object: nothing was recorded, so nothing acts; decide again shortly.
		return ctrl.Result{RequeueAfter: StaleRetry}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	acted, err := steps.Act(ctx, s)
	return LowestNonZero(status, acted), err
}

// LowestNonZero merges results: the shortest RequeueAfter that is set, as cluster-api's
// util.LowestNonZeroResult does.
func LowestNonZero(results ...ctrl.Result) ctrl.Result {
	var out ctrl.Result
	for _, r := range results {
		if r.RequeueAfter > 0 && (out.RequeueAfter == 0 || r.RequeueAfter < out.RequeueAfter) {
			out.RequeueAfter = r.RequeueAfter
		}
	}
	return out
}

// Within asks for r's reconcile to come again within d: the shorter of the two; a d already
// passed means at once (a millisecond, since RequeueAfter 0 means never).
func Within(r ctrl.Result, d time.Duration) ctrl.Result {
	return LowestNonZero(r, ctrl.Result{RequeueAfter: max(d, time.Millisecond)})
}
