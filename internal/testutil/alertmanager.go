package testutil

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// FakeAlertmanager is an Alertmanager's v2 silences API (and an alerts list that is always
// empty), in memory, for the controllers' silence tests.
type FakeAlertmanager struct {
	*httptest.Server
	mu       sync.Mutex
	silences map[string]*fakeSilence
	n        int
	refuse   bool
}

type fakeSilence struct {
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

// NewFakeAlertmanager serves a FakeAlertmanager until the test ends.
func NewFakeAlertmanager(t testing.TB) *FakeAlertmanager {
	am := &FakeAlertmanager{silences: map[string]*fakeSilence{}}
	am.Server = httptest.NewServer(http.HandlerFunc(am.serve))
	t.Cleanup(am.Close)
	return am
}

// Refuse has every silence call answered with 503 (refuse true) or served again.
func (am *FakeAlertmanager) Refuse(refuse bool) {
	am.mu.Lock()
	defer am.mu.Unlock()
	am.refuse = refuse
}

func (am *FakeAlertmanager) serve(w http.ResponseWriter, r *http.Request) {
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
		var s fakeSilence
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

// States are the silences' ids and states, with their first matcher: "active instance=n1".
func (am *FakeAlertmanager) States() map[string]string {
	am.mu.Lock()
	defer am.mu.Unlock()
	out := map[string]string{}
	for id, s := range am.silences {
		out[id] = s.Status.State + " " + s.Matchers[0].Name + "=" + s.Matchers[0].Value
	}
	return out
}
