package commands

import (
	"context"
	"fmt"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
)

func runWait(ctx context.Context, env *Env, w *v1alpha1.WaitCommand) (Result, error) {
	defer env.waiting(v1alpha1.WaitWait)()
	if err := clock.Sleep(ctx, w.Duration.Duration); err != nil {
		return Result{}, fmt.Errorf("waiting %s: %w", w.Duration.Duration, err)
	}
	return Result{Message: fmt.Sprintf("waited %s", w.Duration.Duration)}, nil
}
