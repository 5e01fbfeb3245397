package kubeclient

import (
	"context"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// catchesUp says whether a watch asked with options may catch up after the API server's absence:
// a cache to catch up with, and a watch from a resource version the cache reached (not a first
// list, which the reflector does itself).
func (r *reconnecting) catchesUp(options metav1.ListOptions) bool {
	return r.known != nil && options.ResourceVersion != "" && options.ResourceVersion != "0" &&
		options.SendInitialEvents == nil
}

// expired says whether err is the API server's answer that a resource version is too old to watch
// from, as the reflector tells it.
func expired(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

// watchOrCatchUp is the watch w, asked after the API server's absence, unless the API server found
// its resource version too old (w nil, or w's first event that error): then it catches up. A new
// API server's watch cache begins at the revision etcd had when it started, usually after the last
// event the cache saw; the reflector would wait out its back-off (0.8 to 1.6 s, doubling after each
// such end within two minutes) before it lists again.
//
// Catching up lists what the API server has now and hands the reflector, as watch events, the
// difference against the cache: an update for each object listed (an add for one the cache lacks),
// a delete (with the object as the cache last had it) for each the list lacks, and a bookmark at the
// list's resource version; then it watches on from there. That is what the reflector's own list
// would have done to the cache (a Replace), without the wait. Anything that fails ends the watch,
// and the reflector does as it always did.
func (r *reconnecting) watchOrCatchUp(ctx context.Context, options metav1.ListOptions, w watch.Interface) watch.Interface {
	c := &caughtUp{out: make(chan watch.Event), stop: make(chan struct{})}
	go c.run(ctx, r, options, w)
	return c
}

// caughtUp is the watch the reflector reads: w's events, or the catch-up's and the next watch's.
type caughtUp struct {
	out      chan watch.Event
	stop     chan struct{}
	stopOnce sync.Once
}

func (c *caughtUp) ResultChan() <-chan watch.Event { return c.out }

func (c *caughtUp) Stop() { c.stopOnce.Do(func() { close(c.stop) }) }

// send hands ev to the reader; false once the watch was stopped.
func (c *caughtUp) send(ev watch.Event) bool {
	select {
	case c.out <- ev:
		return true
	case <-c.stop:
		return false
	}
}

func (c *caughtUp) run(ctx context.Context, r *reconnecting, options metav1.ListOptions, w watch.Interface) {
	defer close(c.out)
	if w != nil {
		first, ok := c.next(w)
		if !ok {
			return
		}
		if first.Type != watch.Error || !expired(apierrors.FromObject(first.Object)) {
			if c.send(first) {
				c.forward(w)
			}
			return
		}
		w.Stop()
	}
	rv, ok := c.catchUp(ctx, r, options)
	if !ok {
		return
	}
	options.ResourceVersion = rv
	next, err := r.lw.WatchWithContext(ctx, options)
	if err != nil {
		klog.FromContext(ctx).Info("Caught up with the returned API server; watching on failed", "err", err.Error())
		return
	}
	c.forward(next)
}

// next is w's next event; false when w ended or the watch was stopped (w is then stopped).
func (c *caughtUp) next(w watch.Interface) (watch.Event, bool) {
	select {
	case ev, ok := <-w.ResultChan():
		return ev, ok
	case <-c.stop:
		w.Stop()
		return watch.Event{}, false
	}
}

// forward hands on w's events until w ends or the watch is stopped.
func (c *caughtUp) forward(w watch.Interface) {
	defer w.Stop()
	for {
		ev, ok := c.next(w)
		if !ok || !c.send(ev) {
			return
		}
	}
}

// catchUp lists and hands on the difference against the cache, then a bookmark; it returns the
// list's resource version, or false when the list failed or the watch was stopped.
func (c *caughtUp) catchUp(ctx context.Context, r *reconnecting, options metav1.ListOptions) (string, bool) {
	log := klog.FromContext(ctx)
	list, err := r.lw.ListWithContext(ctx, metav1.ListOptions{
		ResourceVersion: options.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		LabelSelector: options.LabelSelector, FieldSelector: options.FieldSelector,
	})
	if err != nil {
		log.Info("The returned API server found the cache's resource version too old; listing to catch up failed", "err", err.Error())
		return "", false
	}
	listMeta, err := meta.ListAccessor(list)
	if err != nil {
		return "", false
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return "", false
	}
	listed := make(map[string]bool, len(items))
	for _, item := range items {
		key, err := toolscache.MetaNamespaceKeyFunc(item)
		if err != nil {
			return "", false
		}
		listed[key] = true
		kind := watch.Modified
		if _, cached, _ := r.known.GetByKey(key); !cached {
			kind = watch.Added
		}
		if !c.send(watch.Event{Type: kind, Object: item}) {
			return "", false
		}
	}
	gone := 0
	for _, key := range r.known.ListKeys() {
		if listed[key] {
			continue
		}
		obj, cached, _ := r.known.GetByKey(key)
		o, ok := obj.(runtime.Object)
		if !cached || !ok {
			continue
		}
		if !c.send(watch.Event{Type: watch.Deleted, Object: o}) {
			return "", false
		}
		gone++
	}
	bookmark := r.proto.DeepCopyObject()
	m, err := meta.Accessor(bookmark)
	if err != nil {
		return "", false
	}
	m.SetResourceVersion(listMeta.GetResourceVersion())
	if !c.send(watch.Event{Type: watch.Bookmark, Object: bookmark}) {
		return "", false
	}
	log.Info("Caught up with the returned API server", "listed", len(items), "gone", gone, "resourceVersion", listMeta.GetResourceVersion())
	return listMeta.GetResourceVersion(), true
}
