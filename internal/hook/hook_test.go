package hook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// The signature is the hex HMAC-SHA256 of the exact body under the key, as a receiver computes it
// with nothing but a standard library.
func TestSignIsHMACSHA256OfTheBody(t *testing.T) {
	key, body := []byte("k3y"), []byte(`{"specversion":"1.0"}`)
	m := hmac.New(sha256.New, key)
	m.Write(body)
	want := "sha256=" + hex.EncodeToString(m.Sum(nil))
	if got := Sign(key, body); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	if !Verify(key, body, want) {
		t.Fatal("Verify refused its own signature")
	}
	for _, bad := range []struct {
		key, body []byte
	}{{[]byte("other"), body}, {key, []byte(`{"specversion":"1.1"}`)}} {
		if Verify(bad.key, bad.body, want) {
			t.Errorf("Verify accepted %q under %q", bad.body, bad.key)
		}
	}
}

func TestBackoffDoublesUpToAMinute(t *testing.T) {
	want := []time.Duration{0, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute, time.Minute}
	for n, w := range want {
		if got := Backoff(n); got != w {
			t.Errorf("Backoff(%d) = %s, want %s", n, got, w)
		}
	}
	if got := Backoff(1000); got != time.Minute {
		t.Errorf("Backoff(1000) = %s", got)
	}
}

func testOp() *v1alpha1.NodeOperation {
	return &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "op", UID: "uid-1"}}
}

// An event's id depends on the operation and the transition only: the same on every retry and
// at every receiver, different for every other transition.
func TestEventIDIsStablePerTransition(t *testing.T) {
	op := testOp()
	k := Key{Point: v1alpha1.HookPostNode, Group: "g", Node: "n1", Outcome: OutcomeSucceeded}
	a := NewEvent(op, k, "one", time.Unix(1, 0), "")
	b := NewEvent(op, k, "two", time.Unix(2, 0), "")
	if a.ID != b.ID || a.Type != TypeNodeSucceeded || a.Subject != "n1" {
		t.Fatalf("events %+v and %+v", a, b)
	}
	seen := map[string]Key{}
	for _, k := range []Key{
		{Point: v1alpha1.HookPreOperation}, {Point: v1alpha1.HookPostOperation},
		{Point: v1alpha1.HookPreNode, Group: "g", Node: "n1"}, {Point: v1alpha1.HookPreNode, Group: "g", Node: "n2"},
		{Point: v1alpha1.HookPostNode, Group: "g", Node: "n1", Outcome: OutcomeSucceeded},
		{Point: v1alpha1.HookPostNode, Group: "g", Node: "n1", Outcome: OutcomeFailed},
		{Point: v1alpha1.HookPreNode, Group: "h", Node: "n1"},
	} {
		id := NewEvent(op, k, "h", time.Unix(0, 0), "").ID
		if other, dup := seen[id]; dup {
			t.Errorf("%+v and %+v share id %s", k, other, id)
		}
		seen[id] = k
	}
	other := testOp()
	other.UID = "uid-2"
	if NewEvent(other, k, "one", time.Unix(1, 0), "").ID == a.ID {
		t.Error("two operations share an event id")
	}
}

