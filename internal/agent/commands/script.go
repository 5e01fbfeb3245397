package commands

import (
	"context"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// runScript runs the script with /bin/sh inside the host root. A script cannot be dry-run, so in
// DryRun the host's runner reports it, not runs it.
func runScript(ctx context.Context, env *Env, s *v1alpha1.ScriptCommand) (Result, error) {
	err := env.Host.Exec.Run(ctx, host.Cmd{
		Path:   "/bin/sh",
		Args:   []string{"-c", s.Inline},
		Env:    host.ScriptEnv(env.NodeName, env.Operation, env.DryRun, s.Env),
		Output: env.Out,
	})
	if err != nil {
		return Result{}, err
	}
	return Result{Message: "script finished"}, nil
}
