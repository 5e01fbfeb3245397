package framework

import (
	"context"
	"fmt"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
type recorder[T client.Object] struct {
	what   string
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	events []recorded[T]
	err    error
}

// record starts watching, with wc and opts, the objects of empty's kind from resourceVersion rv;
// the test's cleanup stops it.
func record[T client.Object](t testing.TB, wc client.WithWatch, empty client.ObjectList, rv, what string, opts ...client.ListOption) *recorder[T] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &recorder[T]{what: what, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for ctx.Err() == nil {
			w, err := wc.Watch(ctx, empty, append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})...)
			if err != nil {
				if ctx.Err() == nil {
					r.setErr(fmt.Errorf("watching %s: %w", what, err))
				}
				return
			}
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					w.Stop()
					if ctx.Err() == nil {
						r.setErr(fmt.Errorf("watching %s: %w (events may have been missed)", what, apierrors.FromObject(ev.Object)))
					}
					return
				}
				obj, ok := ev.Object.(T)
				if !ok || ev.Type == watch.Bookmark {
					continue
				}
				rv = obj.GetResourceVersion()
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
