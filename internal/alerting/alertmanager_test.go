package alerting_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nodeops/nodeops/internal/alerting"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/internal/testutil/monitoring"
)

// wait bounds each wait on a real server's answer; they come within a second or two on an idle machine.
const wait = 60 * time.Second

// firingIs waits until Firing(matchers) returns exactly n lines, each containing want.
func firingIs(t *testing.T, am alerting.Alertmanager, matchers []string, n int, want string) {
	t.Helper()
	testutil.EventuallyEvery(t, wait, 100*time.Millisecond, fmt.Sprintf("Firing(%q) returns %d alert(s)", matchers, n), func(ctx context.Context) error {
		lines, err := am.Firing(ctx, matchers)
		if err != nil {
			return err
		}
		if len(lines) != n {
			return fmt.Errorf("got %d: %q", len(lines), lines)
		}
		for _, l := range lines {
			if !strings.Contains(l, want) {
				return fmt.Errorf("%q does not contain %q", l, want)
			}
		}
		return nil
	})
}

func TestFiringReturnsPostedAlertsUntilResolvedOrSilenced(t *testing.T) {
	server := monitoring.Alertmanager(t)
	am := alerting.Alertmanager{URL: server.URL}
	ctx := t.Context()
	later := time.Now().Add(time.Hour)

	// Nothing posted yet: none, and no error.
	firingIs(t, am, []string{"alertname=NodeopsTest"}, 0, "")

	resolved := map[string]string{"alertname": "NodeopsTest", "node": "worker-1", "severity": "critical"}
	if err := server.PostAlert(ctx, resolved, later); err != nil {
		t.Fatal(err)
	}
	firingIs(t, am, []string{"alertname=NodeopsTest", "node=worker-1"}, 1, `{alertname="NodeopsTest", node="worker-1", severity="critical"}`)
	// Every matcher form selects as Alertmanager does, regexes anchored.
	firingIs(t, am, []string{"node=~worker-.*", `severity!="warning"`}, 1, `node="worker-1"`)
	firingIs(t, am, []string{"node=~worker"}, 0, "")
	firingIs(t, am, []string{"node!~worker-.*"}, 0, "")
	firingIs(t, am, []string{"node=worker-2"}, 0, "")

	// endsAt in the past resolves it.
	if err := server.PostAlert(ctx, resolved, time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	firingIs(t, am, []string{"alertname=NodeopsTest"}, 0, "")

	silenced := map[string]string{"alertname": "NodeopsTest", "node": "worker-3"}
	if err := server.PostAlert(ctx, silenced, later); err != nil {
		t.Fatal(err)
	}
	firingIs(t, am, []string{"alertname=NodeopsTest"}, 1, `node="worker-3"`)
	id, err := am.Silence(ctx, "", []string{"node=worker-3"}, "alerting test", "silenced alerts do not fire", later)
	if err != nil {
		t.Fatal(err)
	}
	firingIs(t, am, []string{"alertname=NodeopsTest"}, 0, "")
	// The silence, not the alert's end, is what hid it: expired, the alert fires again.
	if err := am.Expire(ctx, id); err != nil {
		t.Fatal(err)
	}
	firingIs(t, am, []string{"alertname=NodeopsTest"}, 1, `node="worker-3"`)
}

func TestSilenceCreatesExtendsAndExpires(t *testing.T) {
	server := monitoring.Alertmanager(t)
	am := alerting.Alertmanager{URL: server.URL}
	ctx := t.Context()
	matchers := []string{"node=worker-1", "alertname=~Node.*"}

	until := time.Now().Add(10 * time.Minute)
	id, err := am.Silence(ctx, "", matchers, "nodeops", "worker-1 is being upgraded", until)
	if err != nil {
		t.Fatal(err)
	}
	created := silenceIs(t, server, id, "active")
	if d := created.EndsAt.Sub(until).Abs(); d > time.Millisecond {
		t.Errorf("created silence ends at %s, want %s", created.EndsAt, until)
	}
	if created.Comment != "worker-1 is being upgraded" || len(created.Matchers) != 2 ||
		!created.Matchers[1].IsRegex || created.Matchers[1].Value != "Node.*" {
		t.Errorf("created silence is %+v", created)
	}

	later := until.Add(10 * time.Minute)
	extended, err := am.Silence(ctx, id, matchers, "nodeops", "worker-1 is being upgraded", later)
	if err != nil {
		t.Fatal(err)
	}
	if extended != id {
		t.Fatalf("extending silence %s returned another id, %s", id, extended)
	}
	got := silenceIs(t, server, id, "active")
	if !got.EndsAt.After(created.EndsAt) || got.EndsAt.Sub(later).Abs() > time.Millisecond {
		t.Errorf("extended silence ends at %s, want %s", got.EndsAt, later)
	}
	if !got.StartsAt.Equal(created.StartsAt) {
		t.Errorf("extending moved the start from %s to %s", created.StartsAt, got.StartsAt)
	}

	if err := am.Expire(ctx, id); err != nil {
		t.Fatal(err)
	}
	silenceIs(t, server, id, "expired")
	// Expiring again, or a silence Alertmanager never had, leaves nothing to do.
	if err := am.Expire(ctx, id); err != nil {
		t.Errorf("expire an expired silence: %v", err)
	}
	if err := am.Expire(ctx, "0b9a4c52-2d5c-4c1e-9a57-6e3f7b1d2c44"); err != nil {
		t.Errorf("expire an unknown silence: %v", err)
	}

	// Extending an expired silence makes a new one: the node is still being worked on.
	again, err := am.Silence(ctx, id, matchers, "nodeops", "worker-1 is being upgraded", later)
	if err != nil {
		t.Fatal(err)
	}
	if again == id {
		t.Fatalf("extending expired silence %s returned the same id", id)
	}
	silenceIs(t, server, again, "active")
	silenceIs(t, server, id, "expired")
}

// silenceIs reads silence id from Alertmanager's list and checks its state.
func silenceIs(t *testing.T, server *monitoring.Server, id, state string) monitoring.Silence {
	t.Helper()
	s, err := server.SilenceByID(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if s.Status.State != state {
		t.Fatalf("silence %s is %s, want %s", id, s.Status.State, state)
	}
	return s
}

func TestParseMatcher(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		wantErr  string
	}{
		{in: "node=worker-1", want: `node="worker-1"`},
		{in: "node != worker-1", want: `node!="worker-1"`},
		{in: "node=~worker-.*", want: `node=~"worker-.*"`},
		{in: "node!~worker-.*", want: `node!~"worker-.*"`},
		{in: `summary="a \"b\" = c"`, want: `summary="a \"b\" = c"`},
		{in: `path=C:\dir`, want: `path="C:\\dir"`},
		{in: "node=", want: `node=""`},
		{in: "node", wantErr: "want name=value"},
		{in: "=worker", wantErr: "not a label name"},
		{in: "1node=worker", wantErr: "not a label name"},
		{in: "node~worker", wantErr: "want name=value"},
		{in: "node=~(", wantErr: "missing closing )"},
	} {
		m, err := alerting.ParseMatcher(tc.in)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseMatcher(%q) = %v, %v; want an error containing %q", tc.in, m, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("ParseMatcher(%q): %v", tc.in, err)
		case m.String() != tc.want:
			t.Errorf("ParseMatcher(%q) = %s, want %s", tc.in, m, tc.want)
		}
	}
	if _, err := alerting.ParseMatchers([]string{"a=b", "bad"}); err == nil || !strings.Contains(err.Error(), `"bad"`) {
		t.Errorf("ParseMatchers with a bad matcher: %v", err)
	}
}
