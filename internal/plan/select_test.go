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

func TestNext(t *testing.T) {
	nodes := []string{"n5", "n1", "n3", "n2", "n4"}
	tests := []struct {
		name     string
		tasks    map[string]v1alpha1.TaskPhase
		notReady []string
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			notReady := map[string]bool{}
			for _, n := range tt.notReady {
				notReady[n] = true
			}
			got := Next(nodes, tt.tasks, notReady, tt.max)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Next = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestNextNeverExceedsMaxUnavailable drives groups to completion in many random orders: tasks
// finish, fail, get retried or skipped, and nodes flap NotReady. Unfinished-or-failed tasks never
// exceed maxUnavailable, and every node eventually gets its task.
func TestNextNeverExceedsMaxUnavailable(t *testing.T) {
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
		var order []string
		for step := 0; ; step++ {
			if step > 100000 {
				t.Fatalf("seed %d: no progress", seed)
			}
			started := Next(nodes, tasks, notReady, limit)
			if !sort.StringsAreSorted(started) {
				t.Fatalf("seed %d: not in sorted order: %v", seed, started)
			}
			for _, n := range started {
				if _, ok := tasks[n]; ok || notReady[n] {
					t.Fatalf("seed %d: started %s twice or while NotReady", seed, n)
				}
				tasks[n] = pending
				order = append(order, n)
			}
			if len(started) > 0 && Unavailable(nodes, tasks, notReady) > limit {
				t.Fatalf("seed %d: started %v and %d nodes are unavailable, limit %d", seed, started, Unavailable(nodes, tasks, notReady), limit)
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
			}
		}
		if len(order) != size {
			t.Fatalf("seed %d: %d tasks for %d nodes", seed, len(order), size)
		}
	}
}
