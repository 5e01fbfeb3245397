package nodeoperation

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/objname"
)

// Finalizer keeps an operation's task until the operation's status records how it ended (or
// the operation is over): a task deleted by hand, even one running a non-idempotent command,
// then never vanishes unseen and is never created and run again (nothing deleted automatically, rule 7:
// deleting history by hand never makes anything run again). A finalizer rather than a
// TaskDeleted failure because only the server can tell "deleted" from "never created": a status
// record of intent would need a write before every create, and a lost lock would read as a
// deletion. Deleting a running task thus waits for it to end, as deleting a Pod waits for its
// containers; to stop it, abort the operation.
const Finalizer = "nodeops.io/operation-record"

// buildTask is the NodeTask that runs group's commands on node for op (docs/design.md, NodeTask).
func buildTask(op *v1alpha1.NodeOperation, group *v1alpha1.Group, node string) *v1alpha1.NodeTask {
	mode := op.Spec.ExecutionMode
	if mode == "" {
		mode = v1alpha1.ExecutionAuto
	}
	commands := make([]v1alpha1.Command, len(group.Commands))
	for i := range group.Commands {
		group.Commands[i].DeepCopyInto(&commands[i])
	}
	return &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{
			Name: objname.TaskName(op.Name, group.Name, node),
			Labels: map[string]string{
				v1alpha1.LabelOperation: objname.LabelValue(op.Name),
				v1alpha1.LabelNode:      objname.LabelValue(node),
				v1alpha1.LabelGroup:     objname.LabelValue(group.Name),
			},
			Finalizers: []string{Finalizer},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeOperation", Name: op.Name, UID: op.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: v1alpha1.NodeTaskSpec{
			NodeName:      node,
			Operation:     op.Name,
			Group:         group.Name,
			Commands:      commands,
			ExecutionMode: mode,
			Paused:        op.Spec.Paused,
		},
	}
}

// createTasks creates the tasks under their nodes' locks, within the group's budget
// (skeleton.LockThenCreate). A node another task took since decide looked is passed over this
// round: it is added to waiting and counted in lost; so is one refused because another
// controller spent the budget's room since (counted in lost only).
func (r *Reconciler) createTasks(ctx context.Context, op *v1alpha1.NodeOperation, starts []start, budget nodelock.Budget, waiting map[string]nodelock.Holder) (lost int, err error) {
	creates := make([]skeleton.TaskCreate, len(starts))
	for i, s := range starts {
		creates[i] = skeleton.TaskCreate{Task: buildTask(op, s.group, s.node)}
	}
	got, holders, err := skeleton.LockThenCreate(ctx, r.Client, r.APIReader, r.Locks, nodelock.OperationOwner(op.Name), budget, creates, r.CreateParallelism)
	for i, s := range starts {
		if got[i] {
			continue
		}
		if holders[i].Task != "" {
			waiting[s.node] = holders[i]
		}
		lost++
	}
	return lost, err
}

// mirror carries the operation's paused, abort and executionMode (Controlled to Auto) onto its
// unfinished tasks; the agent acts on them. Nothing is written for a task already in step.
func (r *Reconciler) mirror(ctx context.Context, op *v1alpha1.NodeOperation, tasks []*v1alpha1.NodeTask) error {
	var errs []error
	for _, t := range tasks {
		if !t.EffectivePhase().Unfinished() {
			continue
		}
		paused, abort, mode := op.Spec.Paused, t.Spec.Abort || op.Spec.Abort, t.Spec.ExecutionMode
		if op.Spec.ExecutionMode == v1alpha1.ExecutionAuto && mode == v1alpha1.ExecutionControlled {
			mode = v1alpha1.ExecutionAuto
		}
		if paused == t.Spec.Paused && abort == t.Spec.Abort && mode == t.Spec.ExecutionMode {
			continue
		}
		// The cache's object must not be modified: patch a copy.
		patched := t.DeepCopy()
		patched.Spec.Paused, patched.Spec.Abort, patched.Spec.ExecutionMode = paused, abort, mode
		if err := r.Client.Patch(ctx, patched, client.MergeFrom(t)); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("mirror paused/abort/executionMode onto NodeTask %s: %w", t.Name, err))
		}
	}
	return errors.Join(errs...)
}

// keep puts the Finalizer on the tasks of the operation that lack it (made by a nodeops from before
// it) and whose end its status does not record yet, so that deleting one by hand cannot make it run
// again either: a task costs this write only once, and only after such an upgrade.
func (r *Reconciler) keep(ctx context.Context, op *v1alpha1.NodeOperation, tasks []*v1alpha1.NodeTask) error {
	w := skeleton.NewWrites(r.CreateParallelism)
	for _, t := range tasks {
		if controllerutil.ContainsFinalizer(t, Finalizer) || !t.DeletionTimestamp.IsZero() || skeleton.ControllerUID(t, kind) != op.UID {
			continue
		}
		if !t.EffectivePhase().Unfinished() && recorded(&op.Status, t.Spec.Group, t.Spec.NodeName) {
			continue
		}
		w.Go(func() error { return skeleton.AddFinalizer(ctx, r.Client, t, Finalizer) })
	}
	return w.Wait()
}

// release removes the Finalizer from the tasks a person deleted whose end the operation's
// status records (or all of them, when done is set: the operation is over or going): a task
// costs this write only when someone deleted it, or at the TTL.
func (r *Reconciler) release(ctx context.Context, st *v1alpha1.NodeOperationStatus, tasks []*v1alpha1.NodeTask, done, all bool) error {
	w := skeleton.NewWrites(r.CreateParallelism)
	for _, t := range tasks {
		if !controllerutil.ContainsFinalizer(t, Finalizer) || (!all && t.DeletionTimestamp.IsZero()) {
			continue
		}
		if !done && (t.EffectivePhase().Unfinished() || !recorded(st, t.Spec.Group, t.Spec.NodeName)) {
			continue
		}
		w.Go(func() error {
			_, err := skeleton.RemoveFinalizer(ctx, r.Client, t, Finalizer)
			return err
		})
	}
	return w.Wait()
}
