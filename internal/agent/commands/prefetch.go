package commands

import (
	"context"
	"io"
	"sync"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// Prefetch downloads, while a long command runs, the binaries of the task's installBinaries command
// that comes next: kubeadm's upgrade runs for minutes and then the new kubelet and kubectl are
// installed, whose download and verification (more than 140 MB) took a second and more of the
// node's upgrade after kubeadm had ended. The files are verified against the same digests as the
// install's own and kept as temporary files beside their destinations, which nothing else writes
// while kubeadm runs; the install takes a file only when its URL and digest are still the ones it
// installs, and downloads itself otherwise. Nothing is put in place before the install runs, and a
// file no install took is removed (Discard).
type Prefetch struct {
	// Index is the installBinaries command the downloads are for.
	Index int

	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	files  map[string]*prefetched // by destination
}

type prefetched struct {
	url, sum string
	size     int64
	tmp      host.TempFile
}

// StartPrefetch starts downloading command index, b, of the running task, with env's host and
// HTTP client, until ctx ends or Discard; nil in a DryRun, which downloads nothing ahead.
func StartPrefetch(ctx context.Context, env *Env, index int, b *v1alpha1.InstallBinariesCommand) *Prefetch {
	if env.DryRun {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Prefetch{Index: index, cancel: cancel, done: make(chan struct{}), files: map[string]*prefetched{}}
	quiet := *env
	quiet.Out = io.Discard // the running command's output is its own
	go func() {
		defer close(p.done)
		t := transport{insecureHTTP: b.Source.InsecureHTTP, caBundle: b.Source.CABundle}
		for _, name := range b.Components {
			url, sum, _, err := binarySource(ctx, &quiet, b, name, t)
			if err != nil {
				return // the install says why
			}
			dest := binaryPath(name)
			tmp, size, err := downloadVerified(ctx, &quiet, url, sum, dest, t)
			if err != nil {
				return
			}
			p.mu.Lock()
			p.files[dest] = &prefetched{url: url, sum: sum, size: size, tmp: tmp}
			p.mu.Unlock()
		}
	}()
	return p
}

// take waits until the downloads ended and hands over the file for dest when it is url's, with
// digest sum; nil otherwise (no prefetch, another command, a failed download, or ctx ended).
func (p *Prefetch) take(ctx context.Context, index int, dest, url, sum string) *prefetched {
	if p == nil || p.Index != index {
		return nil
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.files[dest]
	if f == nil || f.url != url || f.sum != sum {
		return nil
	}
	delete(p.files, dest)
	return f
}

// Discard stops the downloads and removes every file no install took.
func (p *Prefetch) Discard() {
	if p == nil {
		return
	}
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	for dest, f := range p.files {
		_ = f.tmp.Discard()
		delete(p.files, dest)
	}
}
