package nodeprofile

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// recordingSilencer records the calls made to Alertmanager; down refuses them all.
type recordingSilencer struct {
	calls []string
	down  bool
}

func (f *recordingSilencer) Silence(_ context.Context, _, id string, matchers []string, _ string, until time.Time) (string, error) {
	if f.down {
		return "", errors.New("alertmanager unreachable")
	}
	if id == "" {
		id = fmt.Sprintf("new-%d", len(f.calls)+1)
		f.calls = append(f.calls, fmt.Sprintf("create %v until %s -> %s", matchers, until.UTC().Format(time.TimeOnly), id))
		return id, nil
	}
	f.calls = append(f.calls, fmt.Sprintf("extend %s until %s", id, until.UTC().Format(time.TimeOnly)))
	return id, nil
}

func (f *recordingSilencer) Expire(_ context.Context, _, id string) error {
	if f.down {
		return errors.New("alertmanager unreachable")
	}
	f.calls = append(f.calls, "expire "+id)
	return nil
}

// silenceScope is a profile with a silencing alertmanager gate over node n1, recording silence id
// for n1 (none when id is ""), n1's install in phase (none when phase is "").
func silenceScope(id string, started, now time.Time, phase v1alpha1.TaskPhase) *scope {
	p := &v1alpha1.NodeProfile{ObjectMeta: metav1.ObjectMeta{Name: "prof"}}
	p.Spec.Gates = []v1alpha1.Gate{{Name: "am", Alertmanager: &v1alpha1.AlertmanagerGate{URL: "http://am", Silence: &v1alpha1.AlertmanagerSilence{
		Matchers: []string{"instance={{node}}"}, MaxDuration: &metav1.Duration{Duration: time.Hour}}}}}
	if id != "" {
		p.Status.Silences = []v1alpha1.SilenceStatus{{Gate: "am", Node: "n1", ID: id, StartTime: metav1.NewTime(started)}}
	}
	s := &scope{profile: p, in: input{Now: now}}
	if phase != "" {
		s.in.Tasks = []TaskView{{Name: "prof-install-h-n1", Node: "n1", Action: ActionInstall, Hash: "h", Phase: phase}}
	}
	return s
}

// A restarted manager (a new Reconciler, nothing in memory) finds the silence recorded in the
// profile's status: it extends that silence rather than making a new one while the task runs,
// never past its start plus maxDuration, and expires that same silence once the task ended.
func TestRestartedManagerKeepsTheProfilesRecordedSilence(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	am := &recordingSilencer{}
	r := &Reconciler{Silences: am, SilenceLease: 10 * time.Minute}

	s := silenceScope("abc", now.Add(-5*time.Minute), now, v1alpha1.TaskRunning)
	r.holdSilences(context.Background(), s)
	if want := []string{"extend abc until 12:10:00"}; fmt.Sprint(am.calls) != fmt.Sprint(want) {
		t.Fatalf("calls %q, want %q", am.calls, want)
	}
	if got := *s.silences; len(got) != 1 || got[0].ID != "abc" || got[0].Group != "" {
		t.Fatalf("recorded %+v, want silence abc kept", got)
	}

	later := now.Add(55 * time.Minute)
	r2 := &Reconciler{Silences: am, SilenceLease: 10 * time.Minute}
	r2.holdSilences(context.Background(), silenceScope("abc", now, later, v1alpha1.TaskRunning))
	if last := am.calls[len(am.calls)-1]; last != "extend abc until 13:00:00" {
		t.Fatalf("calls %q: want abc extended only to its start plus maxDuration", am.calls)
	}

	r3 := &Reconciler{Silences: am, SilenceLease: 10 * time.Minute}
	s = silenceScope("abc", now, later, v1alpha1.TaskSucceeded)
	r3.holdSilences(context.Background(), s)
	if last := am.calls[len(am.calls)-1]; last != "expire abc" {
		t.Fatalf("calls %q: want abc expired", am.calls)
	}
	if got := *s.silences; len(got) != 0 {
		t.Fatalf("records after the expiry: %+v", got)
	}
	for _, c := range am.calls {
		if strings.HasPrefix(c, "create") {
			t.Fatalf("a new silence was made instead of the recorded one: %q", am.calls)
		}
	}
}

// a gate that cannot be evaluated blocks (rule 14): a silence Alertmanager cannot expire keeps its
// record, to be tried again, and holds its gate.
func TestSafetyRule14_ProfileSilenceThatCannotBeExpiredHoldsTheGate(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{Silences: &recordingSilencer{down: true}}
	s := silenceScope("abc", now.Add(-time.Minute), now, v1alpha1.TaskSucceeded)
	r.holdSilences(context.Background(), s)
	if got := *s.silences; len(got) != 1 || got[0].ID != "abc" {
		t.Fatalf("records %+v: want abc kept to expire later", got)
	}
	if s.silenceErr["am"] == nil {
		t.Fatal("no error held against gate am")
	}
}
