package commands

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// runPreflight checks the node; it changes nothing, so DryRun runs it as is.
func runPreflight(_ context.Context, env *Env, p *v1alpha1.PreflightCommand) (Result, error) {
	info := host.DetectOS(env.Host.Files)
	env.printf("os: id=%s version=%s family=%s init=%s packages=%s\n", info.ID, info.VersionID, info.Family, info.InitSystem, info.PackageManager)
	var failed []string
	for _, c := range p.Checks {
		switch {
		case c.Binary != "":
			fi, err := env.Host.Files.Stat(c.Binary)
			if err != nil || fi.IsDir() {
				failed = append(failed, fmt.Sprintf("binary %s is missing", c.Binary))
				continue
			}
			env.printf("ok: binary %s\n", c.Binary)
		case c.MinFreeDiskMiB > 0:
			free, err := env.Host.Files.FreeBytes("/")
			if err != nil {
				failed = append(failed, err.Error())
				continue
			}
			if mib := int64(free >> 20); mib < c.MinFreeDiskMiB { //nolint:gosec // bounded by disk size
				failed = append(failed, fmt.Sprintf("%d MiB free, %d MiB needed", mib, c.MinFreeDiskMiB))
				continue
			}
			env.printf("ok: at least %d MiB free\n", c.MinFreeDiskMiB)
		case len(c.OSFamily) > 0:
			if !slices.Contains(c.OSFamily, info.Family) {
				failed = append(failed, fmt.Sprintf("OS family %s is not one of %s", info.Family, strings.Join(c.OSFamily, ", ")))
				continue
			}
			env.printf("ok: OS family %s\n", info.Family)
		}
	}
	if len(failed) > 0 {
		return Result{}, fmt.Errorf("preflight failed: %s", strings.Join(failed, "; "))
	}
	return Result{Message: fmt.Sprintf("%d checks passed (%s %s)", len(p.Checks), info.ID, info.VersionID)}, nil
}
