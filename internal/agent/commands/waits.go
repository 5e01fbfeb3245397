package commands

import (
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Waits adds up the time a command run spends waiting, by what it waits for, so that the task's
// status can show the time the work ran apart from the time spent waiting on something else. The
// zero value is ready to use; a nil *Waits records nothing.
type Waits struct {
	mu    sync.Mutex
	order []v1alpha1.WaitFor
	total map[v1alpha1.WaitFor]time.Duration
}

// add records d waited for f.
func (w *Waits) add(f v1alpha1.WaitFor, d time.Duration) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.total == nil {
		w.total = map[v1alpha1.WaitFor]time.Duration{}
	}
	if _, seen := w.total[f]; !seen {
		w.order = append(w.order, f)
	}
	w.total[f] += d
}

// List is what was waited for, in the order first waited for, each rounded to the millisecond.
func (w *Waits) List() []v1alpha1.CommandWait {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]v1alpha1.CommandWait, 0, len(w.order))
	for _, f := range w.order {
		out = append(out, v1alpha1.CommandWait{For: f, Duration: metav1.Duration{Duration: w.total[f].Round(time.Millisecond)}})
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// waiting starts timing a wait for f; the function it returns ends it.
func (e *Env) waiting(f v1alpha1.WaitFor) func() {
	if e.Waits == nil {
		return func() {}
	}
	start := time.Now()
	return func() { e.Waits.add(f, time.Since(start)) }
}
