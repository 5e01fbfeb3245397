package nodeoperation

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/plan"
)

// fakeSilencer records the calls made to Alertmanager.
type fakeSilencer struct {
	calls []string
	next  int
	down  bool
}

func (f *fakeSilencer) Silence(_ context.Context, _, id string, matchers []string, _ string, until time.Time) (string, error) {
	if f.down {
		return "", errors.New("alertmanager unreachable")
	}
	if id == "" {
		f.next++
		id = fmt.Sprintf("new-%d", f.next)
		f.calls = append(f.calls, fmt.Sprintf("create %v until %s -> %s", matchers, until.UTC().Format(time.TimeOnly), id))
		return id, nil
	}
	f.calls = append(f.calls, fmt.Sprintf("extend %s until %s", id, until.UTC().Format(time.TimeOnly)))
	return id, nil
}

func (f *fakeSilencer) Expire(_ context.Context, _, id string) error {
	if f.down {
		return errors.New("alertmanager unreachable")
	}
	f.calls = append(f.calls, "expire "+id)
	return nil
}

// silenceScope is an operation of one group "g" over node n1 with a silencing alertmanager gate,
// recording silence id for n1 (none when id is ""), n1's task in phase.
func silenceScope(id string, started time.Time, phase v1alpha1.TaskPhase) *scope {
	gates := []v1alpha1.Gate{{Name: "am", Alertmanager: &v1alpha1.AlertmanagerGate{URL: "http://am", Silence: &v1alpha1.AlertmanagerSilence{
		Matchers: []string{"instance={{node}}"}, MaxDuration: &metav1.Duration{Duration: time.Hour}}}}}
	op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "op"}}
	if id != "" {
		op.Status.Silences = []v1alpha1.SilenceStatus{{Group: "g", Gate: "am", Node: "n1", ID: id, StartTime: metav1.NewTime(started)}}
	}
	s := &scope{op: op, in: input{
		groups: []plan.ResolvedGroup{{Group: v1alpha1.Group{Name: "g"}, Nodes: []string{"n1"}}},
		timing: []timing{{gates: gates}},
		tasks:  map[string]map[string]taskView{},
	}}
	if phase != "" {
		s.in.tasks["g"] = map[string]taskView{"n1": {Name: "op-g-n1", Node: "n1", Group: "g", Phase: phase}}
	}
	return s
}

// A restarted manager (a new Reconciler, nothing in memory) finds the silence recorded in status:
// it extends that silence rather than making a new one while the task runs, and expires that same
// silence once the task ended.
func TestRestartedManagerExtendsAndExpiresTheRecordedSilence(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	am := &fakeSilencer{}
	r := &Reconciler{Silences: am, SilenceLease: 10 * time.Minute, Now: func() time.Time { return now }}

	s := silenceScope("abc", now.Add(-5*time.Minute), v1alpha1.TaskRunning)
	r.holdSilences(context.Background(), s)
	want := []string{"extend abc until 12:10:00"}
	if fmt.Sprint(am.calls) != fmt.Sprint(want) {
		t.Fatalf("calls %q, want %q", am.calls, want)
	}
	if got := *s.in.silences; len(got) != 1 || got[0].ID != "abc" {
		t.Fatalf("recorded %+v, want silence abc kept", got)
	}

	// Not due again until half the lease has gone.
	now = now.Add(4 * time.Minute)
	r.holdSilences(context.Background(), silenceScope("abc", now.Add(-9*time.Minute), v1alpha1.TaskRunning))
	if len(am.calls) != 1 {
		t.Fatalf("extended again before half the lease passed: %q", am.calls)
	}
	now = now.Add(2 * time.Minute)
	r.holdSilences(context.Background(), silenceScope("abc", now.Add(-11*time.Minute), v1alpha1.TaskRunning))
	if last := am.calls[len(am.calls)-1]; last != "extend abc until 12:16:00" {
		t.Fatalf("calls %q: want abc extended to 12:16", am.calls)
	}

	// Never past its start plus maxDuration (1h): started 55 minutes ago, extended to 12:11.
	r2 := &Reconciler{Silences: am, SilenceLease: 10 * time.Minute, Now: func() time.Time { return now }}
	r2.holdSilences(context.Background(), silenceScope("abc", now.Add(-55*time.Minute), v1alpha1.TaskRunning))
	if last := am.calls[len(am.calls)-1]; last != "extend abc until 12:11:00" {
		t.Fatalf("calls %q: want abc extended only to its start plus maxDuration", am.calls)
	}

	// The task ended: a restarted manager expires the same silence and drops its record.
	r3 := &Reconciler{Silences: am, SilenceLease: 10 * time.Minute, Now: func() time.Time { return now }}
	s = silenceScope("abc", now.Add(-5*time.Minute), v1alpha1.TaskSucceeded)
	r3.holdSilences(context.Background(), s)
	if last := am.calls[len(am.calls)-1]; last != "expire abc" {
		t.Fatalf("calls %q: want abc expired", am.calls)
	}
	if got := *s.in.silences; len(got) != 0 {
		t.Fatalf("records after the expiry: %+v", got)
	}
	for _, c := range am.calls {
		if len(c) > 6 && c[:6] == "create" {
			t.Fatalf("a new silence was made instead of the recorded one: %q", am.calls)
		}
	}
}

// a gate that cannot be evaluated blocks (rule 14): an Alertmanager that cannot expire a silence
// keeps its record (to try again) and holds the gate.
func TestSafetyRule14_SilenceThatCannotBeExpiredHoldsTheGate(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	am := &fakeSilencer{down: true}
	r := &Reconciler{Silences: am, Now: func() time.Time { return now }}
	s := silenceScope("abc", now.Add(-time.Minute), v1alpha1.TaskSucceeded)
	r.holdSilences(context.Background(), s)
	if got := *s.in.silences; len(got) != 1 || got[0].ID != "abc" {
		t.Fatalf("records %+v: want abc kept to expire later", got)
	}
	if err := s.silenceErr[gateKey{"g", "am"}]; err == nil {
		t.Fatal("no error held against gate am")
	}
}
