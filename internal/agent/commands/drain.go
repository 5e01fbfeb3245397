package commands

import (
	"context"
	"fmt"
	"io"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Drainer has the node drained for the running command and waits for the outcome. The agent's asks
// the manager, which alone may evict (internal/drain; drain honours PodDisruptionBudgets and agents confined to their own node, rules 6 and 10); it
// writes to out what the drain did with each pod.
type Drainer interface {
	Drain(ctx context.Context, d *v1alpha1.DrainCommand, out io.Writer) (string, error)
}

// runDrain is the drain command, and the drain that containerdRuntime's restart.drain makes.
func runDrain(ctx context.Context, env *Env, d *v1alpha1.DrainCommand) (Result, error) {
	if env.Drainer == nil {
		return Result{}, fmt.Errorf("draining node %s: this agent has no drainer to ask", env.NodeName)
	}
	done := env.waiting(v1alpha1.WaitDrain)
	msg, err := env.Drainer.Drain(ctx, d, env.out())
	done()
	return Result{Message: msg}, err
}
