package metrics

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// failures counts the command failures the manager observes, by command kind and failure reason:
// each run of a command (task, command, attempt) once, the first time a NodeTask change shows it
// failed, so the count only grows over the manager's life whatever becomes of the task (a retry,
// a skip, its deletion). Failures already recorded when the manager starts (the informer's initial
// list) happened before it and are not counted: like any counter it starts from 0 with the process,
// and Prometheus' rate and increase treat a restart as a reset.
type failures struct {
	mu     sync.Mutex
	seen   map[types.UID]map[commandRun]bool
	counts map[[2]string]float64 // kind, reason
}

type commandRun struct {
	index   int
	attempt int32
}

func newFailures() *failures {
	return &failures{seen: map[types.UID]map[commandRun]bool{}, counts: map[[2]string]float64{}}
}

// observe records the failed runs of t not seen before, counting them unless t comes from the
// informer's initial list.
func (f *failures) observe(t *v1alpha1.NodeTask, count bool) {
	reason := failureReason(t)
	// A failed gate check is its gate's answer, counted by nodeops_gate_failures_total, not a failed command.
	if reason == "" || v1alpha1.IsGateCheck(t) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for j, cs := range t.Status.Commands {
		// A lost agent leaves its command Running; the task has failed all the same.
		if cs.Phase != v1alpha1.CommandFailed && cs.Phase != v1alpha1.CommandRunning {
			continue
		}
		run := commandRun{index: j, attempt: cs.Attempt}
		if f.seen[t.UID][run] {
			continue
		}
		if f.seen[t.UID] == nil {
			f.seen[t.UID] = map[commandRun]bool{}
		}
		f.seen[t.UID][run] = true
		if count {
			f.counts[[2]string{commandKind(t, j), reason}]++
		}
	}
}

// forget drops a deleted task's runs; its UID never comes back, and its counts stay.
func (f *failures) forget(obj any) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if t, ok := obj.(*v1alpha1.NodeTask); ok {
		f.mu.Lock()
		delete(f.seen, t.UID)
		f.mu.Unlock()
	}
}

func (f *failures) snapshot() map[[2]string]float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[[2]string]float64, len(f.counts))
	for k, v := range f.counts {
		out[k] = v
	}
	return out
}

// Start counts command failures from every NodeTask change, and gate waits and failures from every
// NodeOperation change, the cache's informers deliver (nodeops_commands_failed_total,
// nodeops_gate_waits_total, nodeops_gate_failures_total). Call it once, before the manager starts.
func (m *Manager) Start(ctx context.Context, c cache.Cache) error {
	inf, err := c.GetInformer(ctx, &v1alpha1.NodeTask{})
	if err != nil {
		return fmt.Errorf("get NodeTask informer: %w", err)
	}
	if _, err := inf.AddEventHandler(counting[*v1alpha1.NodeTask]{m.failures}); err != nil {
		return fmt.Errorf("watch NodeTasks for failed commands: %w", err)
	}
	opInf, err := c.GetInformer(ctx, &v1alpha1.NodeOperation{})
	if err != nil {
		return fmt.Errorf("get NodeOperation informer: %w", err)
	}
	if _, err := opInf.AddEventHandler(counting[*v1alpha1.NodeOperation]{m.gateRuns}); err != nil {
		return fmt.Errorf("watch NodeOperations for gate waits and failures: %w", err)
	}
	return nil
}

// counter counts from objects of kind T as an informer sees them (failures, gateCounts).
type counter[T any] interface {
	observe(obj T, count bool)
	forget(obj any)
}

// counting feeds a counter from an informer: what the initial list holds is observed without
// being counted, every later add or update is counted.
type counting[T any] struct{ c counter[T] }

func (h counting[T]) OnAdd(obj any, isInInitialList bool) {
	if o, ok := obj.(T); ok {
		h.c.observe(o, !isInInitialList)
	}
}

func (h counting[T]) OnUpdate(_, obj any) {
	if o, ok := obj.(T); ok {
		h.c.observe(o, true)
	}
}

func (h counting[T]) OnDelete(obj any) { h.c.forget(obj) }