// A receiver that refuses twice gets the event three times with one id and one body signature
// scheme; the sender waits out its back-off between attempts and, once delivered, never sends it again.
func TestSenderRetriesWithBackoffAndDeliversOnce(t *testing.T) {
	key := []byte("k")
	var mu sync.Mutex
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if !Verify(key, body, r.Header.Get(Header)) || r.Header.Get("Content-Type") != ContentType {
			http.Error(w, "unsigned", http.StatusUnauthorized)
			return
		}
		bodies = append(bodies, string(body))
		if len(bodies) <= 2 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	s := &Sender{HTTP: srv.Client()}
	ev := NewEvent(testOp(), Key{Point: v1alpha1.HookPreOperation}, "h", time.Unix(5, 0), "")
	now := time.Unix(100, 0)
	ctx := context.Background()

	out := s.Deliver(ctx, srv.URL, key, ev, now)
	if out.Delivered || !out.Due.Equal(now.Add(time.Second)) || !strings.Contains(out.Message, "503") {
		t.Fatalf("first attempt: %+v", out)
	}
	if again := s.Deliver(ctx, srv.URL, key, ev, now.Add(500*time.Millisecond)); again.Delivered || len(bodies) != 1 {
		t.Fatalf("sent before its back-off ran out: %+v, %d bodies", again, len(bodies))
	}
	out = s.Deliver(ctx, srv.URL, key, ev, now.Add(time.Second))
	if out.Delivered || !out.Due.Equal(now.Add(3*time.Second)) {
		t.Fatalf("second attempt: %+v", out)
	}
	if out = s.Deliver(ctx, srv.URL, key, ev, now.Add(3*time.Second)); !out.Delivered {
		t.Fatalf("third attempt: %+v", out)
	}
	if out = s.Deliver(ctx, srv.URL, key, ev, now.Add(time.Hour)); !out.Delivered || len(bodies) != 3 {
		t.Fatalf("a delivered event went again: %+v, %d bodies", out, len(bodies))
	}
	for _, b := range bodies {
		var got map[string]any
		if err := json.Unmarshal([]byte(b), &got); err != nil {
			t.Fatal(err)
		}
		for _, attr := range []string{"specversion", "id", "source", "type", "time", "subject", "data"} {
			if _, ok := got[attr]; !ok {
				t.Errorf("body lacks %s: %s", attr, b)
			}
		}
		if got["id"] != ev.ID {
			t.Errorf("id %v on a retry, want %s", got["id"], ev.ID)
		}
	}
}

func TestJobNameIsShortAndDeterministic(t *testing.T) {
	long := strings.Repeat("operation", 20)
	k := Key{Point: v1alpha1.HookPreNode, Group: "workers", Node: strings.Repeat("node", 60)}
	a, b := JobName(long, k, "check", 1), JobName(long, k, "check", 1)
	if a != b {
		t.Fatalf("%s != %s", a, b)
	}
	if errs := validation.IsDNS1123Label(a); len(errs) > 0 {
		t.Fatalf("%s: %v", a, errs)
	}
	if JobName(long, k, "check", 2) == a {
		t.Fatal("a retry reuses the Job name")
	}
}

func TestTemplateIsDecodedStrictly(t *testing.T) {
	for _, tc := range []struct{ raw, err string }{
		{`{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"busybox"}]}}}}`, ""},
		{`{"spec":{"template":{"spec":{"containerz":[]}}}}`, "unknown field"},
		{`{"spec":{"template":{"spec":{}}}}`, "needs a container"},
	} {
		_, err := Template(&v1alpha1.JobHook{Template: runtime.RawExtension{Raw: []byte(tc.raw)}})
		if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.raw, err, tc.err)
		}
	}
}

func TestBuildJobOwnedLabelledAndTold(t *testing.T) {
	op := testOp()
	h := &v1alpha1.Hook{Name: "check", Job: &v1alpha1.JobHook{Template: runtime.RawExtension{Raw: []byte(
		`{"metadata":{"labels":{"team":"a"}},"spec":{"template":{"spec":{"containers":[{"name":"c","image":"busybox"}]}}}}`)}}}
	k := Key{Point: v1alpha1.HookPreNode, Group: "g", Node: "n1"}
	j, err := BuildJob(op, k, h, 1)
	if err != nil {
		t.Fatal(err)
	}
	if j.Namespace != Namespace || j.Labels["team"] != "a" || j.Labels[v1alpha1.LabelHook] != "check" || j.Labels[v1alpha1.LabelNode] != "n1" ||
		j.Labels[v1alpha1.LabelOperation] != "op" || !metav1.IsControlledBy(j, op) || j.Spec.Template.Spec.RestartPolicy != "Never" {
		t.Fatalf("job %+v", j.ObjectMeta)
	}
	env := map[string]string{}
	for _, e := range j.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env["NODEOPS_NODE"] != "n1" || env["NODEOPS_HOOK_POINT"] != "PreNode" || env["NODEOPS_OPERATION"] != "op" {
		t.Fatalf("env %v", env)
	}
}
