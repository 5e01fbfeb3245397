package skeleton

import (
	"context"
	"errors"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func after(d time.Duration) ctrl.Result { return ctrl.Result{RequeueAfter: d} }

func TestLowestNonZero(t *testing.T) {
	tests := []struct {
		in   []ctrl.Result
		want ctrl.Result
	}{
		{nil, ctrl.Result{}},
		{[]ctrl.Result{{}, {}}, ctrl.Result{}},
		{[]ctrl.Result{{}, after(time.Second)}, after(time.Second)},
		{[]ctrl.Result{after(time.Second), {}}, after(time.Second)},
		{[]ctrl.Result{after(time.Second), after(time.Millisecond), after(time.Minute)}, after(time.Millisecond)},
	}
	for _, tt := range tests {
		if got := LowestNonZero(tt.in...); got != tt.want {
			t.Errorf("LowestNonZero(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
	if got := Within(ctrl.Result{}, -time.Second); got != after(time.Millisecond) {
		t.Errorf("Within a passed deadline = %v, want at once", got)
	}
	if got := Within(after(time.Second), time.Minute); got != after(time.Second) {
		t.Errorf("Within = %v", got)
	}
}

func TestRunOrderAndStops(t *testing.T) {
	var steps []string
	failAt := ""
	step := func(name string) error {
		steps = append(steps, name)
		if name == failAt {
			return errors.New(name + " failed")
		}
		return nil
	}
	s := Steps[*int]{
		Observe:     func(context.Context, *int) error { return step("observe") },
		Decide:      func(*int) { _ = step("decide") },
		WriteStatus: func(context.Context, *int) (ctrl.Result, error) { return after(time.Second), step("status") },
		Act:         func(context.Context, *int) (ctrl.Result, error) { return after(time.Minute), step("act") },
	}
	for _, tt := range []struct {
		fail string
		want []string
		res  ctrl.Result
	}{
		{"", []string{"observe", "decide", "status", "act"}, after(time.Second)},
		{"observe", []string{"observe"}, ctrl.Result{}},
		{"status", []string{"observe", "decide", "status"}, ctrl.Result{}},
		{"act", []string{"observe", "decide", "status", "act"}, after(time.Second)},
	} {
		steps, failAt = nil, tt.fail
		res, err := Run(context.Background(), new(int), s)
		if !reflect.DeepEqual(steps, tt.want) || (err != nil) != (tt.fail != "") || res != tt.res {
			t.Errorf("failing at %q: ran %v, result %v, error %v", tt.fail, steps, res, err)
		}
	}
}

func TestWritesBoundedAndJoined(t *testing.T) {
	w := NewWrites(3)
	var running, peak atomic.Int32
	for i := range 20 {
		w.Go(func() error {
			n := running.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			time.Sleep(time.Millisecond)
			running.Add(-1)
			if i%7 == 0 {
				return errors.New("boom")
			}
			return nil
		})
	}
	err := w.Wait()
	if peak.Load() > 3 {
		t.Errorf("%d writes at once, limit 3", peak.Load())
	}
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) != 3 {
		t.Errorf("errors %v, want 3 joined", err)
	}
}

func TestNodeChanged(t *testing.T) {
	node := func(labels, annotations map[string]string, ready corev1.ConditionStatus) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels, Annotations: annotations},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}}}
	}
	base := node(map[string]string{"a": "1"}, map[string]string{"x": "1"}, corev1.ConditionTrue)
	heartbeat := base.DeepCopy()
	heartbeat.Status.Conditions[0].LastHeartbeatTime = metav1.Now()
	tests := []struct {
		name   string
		fields NodeFields
		new    *corev1.Node
		want   bool
	}{
		{"heartbeat", NodeLabels | NodeAnnotations | NodeReadiness, heartbeat, false},
		{"label", NodeLabels, node(map[string]string{"a": "2"}, base.Annotations, corev1.ConditionTrue), true},
		{"annotation, not watched", NodeLabels | NodeReadiness, node(base.Labels, map[string]string{"x": "2"}, corev1.ConditionTrue), false},
		{"annotation", NodeAnnotations, node(base.Labels, map[string]string{"x": "2"}, corev1.ConditionTrue), true},
		{"readiness", NodeReadiness, node(base.Labels, base.Annotations, corev1.ConditionFalse), true},
		{"readiness, not watched", NodeLabels, node(base.Labels, base.Annotations, corev1.ConditionFalse), false},
	}
	for _, tt := range tests {
		if got := NodeChanged(tt.fields).Update(event.UpdateEvent{ObjectOld: base, ObjectNew: tt.new}); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	if !NodeChanged(NodeLabels).Create(event.CreateEvent{Object: base}) || !NodeChanged(NodeLabels).Delete(event.DeleteEvent{Object: base}) {
		t.Error("node creates and deletes must pass")
	}
	kubelet := base.DeepCopy()
	kubelet.Status.NodeInfo.KubeletVersion = "v1.37.2"
	if NodeChanged(NodeLabels).Update(event.UpdateEvent{ObjectOld: base, ObjectNew: kubelet}) || !NodeChanged(NodeKubeletVersion).Update(event.UpdateEvent{ObjectOld: base, ObjectNew: kubelet}) {
		t.Error("a kubelet version change passes only with NodeKubeletVersion")
	}
	other := node(base.Labels, map[string]string{"x": "1", "y": "1"}, corev1.ConditionTrue)
	changed := node(base.Labels, map[string]string{"x": "2"}, corev1.ConditionTrue)
	if NodeChanged(NodeLabels, "x").Update(event.UpdateEvent{ObjectOld: base, ObjectNew: other}) || !NodeChanged(NodeLabels, "x").Update(event.UpdateEvent{ObjectOld: base, ObjectNew: changed}) {
		t.Error("an annotation key passes changes of its value only")
	}
	deleted := NodeDeleted()
	if deleted.Create(event.CreateEvent{Object: base}) || deleted.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: changed}) ||
		deleted.Generic(event.GenericEvent{Object: base}) || !deleted.Delete(event.DeleteEvent{Object: base}) {
		t.Error("NodeDeleted passes deletes only")
	}
}

func TestControllerUID(t *testing.T) {
	task := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{
		{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeProfile", UID: "p", Controller: ptr.To(false)},
		{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeOperation", UID: "o", Controller: ptr.To(true)},
	}}}
	if got := ControllerUID(task, "NodeOperation"); got != "o" {
		t.Errorf("controller UID %q", got)
	}
	if got := ControllerUID(task, "NodeProfile"); got != "" {
		t.Errorf("an owner that is not the controller: %q", got)
	}
	task.OwnerReferences[1].Name = "op"
	if ref := ControllerRef(task, "NodeOperation"); ref == nil || ref.Name != "op" || ControllerRef(task, "NodeProfile") != nil {
		t.Errorf("controller ref %+v", ref)
	}
}
