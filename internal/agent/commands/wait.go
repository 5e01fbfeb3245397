package commands

import (
	"context"
	"fmt"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func runWait(ctx context.Context, _ *Env, w *v1alpha1.WaitCommand) (Result, error) {
	if err := sleep(ctx, w.Duration.Duration); err != nil {
		return Result{}, fmt.Errorf("waiting %s: %w", w.Duration.Duration, err)
	}
	return Result{Message: fmt.Sprintf("waited %s", w.Duration.Duration)}, nil
}
