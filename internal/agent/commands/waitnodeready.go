package commands

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/plan"
)

const defaultNodeReadyTimeout = 5 * time.Minute

func runWaitNodeReady(ctx context.Context, env *Env, w *v1alpha1.WaitNodeReadyCommand) (Result, error) {
	timeout := defaultNodeReadyTimeout
	if w.Timeout != nil && w.Timeout.Duration > 0 {
		timeout = w.Timeout.Duration
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		node := &corev1.Node{}
		err := env.Client.Get(ctx, client.ObjectKey{Name: env.NodeName}, node)
		if err == nil && plan.NodeReady(node) {
			return Result{Message: fmt.Sprintf("node %s is Ready", env.NodeName)}, nil
		}
		if serr := clock.Sleep(ctx, env.poll()); serr != nil {
			if err != nil {
				return Result{}, fmt.Errorf("node %s not Ready after %s: %w", env.NodeName, timeout, err)
			}
			return Result{}, fmt.Errorf("node %s not Ready after %s", env.NodeName, timeout)
		}
	}
}
