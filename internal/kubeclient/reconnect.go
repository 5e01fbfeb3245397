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

// ReconnectEvery is how often the manager's caches ask again while the API server is away, for the
// first ReconnectSteady of an absence (a single control plane's etcd and API server restart within
// it), then doubling (with jitter) up to reconnectAtMost; ReconnectFor bounds one such run of asks
// before the error goes to client-go's own back-off.
const (
	ReconnectEvery      = 250 * time.Millisecond
	AgentReconnectEvery = time.Second
	ReconnectSteady     = 30 * time.Second
	ReconnectFor        = 2 * time.Minute
	reconnectAtMost     = 4 * time.Second
)

// NewInformer is the manager's cache.Options.NewInformer: client-go's informer, whose list and watch,
// while the API server is away (it refuses or closes connections, or answers that it is not yet
// available), ask again every ReconnectEvery, instead of handing the error to the informer's
// reflector. The reflector backs off from 0.8 s, doubling to 30 s with up to as much again of
// jitter, and forgets only after two quiet minutes: after a single control plane's API server
// restarted (each upgrade and renewal restarts it, and etcd before it), the manager's caches kept
// the old state for up to a minute after the API server served again, and an operation whose last
// node had finished waited that long to say Succeeded. Asking at a steady quarter second, rather
// than doubling from the start, keeps that wait under a quarter second for an absence of seconds
// (doubling from 0.5 s to 4 s left it at up to 4 s, 1.4 s in an upgrade on the real node).
//
// The manager is one process, with a dozen caches, so a starting API server sees at most some fifty
// refused connections or 503 answers a second from it. Agents, one per node, use NewAgentInformer.
//
// When the API server returns, a watch from where the cache stood is usually too old for it (a
// new API server's watch cache begins at etcd's revision when it started): the reflector would
// then wait out its back-off, 0.8 to 1.6 s or more, before it lists again, and the manager would
// learn that late of what happened meanwhile. The informer's list and watch catch up instead
// (catchUp): list, hand the reflector the difference against the cache, watch on.
func NewInformer(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
	return newCatchingUpInformer(lw, obj, resync, indexers, ReconnectEvery)
}

// NewAgentInformer is the agent's cache.Options.NewInformer: NewInformer's, asking once a second
// (AgentReconnectEvery) for the first ReconnectSteady of an absence. With client-go's back-off an
// agent whose API server restarted twice within two minutes (a reconfigure restarts it, then the
// kubelet) asked again only after 10 s or more, and on the real node the next operation's first
// task started 8.3 s after it was created. One agent runs per node: a thousand ask a starting API
// server a thousand times a second, cheap refusals and 503 answers, where only a single control
// plane restarts (behind a load balancer the others answer).
func NewAgentInformer(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
	return newCatchingUpInformer(lw, obj, resync, indexers, AgentReconnectEvery)
}

func newCatchingUpInformer(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers, every time.Duration) toolscache.SharedIndexInformer {
	r := reconnectingWith(lw, every, ReconnectFor)
	informer := toolscache.NewSharedIndexInformer(r, obj, resync, indexers)
	r.catchUpInto(informer.GetStore(), obj)
	return informer
}

// reconnectingWith wraps lw so that a list or watch the API server's absence failed is asked again
// every `every` for ReconnectSteady, then doubling with jitter to at most 4 s, for up to `upTo`,
// before its error is returned. Once the API server was away, a refusal (401, 403) is asked again
// too, for up to refusalGrace: a starting API server refuses requests until its authenticator and
// authorizer have read their objects. Any other error (too many requests, a server error, a
// resource version too old or too new), or a refusal from a server that was not away, is returned
// at once, to the reflector's own handling. It is a ListerWatcherWithContext too, which client-go's
// reflector prefers, and passes the reflector's context on.
func reconnectingWith(lw toolscache.ListerWatcher, every, upTo time.Duration) *reconnecting {
	return &reconnecting{lw: toolscache.ToListerWatcherWithContext(lw), every: every, upTo: upTo}
}

