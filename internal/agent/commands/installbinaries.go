package commands

import (
	"context"
	"fmt"
	"runtime"
	"strings"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// PrevSuffix names the previous binary kept beside a replaced one, for rollback.
const PrevSuffix = ".nodeops-prev"

// BinaryURL is where a Kubernetes binary comes from: {base}/{version}/bin/linux/{arch}/{name}.
func BinaryURL(base, version, arch, name string) string {
	return fmt.Sprintf("%s/%s/bin/linux/%s/%s", strings.TrimRight(base, "/"), version, arch, name)
}

// runInstallBinaries replaces each binary in /usr/bin after checking its sha256, keeping the one it
// replaces as <path>.nodeops-prev. A binary that already has the wanted digest is left alone, so a
// re-run never overwrites the kept previous binary.
func runInstallBinaries(ctx context.Context, env *Env, b *v1alpha1.InstallBinariesCommand) (Result, error) {
	arch := env.Arch
	if arch == "" {
		arch = runtime.GOARCH
	}
	var done []string
	for _, name := range b.Components {
		url := BinaryURL(b.Source.BaseURL, b.Version, arch, name)
		sum, err := fetchSHA256(ctx, env, url+".sha256")
		if err != nil {
			return Result{}, err
		}
		dest := "/usr/bin/" + name
		if fileSHA256(env, dest) == sum {
			env.printf("%s is already %s (sha256 %s)\n", dest, b.Version, sum)
			done = append(done, name+" (already current)")
			continue
		}
		if err := env.Host.Files.KeepPrevious(dest, dest+PrevSuffix); err != nil {
			return Result{}, err
		}
		if err := installVerified(ctx, env, url, sum, dest, 0o755); err != nil {
			return Result{}, err
		}
		env.printf("installed %s from %s (sha256 %s)\n", dest, url, sum)
		done = append(done, name)
	}
	return Result{Message: fmt.Sprintf("installed %s %s", strings.Join(done, ", "), b.Version)}, nil
}
