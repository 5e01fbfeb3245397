package commands

import (
	"context"
	"fmt"
	"runtime"
	"strings"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// PrevSuffix names the previous binary kept beside a replaced one, for rollback.
const PrevSuffix = ".nodeops-prev"

// BinaryURL is where a Kubernetes binary comes from: {base}/{version}/bin/linux/{arch}/{name}.
func BinaryURL(base, version, arch, name string) string {
	return fmt.Sprintf("%s/%s/bin/linux/%s/%s", strings.TrimRight(base, "/"), version, arch, name)
}

// runInstallBinaries replaces each binary in /usr/bin after checking its sha256 (pinned in the
// source, else the server's .sha256 file), keeping the one it replaces as <path>.nodeops-prev. Every
// binary is downloaded and verified before any is replaced, so one bad digest changes nothing. A
// binary that already has the wanted digest is left alone, so a re-run never overwrites the kept
// previous binary.
func runInstallBinaries(ctx context.Context, env *Env, b *v1alpha1.InstallBinariesCommand) (Result, error) {
	arch := env.Arch
	if arch == "" {
		arch = runtime.GOARCH
	}
	t := transport{insecureHTTP: b.Source.InsecureHTTP, caBundle: b.Source.CABundle}
	type download struct {
		name, url, sum, dest string
		tmp                  host.TempFile
	}
	var todo []download
	defer func() {
		for _, d := range todo {
			if d.tmp != nil {
				_ = d.tmp.Discard()
			}
		}
	}()
	var done []string
	for _, name := range b.Components {
		url := BinaryURL(b.Source.BaseURL, b.Version, arch, name)
		sum, from := b.Source.SHA256.For(name), "pinned"
		if sum == "" {
			var err error
			if sum, err = fetchSHA256(ctx, env, url+".sha256", t); err != nil {
				return Result{}, err
			}
			from = "from " + url + ".sha256"
		}
		dest := "/usr/bin/" + name
		if fileSHA256(env, dest) == sum {
			env.printf("%s is already %s (sha256 %s, %s)\n", dest, b.Version, sum, from)
			done = append(done, name+" (already current)")
			continue
		}
		tmp, err := downloadVerified(ctx, env, url, sum, dest, t)
		if err != nil {
			return Result{}, err
		}
		todo = append(todo, download{name: name, url: url, sum: sum + ", " + from, dest: dest, tmp: tmp})
	}
	for i := range todo {
		d := &todo[i]
		if err := env.Host.Files.KeepPrevious(d.dest, d.dest+PrevSuffix); err != nil {
			return Result{}, err
		}
		tmp := d.tmp
		d.tmp = nil
		if err := tmp.Commit(0o755); err != nil {
			return Result{}, err
		}
		env.printf("installed %s from %s (sha256 %s)\n", d.dest, d.url, d.sum)
		done = append(done, d.name)
	}
	return Result{Message: fmt.Sprintf("installed %s %s", strings.Join(done, ", "), b.Version)}, nil
}
