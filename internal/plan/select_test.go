package plan

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

const (
	pending   = v1alpha1.TaskPending
	running   = v1alpha1.TaskRunning
	succeeded = v1alpha1.TaskSucceeded
	failed    = v1alpha1.TaskFailed
	aborted   = v1alpha1.TaskAborted
)

// next is how a NodeOperation's group feeds Select: nodes without a task are the candidates;
// the others count while their task is unfinished or they are NotReady; held nodes are down.
func next(groupNodes []string, tasks map[string]v1alpha1.TaskPhase, notReady, held map[string]bool, budget int) []string {
	sorted := append([]string(nil), groupNodes...)
	sort.Strings(sorted)
	var candidates []string
	unavailable := 0
	for _, n := range sorted {
		if phase, ok := tasks[n]; ok {
			if phase.Unfinished() || notReady[n] {
				unavailable++
			}
			continue
		}
		candidates = append(candidates, n)
	}
	return Select(candidates, budget, unavailable, func(n string) bool { return notReady[n] || held[n] })
}

// unavailableOf counts the group's nodes that are unavailable, each once.
func unavailableOf(groupNodes []string, tasks map[string]v1alpha1.TaskPhase, notReady, held map[string]bool) int {
	n := 0
	for _, node := range groupNodes {
		if phase, ok := tasks[node]; (ok && phase.Unfinished()) || notReady[node] || (!ok && held[node]) {
			n++
		}
	}
	return n
}

