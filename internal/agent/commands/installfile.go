package commands

import (
	"context"
	"fmt"
	"io/fs"
	"os"
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
		if env.DryRun {
			return Result{Message: fmt.Sprintf("dry run: %s would be removed", f.Path)}, nil
		}
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
		if !env.DryRun {
			real, _ := env.Host.Files.Path(f.Path)
			if err := os.Chmod(real, mode); err != nil {
				return Result{}, fmt.Errorf("setting the mode of %s: %w", f.Path, err)
			}
		}
		return Result{Message: fmt.Sprintf("%s already has sha256 %s", f.Path, f.SHA256)}, nil
	}
	if err := installVerified(ctx, env, f.URL, f.SHA256, f.Path, mode); err != nil {
		return Result{}, err
	}
	if env.DryRun {
		return Result{Message: fmt.Sprintf("dry run: %s verified (sha256 %s); would be installed at %s mode %04o", f.URL, f.SHA256, f.Path, mode)}, nil
	}
	env.printf("installed %s at %s mode %04o\n", f.URL, f.Path, mode)
	return Result{Message: fmt.Sprintf("installed %s (sha256 %s)", f.Path, f.SHA256)}, nil
}
