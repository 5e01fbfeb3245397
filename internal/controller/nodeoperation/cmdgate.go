package nodeoperation

import (
	"context"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/cmdgate"
	"github.com/nodeops/nodeops/internal/gate"
)

// A command gate is answered by a gate-check NodeTask owned by the operation (internal/cmdgate,
// shared with NodeProfile): this file gives it the operation's look.

// checkOwner is the operation as the owner of its gate checks.
func checkOwner(op *v1alpha1.NodeOperation) cmdgate.Owner {
	return cmdgate.Owner{Kind: kind, Name: op.Name, UID: op.UID, DryRun: op.Spec.ExecutionMode == v1alpha1.ExecutionDryRun}
}

// checkCommand is command gate g's answer in this look, for the node about to start (about).
func (r *Reconciler) checkCommand(ctx context.Context, s *scope, group string, g *v1alpha1.Gate, about string) gate.Result {
	return s.look.Check(ctx, r.Client, group, g, about)
}

// actOnChecks creates, aborts and deletes the checks this look asked for (cmdgate.Writer.Act).
func (r *Reconciler) actOnChecks(ctx context.Context, s *scope) error {
	return cmdgate.Writer{Client: r.Client, Live: r.APIReader, Locks: r.Locks, Created: &r.createdChecks, Parallel: r.CreateParallelism}.Act(ctx, &s.look)
}