func TestSelect(t *testing.T) {
	nodes := []string{"n5", "n1", "n3", "n2", "n4"}
	tests := []struct {
		name     string
		tasks    map[string]v1alpha1.TaskPhase
		notReady []string
		held     []string
		max      int
		want     []string
	}{
		{name: "fresh, one at a time", max: 1, want: []string{"n1"}},
		{name: "fresh, sorted order", max: 3, want: []string{"n1", "n2", "n3"}},
		{name: "all at once", max: 10, want: []string{"n1", "n2", "n3", "n4", "n5"}},
		{name: "running counts", tasks: map[string]v1alpha1.TaskPhase{"n1": running}, max: 2, want: []string{"n2"}},
		{name: "pending counts", tasks: map[string]v1alpha1.TaskPhase{"n1": pending, "n2": pending}, max: 2},
		{name: "failed counts", tasks: map[string]v1alpha1.TaskPhase{"n1": failed}, max: 1},
		{name: "succeeded frees", tasks: map[string]v1alpha1.TaskPhase{"n1": succeeded, "n2": running}, max: 2, want: []string{"n3"}},
		{name: "aborted frees and is not restarted", tasks: map[string]v1alpha1.TaskPhase{"n1": aborted}, max: 1, want: []string{"n2"}},
		{name: "not ready counts and waits", notReady: []string{"n1"}, max: 2, want: []string{"n2"}},
		{name: "not ready with running task counts once", tasks: map[string]v1alpha1.TaskPhase{"n1": running}, notReady: []string{"n1"}, max: 2, want: []string{"n2"}},
		{name: "not ready after success counts", tasks: map[string]v1alpha1.TaskPhase{"n1": succeeded}, notReady: []string{"n1", "n2"}, max: 2},
		{name: "not ready outside the group ignored", notReady: []string{"other"}, max: 1, want: []string{"n1"}},
		{name: "over budget", tasks: map[string]v1alpha1.TaskPhase{"n1": running, "n2": failed, "n3": pending}, max: 2},
		{name: "all done", tasks: map[string]v1alpha1.TaskPhase{"n1": succeeded, "n2": succeeded, "n3": succeeded, "n4": succeeded, "n5": succeeded}, max: 5},
		{name: "held elsewhere counts and waits", held: []string{"n1"}, max: 2, want: []string{"n2"}},
		{name: "held elsewhere late in the order counts too", held: []string{"n5"}, max: 1},
		{name: "held and not ready counts once", held: []string{"n1"}, notReady: []string{"n1"}, max: 2, want: []string{"n2"}},
		{name: "everything held", held: []string{"n1", "n2", "n3", "n4", "n5"}, max: 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := next(nodes, tt.tasks, set(tt.notReady), set(tt.held), tt.max)
			if len(got) == 0 {
				got = nil
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Select = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSelectCounts(t *testing.T) {
	all := []int{1, 2, 3, 4, 5}
	odd := func(n int) bool { return n%2 == 1 }
	tests := []struct {
		budget, unavailable int
		down                func(int) bool
		want                []int
	}{
		{budget: 0, down: never, want: nil},
		{budget: -1, down: never, want: nil},
		{budget: 2, down: never, want: []int{1, 2}},
		{budget: 3, unavailable: 1, down: never, want: []int{1, 2}},
		{budget: 3, unavailable: 3, down: never, want: nil},
		{budget: 4, down: odd, want: []int{2}},
		{budget: 3, down: odd, want: nil},
		{budget: 9, down: odd, want: []int{2, 4}},
	}
	for _, tt := range tests {
		got := Select(all, tt.budget, tt.unavailable, tt.down)
		if len(got) == 0 {
			got = nil
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Select(budget %d, unavailable %d) = %v, want %v", tt.budget, tt.unavailable, got, tt.want)
		}
	}
}

func never(int) bool { return false }

func set(names []string) map[string]bool {
	out := map[string]bool{}
	for _, n := range names {
		out[n] = true
	}
	return out
}

// TestSafetyRule2_SelectNeverExceedsMaxUnavailable drives groups to completion in many random orders: tasks
// finish, fail, get retried or skipped, nodes flap NotReady and other owners' tasks come and go.
// Unfinished-or-failed tasks never exceed maxUnavailable, and every node eventually gets its task.
func TestSafetyRule2_SelectNeverExceedsMaxUnavailable(t *testing.T) {
	for seed := range uint64(2000) {
		rng := rand.New(rand.NewPCG(seed, 42))
		size := 1 + rng.IntN(40)
		nodes := make([]string, size)
		for i := range nodes {
			nodes[i] = fmt.Sprintf("node-%03d", rng.IntN(1000)*100+i)
		}
		limit := 1 + rng.IntN(size+2)
		tasks := map[string]v1alpha1.TaskPhase{}
		notReady := map[string]bool{}
		held := map[string]bool{} // by another owner's task
		var order []string
		for step := 0; ; step++ {
			if step > 100000 {
				t.Fatalf("seed %d: no progress", seed)
			}
			started := next(nodes, tasks, notReady, held, limit)
			if !sort.StringsAreSorted(started) {
				t.Fatalf("seed %d: not in sorted order: %v", seed, started)
			}
			for _, n := range started {
				if _, ok := tasks[n]; ok || notReady[n] || held[n] {
					t.Fatalf("seed %d: started %s twice, while NotReady or while held", seed, n)
				}
				tasks[n] = pending
				order = append(order, n)
			}
			if u := unavailableOf(nodes, tasks, notReady, held); len(started) > 0 && u > limit {
				t.Fatalf("seed %d: started %v and %d nodes are unavailable, limit %d", seed, started, u, limit)
			}
			busy := 0
			for _, p := range tasks {
				if p.Unfinished() {
					busy++
				}
			}
			if busy > limit {
				t.Fatalf("seed %d: %d unfinished-or-failed tasks, limit %d", seed, busy, limit)
			}
			if len(tasks) == size && busy == 0 {
				break
			}
			// One random event.
			var open []string
			for _, n := range nodes {
				if p, ok := tasks[n]; ok && p.Unfinished() {
					open = append(open, n)
				}
			}
			switch r := rng.IntN(10); {
			case r < 2:
				n := nodes[rng.IntN(size)]
				notReady[n] = !notReady[n]
			case r == 2:
				n := nodes[rng.IntN(size)]
				held[n] = !held[n]
			case len(open) > 0:
				n := open[rng.IntN(len(open))]
				switch tasks[n] {
				case pending:
					tasks[n] = running
				case running:
					if rng.IntN(4) == 0 {
						tasks[n] = failed
					} else {
						tasks[n] = succeeded
					}
				case failed:
					if rng.IntN(2) == 0 {
						tasks[n] = pending // Retry
					} else {
						tasks[n] = succeeded // Skip of the last command
					}
				}
			default:
				clear(notReady) // nodes come back
				clear(held)     // other owners' tasks end
			}
		}
		if len(order) != size {
			t.Fatalf("seed %d: %d tasks for %d nodes", seed, len(order), size)
		}
	}
}