// refusalGrace bounds how long refusals are asked again after the API server was away.
const refusalGrace = 30 * time.Second

type reconnecting struct {
	lw          toolscache.ListerWatcherWithContext
	every, upTo time.Duration
	// known is the informer's cache and proto an empty object of its type, for catchUp; nil when
	// not catching up.
	known toolscache.Store
	proto runtime.Object
}

// catchUpInto makes a watch that the returned API server finds too old catch up with known.
func (r *reconnecting) catchUpInto(known toolscache.Store, proto runtime.Object) {
	r.known, r.proto = known, proto
}

func (r *reconnecting) List(options metav1.ListOptions) (runtime.Object, error) {
	return r.ListWithContext(context.Background(), options)
}

func (r *reconnecting) Watch(options metav1.ListOptions) (watch.Interface, error) {
	return r.WatchWithContext(context.Background(), options)
}

func (r *reconnecting) ListWithContext(ctx context.Context, options metav1.ListOptions) (runtime.Object, error) {
	v, _, err := askWhileAway(ctx, r.every, r.upTo, func() (runtime.Object, error) { return r.lw.ListWithContext(ctx, options) })
	return v, err
}

func (r *reconnecting) WatchWithContext(ctx context.Context, options metav1.ListOptions) (watch.Interface, error) {
	w, away, err := askWhileAway(ctx, r.every, r.upTo, func() (watch.Interface, error) { return r.lw.WatchWithContext(ctx, options) })
	if !away || !r.catchesUp(options) {
		return w, err
	}
	switch {
	case err == nil:
		return r.watchOrCatchUp(ctx, options, w), nil
	case expired(err):
		return r.watchOrCatchUp(ctx, options, nil), nil
	}
	return w, err
}

// askWhileAway calls ask until it succeeds, fails otherwise than by the API server's absence (or,
// after it, by a starting server's refusal), upTo has passed, or ctx ends; it returns the last
// answer and whether the API server was away meanwhile. It logs the absence once.
func askWhileAway[T any](ctx context.Context, every, upTo time.Duration, ask func() (T, error)) (T, bool, error) {
	began := time.Now()
	deadline := began.Add(upTo)
	var awaySince time.Time
	for n := 0; ; n++ {
		v, err := ask()
		switch {
		case err == nil:
			return v, !awaySince.IsZero(), nil
		case APIServerAway(err):
			if awaySince.IsZero() {
				awaySince = time.Now()
			}
		case awaySince.IsZero() || !StartingRefusal(err) || time.Since(awaySince) > refusalGrace:
			return v, !awaySince.IsZero(), err
		}
		delay := askDelay(every, time.Since(began))
		if !time.Now().Add(delay).Before(deadline) {
			return v, true, err
		}
		if n == 0 {
			klog.FromContext(ctx).Info("The API server is away; asking again", "every", every, "upTo", upTo, "err", err.Error())
		}
		t := time.NewTimer(wait.Jitter(delay, 0.2))
		select {
		case <-ctx.Done():
			t.Stop()
			return v, true, err
		case <-t.C:
		}
	}
}

// askDelay is the pause before the next ask, `asking` into a run of asks: `every` for the first
// ReconnectSteady, then doubling for each further ReconnectSteady, to at most reconnectAtMost (or
// `every`, if longer).
func askDelay(every, asking time.Duration) time.Duration {
	delay := every
	for t := ReconnectSteady; t <= asking && delay < reconnectAtMost; t += ReconnectSteady {
		delay *= 2
	}
	return min(delay, max(reconnectAtMost, every))
}

// StartingRefusal says whether err is a refusal a starting API server gives before its
// authenticator (401) and authorizer (403) have read their objects.
func StartingRefusal(err error) bool {
	return apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err)
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
