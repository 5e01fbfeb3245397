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
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// ReconnectEvery is how soon the manager's caches ask again while the API server is away, doubling
// (with jitter) up to reconnectAtMost; ReconnectFor bounds one such run of asks before the error
// goes to client-go's own back-off.
const (
	ReconnectEvery  = 500 * time.Millisecond
	ReconnectFor    = 2 * time.Minute
	reconnectAtMost = 4 * time.Second
)

// NewInformer is the manager's cache.Options.NewInformer: client-go's informer, whose list and watch,
// while the API server is away (it refuses or closes connections, or answers that it is not yet
// available), ask again after ReconnectEvery, doubling to at most 4 s, instead of handing the error
// to the informer's reflector. The reflector backs off from 0.8 s, doubling to 30 s with up to as much again of
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
// after `every`, doubling with jitter to at most 4 s, for up to `upTo`, before its error is
// returned; any other error (a refusal, too many requests, a server error, a resource version too
// old or too new) is returned at once, to the reflector's own handling. It is a ListerWatcherWithContext
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
// has passed, or ctx ends; it returns the last answer. It logs the absence once.
func askWhileAway[T any](ctx context.Context, every, upTo time.Duration, ask func() (T, error)) (T, error) {
	deadline := time.Now().Add(upTo)
	delay := every
	for {
		v, err := ask()
		if err == nil || !APIServerAway(err) || !time.Now().Add(delay).Before(deadline) {
			return v, err
		}
		if delay == every {
			klog.FromContext(ctx).Info("The API server is away; asking again", "every", every, "upTo", upTo, "err", err.Error())
		}
		t := time.NewTimer(wait.Jitter(delay, 0.2))
		delay = min(2*delay, max(reconnectAtMost, every))
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
	}
}

// APIServerAway says whether err means the API server could not answer, as while it restarts: the
// connection was refused, reset, lost or timed out, or the server answered 503 (not yet available).
// A refusal (401, 403), too many requests (429), a server error (500, 504: an overloaded or broken
// server, or a resource version the server has not reached) or any other answer about the request
// is not its absence.
func APIServerAway(err error) bool {
	var netErr net.Error
	switch {
	case apierrors.IsServiceUnavailable(err):
		return true
	case apierrors.ReasonForError(err) != metav1.StatusReasonUnknown:
		return false // an answer of the API server's
	case utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err), utilnet.IsProbableEOF(err),
		utilnet.IsHTTP2ConnectionLost(err), errors.As(err, &netErr) && netErr.Timeout():
		return true
	}
	return false
}
