package commands

import (
	"context"
	"fmt"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func runRestartService(ctx context.Context, env *Env, s *v1alpha1.RestartServiceCommand) (Result, error) {
	if err := env.Host.Services.Restart(ctx, s.Name); err != nil {
		return Result{}, err
	}
	return Result{Message: fmt.Sprintf("%s restarted with %s", s.Name, env.Host.Services.Name())}, nil
}
