package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/hook"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// TestHooksOnLocalCluster is issue 27's hooks on nodeops-local, with the real Job controller:
// a preNode Job hook that fails (its pod fits no node, so its Job passes its deadline) blocks its
// node, which gets no task, until a person skips the hook; then an http hook at every point
// sends each transition's CloudEvent, signed, in order, to a receiver in this test that refuses
// every event's first two deliveries, and the receiver accepts each exactly once.
func TestHooksOnLocalCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	l := framework.StartLocal(t, "--control-planes=1", "--workers=2")
	l.WaitNodesReady(t, 3, 5*time.Minute)
	ctx := context.Background()
	t.Logf("cluster up in %s", time.Since(start).Round(time.Second))
	notCP := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "node-role.kubernetes.io/control-plane", Operator: metav1.LabelSelectorOpDoesNotExist}}}
	wait := []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}}

	// 1. A failing preNode Job hook.
	failing := v1alpha1.Hook{Name: "storage-ready", Timeout: &metav1.Duration{Duration: 5 * time.Minute}, Job: &v1alpha1.JobHook{Template: runtime.RawExtension{Raw: []byte(
		`{"spec":{"backoffLimit":0,"activeDeadlineSeconds":5,"template":{"spec":{"nodeSelector":{"nodeops.test/no-such-node":"x"},"containers":[{"name":"check","image":"registry.local/check:1"}]}}}}`)}}}
	op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "prehook"}, Spec: v1alpha1.NodeOperationSpec{NodeSelector: notCP, Custom: &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{
		{Name: "first", NodeFilter: v1alpha1.NodeFilterHead, Commands: wait, Scheduling: v1alpha1.Scheduling{Hooks: &v1alpha1.Hooks{PreNode: []v1alpha1.Hook{failing}}}},
		{Name: "rest", NodeFilter: v1alpha1.NodeFilterTail, Commands: wait},
	}}}}
	framework.Create(t, l, op)
	blocked := framework.WaitForOperation(t, l, framework.WaitForOperationInput{Name: op.Name, Phase: v1alpha1.OperationBlocked})
	c := meta.FindStatusCondition(blocked.Status.Conditions, v1alpha1.ConditionBlocked)
	if c == nil || c.Reason != nodeoperation.ReasonHookFailed || !strings.Contains(c.Message, "hook storage-ready (preNode, group first") || !strings.Contains(c.Message, "DeadlineExceeded") {
		t.Fatalf("blocked with %+v; want %s naming the hook and the Job's reason", c, nodeoperation.ReasonHookFailed)
	}
	if tasks := framework.OperationTasks(t, l, op.Name); len(tasks) != 0 {
		t.Fatalf("task %s exists though its node's preNode hook failed", tasks[0].Name)
	}
	t.Logf("blocked by the failed hook after %s: %s", time.Since(start).Round(time.Second), c.Message)
	l.MustKubectl(t, "annotate", "nodeoperation", op.Name, v1alpha1.AnnotationSkipHookPrefix+"storage-ready="+time.Now().UTC().Format(time.RFC3339Nano))
	framework.WaitForOperation(t, l, framework.WaitForOperationInput{Name: op.Name, Phase: v1alpha1.OperationSucceeded})

	// 2. CloudEvents to a receiver that fails twice.
	key := []byte("e2e-signing-key")
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: hook.Namespace, Name: v1alpha1.HookSigningSecret}, Data: map[string][]byte{"e2e": key}}
	if err := l.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	rc := &cloudEventReceiver{key: key}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	h := []v1alpha1.Hook{{Name: "notify", HTTP: &v1alpha1.HTTPHook{URL: srv.URL, SigningKey: "e2e"}}}
	notified := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "notified"}, Spec: v1alpha1.NodeOperationSpec{NodeSelector: notCP,
		Scheduling: v1alpha1.Scheduling{Hooks: &v1alpha1.Hooks{PreOperation: h, PreNode: h, PostNode: h, PostOperation: h}},
		Custom:     &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{{Name: "all", Commands: wait}}}}}
	framework.RunOperation(t, l, notified, v1alpha1.OperationSucceeded)
	var workers corev1.NodeList
	if err := l.Client.List(ctx, &workers); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range workers.Items {
		if _, cp := n.Labels["node-role.kubernetes.io/control-plane"]; !cp {
			names = append(names, n.Name)
		}
	}
	want := []string{hook.TypeOperationStarted + " notified"}
	for _, n := range names { // listed sorted by name, the order nodes start in
		want = append(want, hook.TypeNodeStarted+" "+n, hook.TypeNodeSucceeded+" "+n)
	}
	want = append(want, hook.TypeOperationSucceeded+" notified")
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.bad) > 0 {
		t.Fatalf("deliveries with a bad signature or body: %v", rc.bad)
	}
	var got []string
	for _, ev := range rc.accepted {
		got = append(got, ev.Type+" "+ev.Subject)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("the receiver accepted, in order:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for id, n := range rc.tries {
		if n != 3 {
			t.Errorf("event %s reached the receiver %d times, want 3 (two refused, then accepted once)", id, n)
		}
	}
	// Each run's success is a Kubernetes Event too. client-go's events.k8s.io recorder folds events
	// with the same type, reason, action and object into one series whatever their note
	// (tools/events' eventKey has no note), so how many Event objects appear is client-go's choice;
	// the exact per-run record is the receiver's list above. Every HookSucceeded Event names one of
	// the operation's runs, and at least the first appears.
	runs := map[string]bool{"preOperation": true, "postOperation": true}
	for _, n := range names {
		runs["preNode, group all, node "+n] = true
		runs["postNode, group all, node "+n] = true
	}
	testutil.EventuallyEvery(t, time.Minute, framework.PollInterval, "HookSucceeded events of notified", func(ctx context.Context) error {
		var events corev1.EventList
		if err := l.Client.List(ctx, &events, client.InNamespace("default")); err != nil {
			return err
		}
		n := 0
		for _, e := range events.Items {
			if e.InvolvedObject.Name != notified.Name || e.Reason != "HookSucceeded" {
				continue
			}
			n++
			w, _, ok := strings.Cut(strings.TrimPrefix(e.Message, "hooks ("), ") succeeded")
			if !ok || !runs[w] {
				t.Fatalf("a HookSucceeded Event names no run of the operation: %q", e.Message)
			}
		}
		if n == 0 {
			return fmt.Errorf("no HookSucceeded event yet")
		}
		return nil
	})
	t.Logf("each of %d events accepted once after two refusals, %s in all", len(got), time.Since(start).Round(time.Second))
}

// cloudEventReceiver accepts signed CloudEvents, refusing each id's first two deliveries.
type cloudEventReceiver struct {
	key      []byte
	mu       sync.Mutex
	tries    map[string]int
	accepted []hook.Event
	bad      []string
}

func (rc *cloudEventReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var ev hook.Event
	if err := json.Unmarshal(body, &ev); err != nil || !hook.Verify(rc.key, body, r.Header.Get(hook.Header)) {
		rc.bad = append(rc.bad, fmt.Sprintf("%s %s", r.Header.Get(hook.Header), body))
		http.Error(w, "bad", http.StatusUnauthorized)
		return
	}
	if rc.tries == nil {
		rc.tries = map[string]int{}
	}
	rc.tries[ev.ID]++
	if rc.tries[ev.ID] <= 2 {
		http.Error(w, "not now", http.StatusServiceUnavailable)
		return
	}
	rc.accepted = append(rc.accepted, ev)
}
