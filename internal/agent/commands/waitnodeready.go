package commands

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

const defaultNodeReadyTimeout = 5 * time.Minute

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

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
		if err == nil && nodeReady(node) {
			return Result{Message: fmt.Sprintf("node %s is Ready", env.NodeName)}, nil
		}
		if serr := sleep(ctx, env.poll()); serr != nil {
			if err != nil {
				return Result{}, fmt.Errorf("node %s not Ready after %s: %w", env.NodeName, timeout, err)
			}
			return Result{}, fmt.Errorf("node %s not Ready after %s", env.NodeName, timeout)
		}
	}
}
