package framework

import (
	"context"
	"fmt"
	"sort"
	"testing"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/plan"
)

// TaskEvent is one event of a watch on NodeTasks, in the order the server sent them.
type TaskEvent struct {
	Type watch.EventType
	Task *v1alpha1.NodeTask
}

// TaskWatch records the events of a watch on NodeTasks (WatchTasks).
type TaskWatch struct{ rec *recorder[*v1alpha1.NodeTask] }

// WatchTasks records every event of the NodeTasks matching selector (an operation's or a
// profile's label), from now on: it starts at the resourceVersion of a list, so that nothing
// created afterwards is missed, fails t when such tasks exist already, and resumes where the
// server dropped it (the API server drops watchers that fall behind on a loaded machine), or
// lists again after an API server restart (see recorder). The test's cleanup stops it.
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
	return &TaskWatch{rec: record[*v1alpha1.NodeTask](t, wc, &v1alpha1.NodeTaskList{}, list.ResourceVersion, fmt.Sprintf("the tasks %v", selector), l.apiServerPID, selector)}
}

// Events returns the events so far; a watch that failed fails t, as it may have missed some.
func (tw *TaskWatch) Events(t testing.TB) []TaskEvent {
	t.Helper()
	var out []TaskEvent
	for _, ev := range tw.rec.recordedSoFar(t) {
		out = append(out, TaskEvent{Type: ev.Type, Task: ev.Object})
	}
	return out
}

// Stop ends the watch and returns its events; a watch that failed fails t, as it may have missed some.
func (tw *TaskWatch) Stop(t testing.TB) []TaskEvent {
	t.Helper()
	tw.rec.stop()
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

// WorkEvents are events leaving out the preflight group's tasks, which only read and run on every
// node at once by design: what "one at a time" is asked of is the work that follows.
func WorkEvents(events []TaskEvent) []TaskEvent {
	out := make([]TaskEvent, 0, len(events))
	for _, ev := range events {
		if ev.Task.Spec.Group != plan.GroupPreflight {
			out = append(out, ev)
		}
	}
	return out
}
