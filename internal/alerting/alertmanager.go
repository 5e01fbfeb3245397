package alerting

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Alertmanager is one Alertmanager (v2 API, Alertmanager 0.16 and later).
type Alertmanager struct {
	// URL is the server's base URL, prefix included: http://alertmanager:9093.
	URL string
	// Client makes the calls; nil is a client with a 30 s timeout.
	Client *http.Client
}

// startSkew is how far before this machine's now a new silence starts, so that a clock behind
// Alertmanager's does not leave it pending; Alertmanager moves a start in the past to its own now.
const startSkew = time.Minute

// Firing returns the active (not silenced, not inhibited) alerts matching all matchers
// ("name=value", "name!=v", "name=~re", "name!~re"), one line each: their labels, state and
// start. Alerts Alertmanager has not yet processed count as firing. No matcher means every
// active alert. Any failure is an error: the caller blocks (rule 14).
func (a Alertmanager) Firing(ctx context.Context, matchers []string) ([]string, error) {
	ms, err := ParseMatchers(matchers)
	if err != nil {
		return nil, fmt.Errorf("alertmanager: %w", err)
	}
	q := url.Values{
		"active":    {"true"},
		"silenced":  {"false"},
		"inhibited": {"false"},
		// An alert just posted is "unprocessed" until the dispatcher sees it: it may yet be
		// silenced, but until then it fires.
		"unprocessed": {"true"},
	}
	for _, m := range ms {
		q.Add("filter", m.String())
	}
	var alerts []struct {
		Labels   map[string]string `json:"labels"`
		StartsAt time.Time         `json:"startsAt"`
		Status   *struct {
			State string `json:"state"`
		} `json:"status"`
	}
	if err := a.endpoint().call(ctx, http.MethodGet, "api/v2/alerts", q, nil, func(body []byte) error {
		return decodeJSON(body, &alerts)
	}); err != nil {
		return nil, err
	}
	lines := make([]string, 0, len(alerts))
	for _, al := range alerts {
		state := "firing"
		if al.Status != nil && al.Status.State != "" {
			state = al.Status.State
		}
		lines = append(lines, fmt.Sprintf("%s %s since %s", seriesName(al.Labels), state, al.StartsAt.UTC().Format(time.RFC3339)))
	}
	slices.Sort(lines)
	return lines, nil
}

// gettableSilence is what GET /api/v2/silence/{id} answers, in the parts read here.
type gettableSilence struct {
	ID       string    `json:"id"`
	StartsAt time.Time `json:"startsAt"`
	EndsAt   time.Time `json:"endsAt"`
	Status   struct {
		State string `json:"state"`
	} `json:"status"`
}

// postableSilence is the body of POST /api/v2/silences.
type postableSilence struct {
	ID        string    `json:"id,omitempty"`
	Matchers  []Matcher `json:"matchers"`
	StartsAt  time.Time `json:"startsAt"`
	EndsAt    time.Time `json:"endsAt"`
	CreatedBy string    `json:"createdBy"`
	Comment   string    `json:"comment"`
}

// Silence creates (id "") or extends (id given) a silence over matchers ending at until, returning
// its id. Extending keeps the silence's start, so Alertmanager updates it in place and the id stays;
// a silence that has expired or that Alertmanager no longer knows is created again, under a new id,
// as is one whose matchers changed (Alertmanager expires the old one). The caller keeps the id returned.
func (a Alertmanager) Silence(ctx context.Context, id string, matchers []string, createdBy, comment string, until time.Time) (string, error) {
	ms, err := ParseMatchers(matchers)
	if err != nil {
		return "", fmt.Errorf("alertmanager: %w", err)
	}
	if len(ms) == 0 {
		return "", errors.New("alertmanager: a silence needs at least one matcher")
	}
	sil := postableSilence{Matchers: ms, StartsAt: time.Now().Add(-startSkew), EndsAt: until, CreatedBy: createdBy, Comment: comment}
	if id != "" {
		prev, found, err := a.silence(ctx, id)
		if err != nil {
			return "", err
		}
		if found && prev.Status.State != "expired" {
			sil.ID, sil.StartsAt = prev.ID, prev.StartsAt
		}
	}
	var created struct {
		SilenceID string `json:"silenceID"`
	}
	err = a.endpoint().call(ctx, http.MethodPost, "api/v2/silences", nil, sil, func(body []byte) error {
		if err := decodeJSON(body, &created); err != nil {
			return err
		}
		if created.SilenceID == "" {
			return errors.New("no silenceID")
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return created.SilenceID, nil
}

// silence reads one silence; found is false when Alertmanager answers that it does not know it.
func (a Alertmanager) silence(ctx context.Context, id string) (gettableSilence, bool, error) {
	var s gettableSilence
	err := a.endpoint().call(ctx, http.MethodGet, "api/v2/silence/"+url.PathEscape(id), nil, nil, func(body []byte) error {
		if err := decodeJSON(body, &s); err != nil {
			return err
		}
		if s.ID == "" {
			return errors.New("no id")
		}
		return nil
	})
	if silenceNotFound(err) {
		return s, false, nil
	}
	return s, err == nil, err
}

// Expire ends a silence now. A silence already expired, or one Alertmanager no longer knows
// (its storage was lost, or expired silences were collected), leaves nothing to expire: nil.
func (a Alertmanager) Expire(ctx context.Context, id string) error {
	if id == "" {
		return errors.New("alertmanager: expire: no silence id")
	}
	err := a.endpoint().call(ctx, http.MethodDelete, "api/v2/silence/"+url.PathEscape(id), nil, nil, nil)
	if silenceNotFound(err) {
		return nil
	}
	return err
}

// silenceNotFound tells Alertmanager's "silence not found" (a 404 from GET, a 500 from DELETE in
// 0.25) from other refusals, such as a wrong URL's 404 ("path ... was not found").
func silenceNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == Refused && strings.Contains(e.Detail, "silence not found")
}

func (a Alertmanager) endpoint() endpoint {
	return endpoint{service: "alertmanager", base: a.URL, client: a.Client}
}
