package kubeclient

import (
	"context"
	"errors"
	"net"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
)

// ReconnectEvery is how often the manager's caches ask again while the API server is away;
// ReconnectFor bounds one such run of asks before the error goes to client-go's own back-off.
const (
	ReconnectEvery = 500 * time.Millisecond
	ReconnectFor   = 2 * time.Minute
)

// NewInformer is the manager's cache.Options.NewInformer: client-go's informer, whose list and watch,
// while the API server is away (it refuses connections, closes them, or answers that it or etcd is
// not ready), ask again every ReconnectEvery instead of handing the error to the informer's
// reflector. The reflector backs off from 0.8 s, doubling to 30 s with up to as much again of
// jitter, and forgets only after two quiet minutes: after a single control plane's API server
// restarted (each upgrade and renewal restarts it, and etcd before it), the manager's caches kept
// the old state for up to a minute after the API server served again, and an operation whose last
// node had finished waited that long to say Succeeded.
//
// Only the manager uses it: it is one process. Agents, one per node, keep client-go's back-off, so
// that a thousand of them do not ask a starting API server twice a second each.
func NewInformer(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
	return toolscache.NewSharedIndexInformer(Reconnecting(lw, ReconnectEvery, ReconnectFor), obj, resync, indexers)
}

// Reconnecting wraps lw so that a list or watch the API server's absence failed is asked again
// every `every`, for up to `upTo`, before its error is returned; any other error (a refusal, too
// many requests, an expired resource version) is returned at once. It is a ListerWatcherWithContext
// too, which client-go's reflector prefers, and passes the reflector's context on.
func Reconnecting(lw toolscache.ListerWatcher, every, upTo time.Duration) toolscache.ListerWatcher {
	return &reconnecting{lw: toolscache.ToListerWatcherWithContext(lw), every: every, upTo: upTo}
}

type reconnecting struct {
	lw          toolscache.ListerWatcherWithContext
	every, upTo time.Duration
}

func (r *reconnecting) List(options metav1.ListOptions) (runtime.Object, error) {
	return r.ListWithContext(context.Background(), options)
}

func (r *reconnecting) Watch(options metav1.ListOptions) (watch.Interface, error) {
	return r.WatchWithContext(context.Background(), options)
}

func (r *reconnecting) ListWithContext(ctx context.Context, options metav1.ListOptions) (runtime.Object, error) {
	return askWhileAway(ctx, r.every, r.upTo, func() (runtime.Object, error) { return r.lw.ListWithContext(ctx, options) })
}

func (r *reconnecting) WatchWithContext(ctx context.Context, options metav1.ListOptions) (watch.Interface, error) {
	return askWhileAway(ctx, r.every, r.upTo, func() (watch.Interface, error) { return r.lw.WatchWithContext(ctx, options) })
}

// askWhileAway calls ask until it succeeds, fails otherwise than by the API server's absence, upTo
// has passed, or ctx ends; it returns the last answer.
func askWhileAway[T any](ctx context.Context, every, upTo time.Duration, ask func() (T, error)) (T, error) {
	deadline := time.Now().Add(upTo)
	for {
		v, err := ask()
		if err == nil || !APIServerAway(err) || !time.Now().Add(every).Before(deadline) {
			return v, err
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
	}
}

// APIServerAway says whether err means the API server could not answer, as while it or its etcd
// restarts: the connection was refused, reset, lost or timed out, or the server answered 500, 503
// or 504. A refusal (401, 403), too many requests (429) or any other answer about the request is
// not its absence.
func APIServerAway(err error) bool {
	var netErr net.Error
	switch {
	case utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err), utilnet.IsProbableEOF(err),
		utilnet.IsHTTP2ConnectionLost(err), errors.As(err, &netErr) && netErr.Timeout():
		return true
	case apierrors.IsInternalError(err), apierrors.IsServiceUnavailable(err), apierrors.IsServerTimeout(err),
		apierrors.IsTimeout(err):
		return true
	}
	return false
}
