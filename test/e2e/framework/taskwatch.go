package framework

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
)

// TaskEvent is one event of a watch on NodeTasks, in the order the server sent them.
type TaskEvent struct {
	Type watch.EventType
	Task *v1alpha1.NodeTask
}

// TaskWatch records the events of a watch on NodeTasks (WatchTasks).
type TaskWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	events []TaskEvent
	err    error
}

// WatchTasks records every event of the NodeTasks matching selector (an operation's or a
// profile's label), from now on: it starts at the resourceVersion of a list, so that nothing
// created afterwards is missed, fails t when such tasks exist already, and resumes where the
// server dropped it (the API server drops watchers that fall behind on a loaded machine). The
// test's cleanup stops it.
func WatchTasks(t testing.TB, l *Local, selector client.MatchingLabels) *TaskWatch {
	t.Helper()
	wc, err := client.NewWithWatch(l.RESTConfig, client.Options{Scheme: l.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var list v1alpha1.NodeTaskList
	if err := wc.List(context.Background(), &list, selector); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Fatalf("%d tasks match %v before the watch", len(list.Items), selector)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tw := &TaskWatch{cancel: cancel, done: make(chan struct{})}
	rv := list.ResourceVersion
	go func() {
		defer close(tw.done)
		for ctx.Err() == nil {
			w, err := wc.Watch(ctx, &v1alpha1.NodeTaskList{}, selector, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
			if err != nil {
				if ctx.Err() == nil {
					tw.setErr(fmt.Errorf("watching the tasks %v: %w", selector, err))
				}
				return
			}
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					w.Stop()
					if ctx.Err() != nil {
						return
					}
					tw.setErr(fmt.Errorf("watching the tasks %v: %w (events may have been missed)", selector, apierrors.FromObject(ev.Object)))
					return
				}
				task, ok := ev.Object.(*v1alpha1.NodeTask)
				if !ok || ev.Type == watch.Bookmark {
					continue
				}
				rv = task.ResourceVersion
				tw.mu.Lock()
				tw.events = append(tw.events, TaskEvent{Type: ev.Type, Task: task})
				tw.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { tw.cancel(); <-tw.done })
	return tw
}

func (tw *TaskWatch) setErr(err error) {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	if tw.err == nil {
		tw.err = err
	}
}

// Events returns the events so far; a watch that failed fails t, as it may have missed some.
func (tw *TaskWatch) Events(t testing.TB) []TaskEvent {
	t.Helper()
	tw.mu.Lock()
	defer tw.mu.Unlock()
	if tw.err != nil {
		t.Fatal(tw.err)
	}
	return append([]TaskEvent(nil), tw.events...)
}

// Stop ends the watch and returns its events; a watch that failed fails t, as it may have missed some.
func (tw *TaskWatch) Stop(t testing.TB) []TaskEvent {
	t.Helper()
	tw.cancel()
	<-tw.done
	return tw.Events(t)
}

// MaxHeld replays events and returns the most nodes that held unfinished tasks at once (the node
// lock's notion of a node being worked on) and when, counting only the nodes in among (all when nil).
func MaxHeld(events []TaskEvent, among map[string]bool) (int, string) {
	holding := map[string]string{}
	peak, at := 0, ""
	for _, ev := range events {
		if ev.Type == watch.Deleted || !nodelock.Holds(ev.Task) {
			delete(holding, ev.Task.Name)
		} else if among == nil || among[ev.Task.Spec.NodeName] {
			holding[ev.Task.Name] = ev.Task.Spec.NodeName
		}
		nodes := map[string]bool{}
		for _, n := range holding {
			nodes[n] = true
		}
		if len(nodes) > peak {
			peak, at = len(nodes), fmt.Sprintf("after %s %s: %v", ev.Type, ev.Task.Name, holding)
		}
	}
	return peak, at
}

// NodesOf is the sorted names of the nodes the events' tasks are on.
func NodesOf(events []TaskEvent) []string {
	set := map[string]bool{}
	for _, ev := range events {
		set[ev.Task.Spec.NodeName] = true
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
