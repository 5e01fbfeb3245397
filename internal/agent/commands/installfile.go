package commands

import (
	"context"
	"fmt"
	"io/fs"
	"strconv"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func parseMode(s string, def fs.FileMode) (fs.FileMode, error) {
	if s == "" {
		return def, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		return 0, fmt.Errorf("mode %q: %w", s, err)
	}
	return fs.FileMode(m), nil
}

func runInstallFile(ctx context.Context, env *Env, f *v1alpha1.InstallFileCommand) (Result, error) {
	if f.Remove {
		if err := env.Host.Files.Remove(f.Path); err != nil {
			return Result{}, err
		}
		return Result{Message: fmt.Sprintf("removed %s", f.Path)}, nil
	}
	mode, err := parseMode(f.Mode, 0o644)
	if err != nil {
		return Result{}, err
	}
	if _, err := env.Host.Files.Path(f.Path); err != nil {
		return Result{}, err
	}
	if fileSHA256(env, f.Path) == f.SHA256 {
		if err := env.Host.Files.Chmod(f.Path, mode); err != nil {
			return Result{}, err
		}
		return Result{Message: fmt.Sprintf("%s already has sha256 %s", f.Path, f.SHA256)}, nil
	}
	if err := installVerified(ctx, env, f.URL, f.SHA256, f.Path, mode); err != nil {
		return Result{}, err
	}
	env.printf("installed %s at %s mode %04o\n", f.URL, f.Path, mode)
	return Result{Message: fmt.Sprintf("installed %s (sha256 %s)", f.Path, f.SHA256)}, nil
}
