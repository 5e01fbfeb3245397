package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
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

// ask records the request on this run of the command, which the manager then drains for. A JSON
// patch that first tests the run is still this one: it never conflicts with the heartbeat, and
// never lands on a later run.
func (m *managerDrain) ask(ctx context.Context) error {
	req, err := json.Marshal(m.r.drainRequest())
	if err != nil {
		return err
	}
	patch := fmt.Sprintf(`[{"op":"test","path":"/status/commands/%d/attempt","value":%d},`+
		`{"op":"test","path":"/status/commands/%d/phase","value":%q},`+
		`{"op":"add","path":"/status/commands/%d/drain","value":%s}]`,
		m.index, m.attempt, m.index, v1alpha1.CommandRunning, m.index, req)
	obj := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: m.task}}
	err = transient.Retry(ctx, func() error {
		return m.r.Client.Status().Patch(ctx, obj, client.RawPatch(types.JSONPatchType, []byte(patch)))
	})
	if err != nil {
		return fmt.Errorf("asking the manager to drain (%s): %w", m.key, err)
	}
	return nil
}
