package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/statuswrite"
	"github.com/nodeops/nodeops/internal/transient"
)

// managerDrain has the manager drain the node for one run of a command and waits for its answer,
// the condition Drained (drain honours PodDisruptionBudgets and agents confined to their own node, rules 6 and 10): the agent holds no right to evict
// or to list pods, so a compromised agent cannot evict anything.
type managerDrain struct {
	r       *Reconciler
	task    string
	index   int
	key     string
	attempt int32
	// asked: the run's Running record already carries the request (a drain command's).
	asked bool
}

func (r *Reconciler) drainerFor(task *v1alpha1.NodeTask, i int) *managerDrain {
	cs := task.Status.Commands[i]
	return &managerDrain{r: r, task: task.Name, index: i, key: v1alpha1.DrainKey(cs.Name, cs.Attempt), attempt: cs.Attempt, asked: cs.Drain != nil}
}

// drainRequest is what the agent asks the manager with: its pod, which the drain spares.
func (r *Reconciler) drainRequest() *v1alpha1.DrainRequest {
	req := &v1alpha1.DrainRequest{}
	if r.AgentPod.Name != "" {
		req.AgentPod = r.AgentPod.String()
	}
	return req
}

// Drain asks (unless the Running record did), then waits for the outcome of this run in the
// task's cache; an outcome keyed to another run is not this one's.
func (m *managerDrain) Drain(ctx context.Context, _ *v1alpha1.DrainCommand, out io.Writer) (string, error) {
	if !m.asked {
		if err := m.ask(ctx); err != nil {
			return "", err
		}
	}
	every := m.r.Poll
	if every <= 0 {
		every = time.Second
	}
	for {
		task := &v1alpha1.NodeTask{}
		err := m.r.Client.Get(ctx, client.ObjectKey{Name: m.task}, task)
		if apierrors.IsNotFound(err) {
			return "", fmt.Errorf("task %s was deleted while its drain waited for the manager", m.task)
		}
		if err == nil {
			if o, ok := task.DrainAnswerFor(m.key); ok {
				if o.Log != "" {
					_, _ = fmt.Fprintln(out, o.Log)
				}
				if !o.Succeeded {
					return "", errors.New(o.Message)
				}
				return o.Message, nil
			}
		}
		if serr := clock.Sleep(ctx, every); serr != nil {
			return "", fmt.Errorf("waiting for the manager to drain for task %s (%s; is the manager running?): %w", m.task, m.key, serr)
		}
	}
}

// ask records the request on this run of the command, which the manager then drains for: one
// record of the agent's (recordRule) over the task as the API server holds it, written only while
// the run is still this one (never on a later run), and read again when a heartbeat got in between.
func (m *managerDrain) ask(ctx context.Context) error {
	for {
		var task *v1alpha1.NodeTask
		err := transient.Retry(ctx, func() error {
			var gerr error
			task, gerr = m.r.fresh(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: m.task}})
			return gerr
		})
		if err == nil && task == nil {
			err = fmt.Errorf("task %s was deleted", m.task)
		}
		if err == nil && !m.thisRun(task) {
			err = fmt.Errorf("command %d of task %s is no longer running as attempt %d", m.index, m.task, m.attempt)
		}
		if err == nil {
			obj := task.DeepCopy()
			obj.Status.Commands[m.index].Drain = m.r.drainRequest()
			err = transient.Retry(ctx, func() error {
				_, _, werr := statuswrite.Write(ctx, m.r.Client, recordRule, nil, statuswrite.Change{Orig: task, Obj: obj, Urgent: true})
				return werr
			})
			if errors.Is(err, statuswrite.ErrStale) && ctx.Err() == nil {
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("asking the manager to drain (%s): %w", m.key, err)
		}
		return nil
	}
}

// thisRun reports whether task's command is still in the run this drain is for.
func (m *managerDrain) thisRun(task *v1alpha1.NodeTask) bool {
	if m.index >= len(task.Status.Commands) {
		return false
	}
	cs := task.Status.Commands[m.index]
	return cs.Attempt == m.attempt && cs.Phase == v1alpha1.CommandRunning
}
