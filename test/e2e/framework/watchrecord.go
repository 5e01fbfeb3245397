package framework

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// recorded is one event of a watch, in the order the server sent it.
type recorded[T client.Object] struct {
	Type   watch.EventType
	Object T
}

// recorder records every event of a watch of T from a list's resourceVersion on, resuming where the
// server dropped it (the API server drops watchers that fall behind on a loaded machine), until
// stopped; what names the watch in its errors. TaskWatch and PodWatch are its two uses.
//
// nodeops-local's one API server may restart (the CA stand-in restarts it on a rotation's new
// service-account keys): the recorder waits until it answers again, and since a restarted API
// server's watch cache cannot resume from a resourceVersion before its start (410 Gone), it lists
// again and records each object as it then is (Modified, Deleted for one gone, Added for a new one),
// then watches on. Nothing changes while the one API server is down, and a stopping one delivers its
// watch events until it stops (nodeops-local runs it with --shutdown-send-retry-after), so what the
// list cannot show is only a change made and undone in its last moments. A 410 without a restart
// (apiServerPID unchanged) still fails: events may have been missed.
type recorder[T client.Object] struct {
	what   string
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	events []recorded[T]
	err    error
}

// unreachableFor bounds how long the recorder waits for a restarting API server to answer again.
const unreachableFor = 3 * time.Minute

// record starts watching, with wc and opts, the objects of empty's kind from resourceVersion rv;
// apiServerPID is the API server's process ID now (it changes when it restarts). The test's cleanup
// stops it.
func record[T client.Object](t testing.TB, wc client.WithWatch, empty client.ObjectList, rv, what string, apiServerPID func() int, opts ...client.ListOption) *recorder[T] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &recorder[T]{what: what, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		last := map[client.ObjectKey]T{} // each object as last recorded, for a new list's deletions
		pid := apiServerPID()
		var failingSince time.Time
		// retry says whether err (of a watch or a list) is the API server restarting, after a pause.
		retry := func(err error) bool {
			if ctx.Err() != nil {
				return false
			}
			var status apierrors.APIStatus
			restarting := !errors.As(err, &status) || apierrors.IsServiceUnavailable(err) || apierrors.IsTooManyRequests(err) ||
				apiServerPID() != pid
			if !restarting {
				return false
			}
			if failingSince.IsZero() {
				failingSince = time.Now()
			}
			if time.Since(failingSince) > unreachableFor {
				return false
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
			return true
		}
		fail := func(err error) {
			if ctx.Err() == nil {
				r.setErr(fmt.Errorf("watching %s: %w (events may have been missed)", what, err))
			}
		}
		// relist records the objects as a list shows them after an API server restart, and returns
		// its resourceVersion.
		relist := func() (string, error) {
			list := empty.DeepCopyObject().(client.ObjectList)
			if err := wc.List(ctx, list, opts...); err != nil {
				return "", err
			}
			items, err := meta.ExtractList(list)
			if err != nil {
				return "", err
			}
			now := map[client.ObjectKey]T{}
			var added []T
			r.mu.Lock()
			defer r.mu.Unlock()
			// The objects recorded before first (changed or gone), then the new ones by creation: what
			// the test waits on (a next task) is created after what it waited for changed.
			for _, item := range items {
				obj, ok := item.(T)
				if !ok {
					continue
				}
				key := client.ObjectKeyFromObject(obj)
				now[key] = obj
				if _, ok := last[key]; !ok {
					added = append(added, obj)
					continue
				}
				r.events = append(r.events, recorded[T]{Type: watch.Modified, Object: obj})
			}
			for key, obj := range last {
				if _, ok := now[key]; !ok {
					r.events = append(r.events, recorded[T]{Type: watch.Deleted, Object: obj})
				}
			}
			slices.SortStableFunc(added, func(a, b T) int {
				return a.GetCreationTimestamp().Compare(b.GetCreationTimestamp().Time)
			})
			for _, obj := range added {
				r.events = append(r.events, recorded[T]{Type: watch.Added, Object: obj})
			}
			clear(last)
			for k, v := range now {
				last[k] = v
			}
			return list.GetResourceVersion(), nil
		}
		// expired handles a 410: a list after an API server restart, a failure otherwise.
		expired := func(err error) bool {
			if apiServerPID() == pid {
				fail(err)
				return false
			}
			for {
				newRV, lerr := relist()
				if lerr == nil {
					rv, pid, failingSince = newRV, apiServerPID(), time.Time{}
					return true
				}
				if !retry(lerr) {
					fail(fmt.Errorf("listing after an API server restart: %w", lerr))
					return false
				}
			}
		}
		for ctx.Err() == nil {
			w, err := wc.Watch(ctx, empty, append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})...)
			switch {
			case err == nil:
			case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
				if !expired(err) {
					return
				}
				continue
			case retry(err):
				continue
			default:
				fail(err)
				return
			}
			failingSince = time.Time{}
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					w.Stop()
					err := apierrors.FromObject(ev.Object)
					switch {
					case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
						if !expired(err) {
							return
						}
					case retry(err):
					default:
						fail(err)
						return
					}
					break
				}
				obj, ok := ev.Object.(T)
				if !ok || ev.Type == watch.Bookmark {
					continue
				}
				rv = obj.GetResourceVersion()
				key := client.ObjectKeyFromObject(obj)
				if ev.Type == watch.Deleted {
					delete(last, key)
				} else {
					last[key] = obj
				}
				r.mu.Lock()
				r.events = append(r.events, recorded[T]{Type: ev.Type, Object: obj})
				r.mu.Unlock()
			}
		}
	}()
	t.Cleanup(r.stop)
	return r
}

func (r *recorder[T]) setErr(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
}

func (r *recorder[T]) stop() {
	r.cancel()
	<-r.done
}

// recordedSoFar returns the events so far; a watch that failed fails t, as it may have missed some.
func (r *recorder[T]) recordedSoFar(t testing.TB) []recorded[T] {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		t.Fatal(r.err)
	}
	return append([]recorded[T](nil), r.events...)
}
