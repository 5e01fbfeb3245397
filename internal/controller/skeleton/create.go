package skeleton

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
)

// TaskCreate is one NodeTask to create under its node's lock.
type TaskCreate struct {
	Task *v1alpha1.NodeTask
	// Before, when set, runs once the node is acquired and before the create (a NodeProfile
	// deletes the finished task the new one supersedes); its error gives the node back.
	Before func(context.Context) error
}

// LockThenCreate is the one way the controllers create NodeTasks: it acquires the tasks' nodes for
// owner within budget, all in one step (one task per node, rule 1; budgets are cluster-wide,
// rule 11), then creates the acquired tasks, at most parallel at once. Until the informer
// delivers a created task, its lock-table reservation is what every decide sees of it (the one
// answer to cache lag after a create: nodelock.View.Reserved).
//
// The rule when a task already exists (the cache had not shown it): the node is given back and
// the lock table learns the task's real state from live, a reader of the API server itself, as the
// informer soon would; that is not an error. Any other failed create gives its node back.
// got[i] tells whether creates[i]'s node was acquired; holders[i] names the task holding it when
// another does, and is empty when the budget had no room. On an acquire error nothing is created.
func LockThenCreate(ctx context.Context, c client.Client, live client.Reader, locks Locker, owner string, budget nodelock.Budget, creates []TaskCreate, parallel int) (got []bool, holders []nodelock.Holder, err error) {
	if len(creates) == 0 {
		return nil, nil, nil
	}
	claims := make([]nodelock.Claim, len(creates))
	for i, tc := range creates {
		claims[i] = nodelock.Claim{Node: tc.Task.Spec.NodeName, Task: tc.Task.Name}
	}
	got, holders, err = locks.AcquireWithin(ctx, owner, claims, budget)
	if err != nil {
		return make([]bool, len(creates)), make([]nodelock.Holder, len(creates)), err
	}
	w := NewWrites(parallel)
	for i, tc := range creates {
		if got[i] {
			w.Go(func() error { return createLocked(ctx, c, live, locks, tc) })
		}
	}
	return got, holders, w.Wait()
}

// createLocked creates one task whose node is acquired, under LockThenCreate's rule.
func createLocked(ctx context.Context, c client.Client, live client.Reader, locks Locker, tc TaskCreate) error {
	task, node := tc.Task, tc.Task.Spec.NodeName
	if tc.Before != nil {
		if err := tc.Before(ctx); err != nil {
			locks.Release(node, task.Name)
			return err
		}
	}
	err := c.Create(ctx, task)
	switch {
	case err == nil:
		locks.Created(task)
		return nil
	case apierrors.IsAlreadyExists(err):
		locks.Release(node, task.Name)
		var found v1alpha1.NodeTask
		if err := live.Get(ctx, client.ObjectKeyFromObject(task), &found); err != nil {
			if apierrors.IsNotFound(err) {
				return nil // gone again since: the next round decides afresh
			}
			return fmt.Errorf("read NodeTask %s after a create conflict: %w", task.Name, err)
		}
		locks.Observe(&found)
		return nil
	default:
		locks.Release(node, task.Name)
		return fmt.Errorf("create NodeTask %s for node %s: %w", task.Name, node, err)
	}
}
