package monitoring

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// PostAlert sends one alert to an Alertmanager as Prometheus does (POST /api/v2/alerts), firing
// from now until endsAt; an endsAt in the past resolves it. A zero endsAt lets Alertmanager choose
// (its resolve_timeout, five minutes).
func (s *Server) PostAlert(ctx context.Context, labels map[string]string, endsAt time.Time) error {
	alert := map[string]any{"labels": labels, "startsAt": time.Now().Add(-time.Minute)}
	if !endsAt.IsZero() {
		alert["endsAt"] = endsAt
	}
	body, err := json.Marshal([]any{alert})
	if err != nil {
		return err
	}
	return s.do(ctx, http.MethodPost, "/api/v2/alerts", bytes.NewReader(body), nil)
}

// Silences are the silences an Alertmanager holds, as GET /api/v2/silences answers.
func (s *Server) Silences(ctx context.Context) ([]Silence, error) {
	var out []Silence
	err := s.do(ctx, http.MethodGet, "/api/v2/silences", nil, &out)
	return out, err
}

// Silence is a silence as Alertmanager shows it.
type Silence struct {
	ID       string    `json:"id"`
	StartsAt time.Time `json:"startsAt"`
	EndsAt   time.Time `json:"endsAt"`
	Comment  string    `json:"comment"`
	Status   struct {
		// State is "active", "pending" or "expired".
		State string `json:"state"`
	} `json:"status"`
	Matchers []struct {
		Name    string `json:"name"`
		Value   string `json:"value"`
		IsRegex bool   `json:"isRegex"`
		IsEqual bool   `json:"isEqual"`
	} `json:"matchers"`
}

// SilenceByID is the silence with that id, or an error naming the ids there are.
func (s *Server) SilenceByID(ctx context.Context, id string) (Silence, error) {
	all, err := s.Silences(ctx)
	if err != nil {
		return Silence{}, err
	}
	var ids []string
	for _, sil := range all {
		if sil.ID == id {
			return sil, nil
		}
		ids = append(ids, sil.ID+" ("+sil.Status.State+")")
	}
	return Silence{}, fmt.Errorf("no silence %s among [%s]", id, strings.Join(ids, ", "))
}

// do sends one request to the server and decodes its JSON answer into out (unless nil).
func (s *Server) do(ctx context.Context, method, path string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, body)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s%s: HTTP %d: %s", method, s.URL, path, resp.StatusCode, bytes.TrimSpace(data))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// Target is a scrape target on loopback exposing one gauge, which a test sets.
type Target struct {
	// Addr is its host:port, for Prometheus' targets.
	Addr  string
	gauge prometheus.Gauge
}

// NewTarget serves a gauge named name (value 0) on a loopback port until the test ends.
func NewTarget(t testing.TB, name string) *Target {
	t.Helper()
	reg := prometheus.NewRegistry()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "A value the test sets."})
	reg.MustRegister(g)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return &Target{Addr: strings.TrimPrefix(srv.URL, "http://"), gauge: g}
}

// Set changes the gauge's value; Prometheus sees it at its next scrape.
func (tg *Target) Set(v float64) { tg.gauge.Set(v) }
