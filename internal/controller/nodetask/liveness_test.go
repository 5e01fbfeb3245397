package nodetask_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/testutil"
)

// runningTask creates a node and a task on it whose first command the (fake) agent recorded Running.
func runningTask(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	if err := cl.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	task := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelNode: name}},
		Spec:       v1alpha1.NodeTaskSpec{NodeName: name, Commands: []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}}},
	}
	if err := cl.Create(ctx, task); err != nil {
		t.Fatal(err)
	}
	if err := (testutil.FakeAgent{Client: cl}).Begin(ctx, name, 0); err != nil {
		t.Fatal(err)
	}
}

// Safety rule 9: a running task whose heartbeat stops gets AgentLost=True (reason AgentLost)
// after lostAfter; one whose heartbeat keeps being renewed does not. Once the agent is back and
// records a person's retry, the manager removes its mark.
func TestSafetyRule9_SilentAgentFailsItsTask(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runningTask(t, "alive-1")
	runningTask(t, "silent-1")
	go func() { // the alive agent's heartbeat, as the agent writes it
		for ctx.Err() == nil {
			ts, _ := metav1.NowMicro().MarshalJSON()
			patch := []byte(`{"status":{"agentHeartbeat":` + string(ts) + `}}`)
			_ = cl.Status().Patch(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "alive-1"}}, client.RawPatch(types.MergePatchType, patch))
			time.Sleep(lostAfter / 5)
		}
	}()
	testutil.Eventually(t, 30*time.Second, "the silent agent's task marked AgentLost", func() error {
		tk := get(t, "silent-1")
		if c := tk.Lost(); c == nil || c.Reason != v1alpha1.ReasonAgentLost || !strings.Contains(c.Message, "silent-1") {
			return fmt.Errorf("conditions %+v", tk.Status.Conditions)
		}
		if tk.EffectivePhase() != v1alpha1.TaskFailed {
			return fmt.Errorf("effective phase %s", tk.EffectivePhase())
		}
		return nil
	})
	// The alive task began before the silent one, so it too went longer than lostAfter since its start.
	if tk := get(t, "alive-1"); tk.Lost() != nil || tk.EffectivePhase() != v1alpha1.TaskRunning {
		t.Fatalf("a task whose heartbeat is renewed was marked: %+v", tk.Status)
	}

	// The agent is back: a person's retry, recorded by the agent, ends the mark.
	task := get(t, "silent-1")
	base := task.DeepCopy()
	task.Spec.RecoveryMode = v1alpha1.RecoveryRetry
	if err := cl.Patch(ctx, task, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	if err := (testutil.FakeAgent{Client: cl}).Recover(ctx, "silent-1"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the mark removed after the agent's recovery", func() error {
		tk := get(t, "silent-1")
		if tk.Lost() != nil || tk.Spec.RecoveryMode != "" || tk.EffectivePhase() != v1alpha1.TaskPending {
			return fmt.Errorf("spec %+v, status %+v", tk.Spec, tk.Status)
		}
		return nil
	})
}
