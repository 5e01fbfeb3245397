package nodeoperation_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/testutil"
)

// fakeAM is an Alertmanager's v2 silences API (and an alerts list that is always empty), in memory.
type fakeAM struct {
	*httptest.Server
	mu       sync.Mutex
	silences map[string]*amSilence
	n        int
	// refuse answers every silence call with 503.
	refuse bool
}

type amSilence struct {
	ID       string `json:"id"`
	Matchers []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"matchers"`
	StartsAt time.Time `json:"startsAt"`
	EndsAt   time.Time `json:"endsAt"`
	Comment  string    `json:"comment"`
	Status   struct {
		State string `json:"state"`
	} `json:"status"`
}

func newFakeAM(t *testing.T) *fakeAM {
	am := &fakeAM{silences: map[string]*amSilence{}}
	am.Server = httptest.NewServer(http.HandlerFunc(am.serve))
	t.Cleanup(am.Close)
	return am
}

func (am *fakeAM) serve(w http.ResponseWriter, r *http.Request) {
	am.mu.Lock()
	defer am.mu.Unlock()
	if r.URL.Path == "/api/v2/alerts" {
		_, _ = w.Write([]byte("[]"))
		return
	}
	if am.refuse {
		http.Error(w, `"down for the test"`, http.StatusServiceUnavailable)
		return
	}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/api/v2/silences":
		var s amSilence
		if err := json.NewDecoder(r.Body).Decode(&s); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if s.ID == "" {
			am.n++
			s.ID = fmt.Sprintf("sil-%d", am.n)
		}
		s.Status.State = "active"
		am.silences[s.ID] = &s
		_ = json.NewEncoder(w).Encode(map[string]string{"silenceID": s.ID})
	case strings.HasPrefix(r.URL.Path, "/api/v2/silence/"):
		s, ok := am.silences[strings.TrimPrefix(r.URL.Path, "/api/v2/silence/")]
		if !ok {
			http.Error(w, `"silence not found"`, http.StatusNotFound)
			return
		}
		if r.Method == http.MethodDelete {
			s.Status.State = "expired"
			return
		}
		_ = json.NewEncoder(w).Encode(s)
	default:
		http.NotFound(w, r)
	}
}

// states are the silences' ids and states, with their first matcher.
func (am *fakeAM) states() map[string]string {
	am.mu.Lock()
	defer am.mu.Unlock()
	out := map[string]string{}
	for id, s := range am.silences {
		out[id] = s.Status.State + " " + s.Matchers[0].Name + "=" + s.Matchers[0].Value
	}
	return out
}

// Each node gets a silence before its task exists, recorded in status; it is expired once the
// node's task ended, before the next node starts; the finished operation records none.
func TestAlertmanagerSilenceHeldWhileTheNodeIsWorkedOn(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "n1", "n2")
	am := newFakeAM(t)
	op := f.operation("silence", func(o *v1alpha1.NodeOperation) {
		o.Spec.Gates = []v1alpha1.Gate{{Name: "am", Alertmanager: &v1alpha1.AlertmanagerGate{URL: am.URL,
			Silence: &v1alpha1.AlertmanagerSilence{Matchers: []string{"instance={{node}}"}, MaxDuration: &metav1.Duration{Duration: time.Hour}}}}}
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a")}})

	for i, node := range nodes {
		task := f.waitTasks(op.Name, i+1)[i]
		if task.Spec.NodeName != node {
			t.Fatalf("task %d on %s, want %s", i, task.Spec.NodeName, node)
		}
		got := f.get(op.Name)
		if len(got.Status.Silences) != 1 || got.Status.Silences[0].Node != node || got.Status.Silences[0].ID == "" {
			t.Fatalf("status.silences while %s is worked on: %+v", node, got.Status.Silences)
		}
		id := got.Status.Silences[0].ID
		if s := am.states()[id]; s != "active instance="+node {
			t.Fatalf("silence %s while %s is worked on: %q", id, node, s)
		}
		f.runAll(task.Name)
		testutil.Eventually(t, 20*time.Second, "silence "+id+" expired", func() error {
			if s := am.states()[id]; !strings.HasPrefix(s, "expired") {
				return fmt.Errorf("silence %s: %s", id, s)
			}
			return nil
		})
	}
	got := f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	if len(got.Status.Silences) != 0 {
		t.Errorf("status.silences of the finished operation: %+v", got.Status.Silences)
	}
	if st := am.states(); len(st) != 2 {
		t.Errorf("silences made: %v, want one per node", st)
	}
}

// a gate that cannot be evaluated blocks (rule 14): an Alertmanager that refuses the silence of
// the node about to start holds the gate with the reason, then blocks; no task is created.
func TestSafetyRule14_UnreachableAlertmanagerSilenceBlocks(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1")
	am := newFakeAM(t)
	am.refuse = true
	op := f.operation("silencedown", func(o *v1alpha1.NodeOperation) {
		o.Spec.Gates = []v1alpha1.Gate{{Name: "am", Timeout: seconds(3), Alertmanager: &v1alpha1.AlertmanagerGate{URL: am.URL,
			Silence: &v1alpha1.AlertmanagerSilence{Matchers: []string{"instance={{node}}"}}}}}
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{script("a")}})
	got := f.waitReason(op.Name, v1alpha1.ConditionProgressing, nodeoperation.ReasonWaitingForGate)
	if c := condition(got, v1alpha1.ConditionProgressing); !strings.Contains(c.Message, "cannot create the silence for node") {
		t.Errorf("message: %s", c.Message)
	}
	got = f.waitReason(op.Name, v1alpha1.ConditionBlocked, nodeoperation.ReasonGateTimedOut)
	if c := condition(got, v1alpha1.ConditionBlocked); !strings.Contains(c.Message, "cannot create the silence") {
		t.Errorf("Blocked message: %s", c.Message)
	}
	if tasks := f.tasks(op.Name); len(tasks) != 0 {
		t.Errorf("%d tasks created without their node's silence", len(tasks))
	}
}
