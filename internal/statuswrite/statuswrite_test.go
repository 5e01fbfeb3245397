package statuswrite

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// A status is written whole: every field of the new status, unchanged ones too (so a stored
// object lacking a struct never gets half of it), and null for every field gone.
func TestWholeStatusPatch(t *testing.T) {
	before := map[string]any{"phase": "Running", "nodes": map[string]any{"matched": 1.0, "failed": 0.0}, "completionTime": "x"}
	after := map[string]any{"phase": "Running", "nodes": map[string]any{"matched": 2.0}}
	want := map[string]any{"phase": "Running", "nodes": map[string]any{"matched": 2.0, "failed": nil}, "completionTime": nil}
	if got := whole(before, after); !reflect.DeepEqual(got, want) {
		t.Errorf("whole = %v, want %v", got, want)
	}
	if got := whole(nil, after); !reflect.DeepEqual(got, after) {
		t.Errorf("whole over nothing = %v, want %v", got, after)
	}
}

// One writer per field: a controller changing a condition another writer owns is refused before
// anything is written; its own conditions and the fields beside them are its to change.
func TestWriteStatusOwnedConditions(t *testing.T) {
	ct := &v1alpha1.ClusterTarget{ObjectMeta: metav1.ObjectMeta{Name: "cluster", ResourceVersion: "1"}}
	meta.SetStatusCondition(&ct.Status.Conditions, metav1.Condition{Type: "Theirs", Status: metav1.ConditionTrue, Reason: "R"})
	writes := 0
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(testScheme(t)).Build(), interceptor.Funcs{
		SubResourcePatch: func(context.Context, client.Client, string, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
			writes++
			return nil
		},
	})
	rule := Rule{Kind: "ClusterTarget", Owned: []string{"Mine"}}
	var throttle Throttle
	write := func(change func(*v1alpha1.ClusterTarget)) (Written, error) {
		obj := ct.DeepCopy()
		change(obj)
		got, _, err := Write(context.Background(), c, rule, &throttle, Change{Orig: ct, Obj: obj, Urgent: true, Now: time.Now()})
		return got, err
	}
	got, err := write(func(o *v1alpha1.ClusterTarget) { meta.RemoveStatusCondition(&o.Status.Conditions, "Theirs") })
	if err == nil || !strings.Contains(err.Error(), "condition Theirs") || writes != 0 {
		t.Errorf("clearing another writer's condition: %v, error %v, %d writes; want refused, none written", got, err, writes)
	}
	got, err = write(func(o *v1alpha1.ClusterTarget) {
		meta.SetStatusCondition(&o.Status.Conditions, metav1.Condition{Type: "Mine", Status: metav1.ConditionFalse, Reason: "R"})
	})
	if err != nil || got != Wrote || writes != 1 {
		t.Errorf("setting an owned condition: %v, error %v, %d writes; want written once", got, err, writes)
	}
	if got, err = write(func(*v1alpha1.ClusterTarget) {}); err != nil || got != Unchanged || writes != 1 {
		t.Errorf("no change: %v, error %v, %d writes; want nothing written", got, err, writes)
	}
}

