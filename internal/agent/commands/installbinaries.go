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

// binaryPath is where installBinaries puts a binary.
func binaryPath(name string) string { return "/usr/bin/" + name }

// binarySource is where b's binary name comes from and its sha256: pinned in the source, else read
// from the server's .sha256 file (from says which).
func binarySource(ctx context.Context, env *Env, b *v1alpha1.InstallBinariesCommand, name string, t transport) (url, sum, from string, err error) {
	arch := env.Arch
	if arch == "" {
		arch = runtime.GOARCH
	}
	url = BinaryURL(b.Source.BaseURL, b.Version, arch, name)
	if sum = b.Source.SHA256.For(name); sum != "" {
		return url, sum, "pinned", nil
	}
	if sum, err = fetchSHA256(ctx, env, url+".sha256", t); err != nil {
		return "", "", "", err
	}
	return url, sum, "from " + url + ".sha256", nil
}

// runInstallBinaries replaces each binary in /usr/bin after checking its sha256 (pinned in the
// source, else the server's .sha256 file), keeping the one it replaces as <path>.nodeops-prev. Every
// binary is downloaded and verified before any is replaced, so one bad digest changes nothing. A
// binary that already has the wanted digest is left alone, so a re-run never overwrites the kept
// previous binary. A binary the agent downloaded while the command before ran (Prefetch), from the
// same URL with the same digest, is not downloaded again.
func runInstallBinaries(ctx context.Context, env *Env, b *v1alpha1.InstallBinariesCommand) (Result, error) {
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
		url, sum, from, err := binarySource(ctx, env, b, name, t)
		if err != nil {
			return Result{}, err
		}
		dest := binaryPath(name)
		var tmp host.TempFile
		var current bool
		if ahead := env.Prefetch.take(ctx, env.CommandIndex, dest, url, sum); ahead != nil {
			// A binary of another size cannot have the digest: only one of the same size is read.
			current = sizeOf(env, dest) == ahead.size && fileSHA256(env, dest) == sum
			tmp = ahead.tmp
			if !current {
				env.printf("downloaded %s while the command before ran (sha256 %s)\n", url, sum)
			}
		} else {
			// The binary in place is read while the new one downloads (each up to a second for the
			// kubelet); when it already has the digest the download stops and is dropped.
			dctx, stopDownload := context.WithCancel(ctx)
			digest := make(chan string, 1)
			go func() {
				d := fileSHA256(env, dest)
				if d == sum {
					stopDownload()
				}
				digest <- d
			}()
			tmp, _, err = downloadVerified(dctx, env, url, sum, dest, t)
			stopDownload()
			current = <-digest == sum
			if err != nil && !current {
				return Result{}, err
			}
		}
		if current {
			if tmp != nil {
				_ = tmp.Discard()
			}
			env.printf("%s is already %s (sha256 %s, %s)\n", dest, b.Version, sum, from)
			done = append(done, name+" (already current)")
			continue
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

// sizeOf is the size of host path p, -1 when it cannot be read.
func sizeOf(env *Env, p string) int64 {
	fi, err := env.Host.Files.Stat(p)
	if err != nil {
		return -1
	}
	return fi.Size()
}
