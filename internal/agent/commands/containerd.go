package commands

import (
	"context"
	"fmt"
	"io/fs"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

const defaultContainerdConfig = "/etc/containerd/config.toml"

func runContainerdRuntime(ctx context.Context, env *Env, c *v1alpha1.ContainerdRuntimeCommand) (Result, error) {
	path := c.ConfigPath
	if path == "" {
		path = defaultContainerdConfig
	}
	if !c.Remove && c.RuntimeType == "" {
		return Result{}, fmt.Errorf("containerdRuntime %s: runtimeType is required to add a handler", c.Name)
	}
	data, err := env.Host.Files.ReadFile(path)
	if err != nil {
		return Result{}, fmt.Errorf("reading %s: %w", path, err)
	}
	edit, err := EditContainerdConfig(data, RuntimeHandler{Name: c.Name, RuntimeType: c.RuntimeType, BinaryPath: c.BinaryPath}, c.Remove)
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", path, err)
	}
	verb := "added to"
	if c.Remove {
		verb = "removed from"
	}
	if edit.Changed {
		mode := fs.FileMode(0o644)
		if fi, err := env.Host.Files.Stat(path); err == nil {
			mode = fi.Mode().Perm()
		}
		if err := env.Host.Files.WriteFileAtomic(path, edit.Data, mode); err != nil {
			return Result{}, err
		}
		env.printf("runtime %s %s %s\n", c.Name, verb, path)
		if edit.Rewritten {
			env.printf("note: %s was re-encoded whole (its comments and layout could not be kept)\n", path)
		}
	} else {
		env.printf("%s already as wanted\n", path)
	}
	msg := fmt.Sprintf("runtime %s %s %s", c.Name, verb, path)
	if !edit.Changed {
		msg = fmt.Sprintf("%s already as wanted", path)
	}
	// Restart even when the file was already right: an interrupted earlier run may have written it
	// without restarting.
	if c.SkipRestart {
		return Result{Message: msg + "; containerd not restarted (skipRestart)"}, nil
	}
	if err := env.Host.Services.Restart(ctx, "containerd"); err != nil {
		return Result{}, fmt.Errorf("%s; restarting containerd: %w", msg, err)
	}
	return Result{Message: msg + "; containerd restarted"}, nil
}