// One writer per NodeTask status field (v1alpha1.NodeTaskStatus): the agent's patch never holds
// conditions and a change to them is refused before anything is written; the manager's holds
// conditions alone, and a change to any other field is refused. A sign (Changed) sends only what
// changed, so that a stale copy sets back nothing.
func TestWriteKeepsToTheWritersFields(t *testing.T) {
	task := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "t", ResourceVersion: "5"},
		Status: v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskRunning, Progress: "0/1", Message: "old"}}
	meta.SetStatusCondition(&task.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionAgentLost, Status: metav1.ConditionFalse, Reason: "R",
		LastTransitionTime: metav1.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
	var sent []string
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(testScheme(t)).Build(), interceptor.Funcs{
		SubResourcePatch: func(_ context.Context, _ client.Client, _ string, o client.Object, p client.Patch, _ ...client.SubResourcePatchOption) error {
			raw, err := p.Data(o)
			sent = append(sent, string(raw))
			return err
		},
	})
	agent := Rule{Kind: "NodeTask", Fields: AllButConditions, Lock: true}
	sign := Rule{Kind: "NodeTask", Fields: AllButConditions, Changed: true}
	manager := Rule{Kind: "NodeTask", Fields: ConditionsOnly, Owned: []string{v1alpha1.ConditionAgentLost}, Lock: true}
	for _, tc := range []struct {
		name   string
		rule   Rule
		change func(*v1alpha1.NodeTask)
		want   string // the patch sent, or the error's text
	}{
		{"the agent's record", agent, func(o *v1alpha1.NodeTask) { o.Status.Phase = v1alpha1.TaskSucceeded },
			`{"metadata":{"resourceVersion":"5"},"status":{"currentCommand":0,"message":"old","phase":"Succeeded","progress":"0/1"}}`},
		{"the agent changing a condition", agent, func(o *v1alpha1.NodeTask) { o.Status.Conditions = nil },
			"status.conditions is not this writer's to write"},
		{"the agent's sign", sign, func(o *v1alpha1.NodeTask) { o.Status.Message = "waiting" },
			`{"status":{"message":"waiting"}}`},
		{"the manager's condition", manager, func(o *v1alpha1.NodeTask) { o.Status.Conditions[0].Status = metav1.ConditionTrue },
			`{"metadata":{"resourceVersion":"5"},"status":{"conditions":[{"lastTransitionTime":"2026-01-01T00:00:00Z","message":"","reason":"R","status":"True","type":"AgentLost"}]}}`},
		{"the manager changing the phase", manager, func(o *v1alpha1.NodeTask) { o.Status.Phase = v1alpha1.TaskFailed },
			"status.phase is not this writer's to write"},
		{"the manager changing a condition it does not own", manager, func(o *v1alpha1.NodeTask) {
			meta.SetStatusCondition(&o.Status.Conditions, v1alpha1.DrainedCondition("k", v1alpha1.DrainOutcome{}, 1))
		}, "condition Drained is not this writer's to write"},
	} {
		sent = nil
		obj := task.DeepCopy()
		tc.change(obj)
		_, _, err := Write(context.Background(), c, tc.rule, nil, Change{Orig: task, Obj: obj, Urgent: true})
		got := strings.Join(sent, "; ")
		if err != nil {
			got = err.Error()
			if len(sent) > 0 {
				t.Errorf("%s: refused but wrote %v", tc.name, sent)
			}
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("%s: got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}

// changed sends what differs alone: objects field by field, lists whole, null for a field gone.
func TestChangedPatch(t *testing.T) {
	before := map[string]any{"phase": "Running", "nodes": map[string]any{"matched": 1.0, "failed": 0.0}, "list": []any{1.0}, "gone": "x"}
	after := map[string]any{"phase": "Running", "nodes": map[string]any{"matched": 2.0, "failed": 0.0}, "list": []any{1.0, 2.0}}
	want := map[string]any{"nodes": map[string]any{"matched": 2.0}, "list": []any{1.0, 2.0}, "gone": nil}
	if got := changed(before, after); !reflect.DeepEqual(got, want) {
		t.Errorf("changed = %v, want %v", got, want)
	}
}

func TestThrottle(t *testing.T) {
	var th Throttle
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if w := th.Wait("a", false, time.Second, now); w != 0 {
		t.Errorf("first write waits %v", w)
	}
	th.Wrote("a", now)
	if w := th.Wait("a", false, time.Second, now.Add(300*time.Millisecond)); w != 700*time.Millisecond {
		t.Errorf("count-only write waits %v, want 700ms", w)
	}
	if w := th.Wait("a", true, time.Second, now.Add(300*time.Millisecond)); w != 0 {
		t.Errorf("urgent write waits %v", w)
	}
	if w := th.Wait("b", false, time.Second, now); w != 0 {
		t.Errorf("another object waits %v", w)
	}
	if w := th.Wait("a", false, time.Second, now.Add(2*time.Second)); w != 0 {
		t.Errorf("write after the interval waits %v", w)
	}
	if w := th.Wait("a", false, 0, now); w != 0 {
		t.Errorf("no interval, yet waits %v", w)
	}
	th.Forget("a")
	if w := th.Wait("a", false, time.Second, now); w != 0 {
		t.Errorf("forgotten object waits %v", w)
	}
}
