// Package silence holds the Alertmanager silences of alertmanager gates that ask for one, for
// NodeOperations and NodeProfiles alike: a silence is created for a node before its task starts,
// extended a lease at a time while the task runs, never past its start plus maxDuration, and
// expired once the task ended. The records (v1alpha1.SilenceStatus) live in the owner's status, so
// that a restarted manager extends and expires the silence it finds rather than making another.
//
// It owns the talk to Alertmanager and the lease arithmetic; which nodes are worked on, and the
// status that records the silences, stay the callers'. It writes nothing to the API server.
package silence

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/alerting"
)

// Silencer creates, extends and expires Alertmanager silences; HTTP does it over HTTP.
type Silencer interface {
	// Silence creates (id "") or extends (id given) a silence ending at until and returns its id,
	// a new one when the old could not be extended.
	Silence(ctx context.Context, url, id string, matchers []string, comment string, until time.Time) (string, error)
	// Expire ends a silence; one already gone is no error.
	Expire(ctx context.Context, url, id string) error
}

// HTTP is the Silencer of a running manager.
type HTTP struct{ Client *http.Client }

func (h HTTP) Silence(ctx context.Context, url, id string, matchers []string, comment string, until time.Time) (string, error) {
	return alerting.Alertmanager{URL: url, Client: h.Client}.Silence(ctx, id, matchers, "nodeops", comment, until)
}

func (h HTTP) Expire(ctx context.Context, url, id string) error {
	return alerting.Alertmanager{URL: url, Client: h.Client}.Expire(ctx, id)
}

// DefaultLease is how far ahead each creation or extension sets a silence's end: a manager that
// stops extending it (it crashed, its owner was deleted) leaves it at most this long, and a
// silence is extended when less than half of it is left.
const DefaultLease = 10 * time.Minute

// Retry is how soon a silence Alertmanager did not extend or expire is tried again.
const Retry = 5 * time.Second

// Key names the silence held over one node for one gate of one group ("" for a profile).
type Key struct{ Group, Gate, Node string }

// KeyOf is the key of a recorded silence.
func KeyOf(s v1alpha1.SilenceStatus) Key { return Key{s.Group, s.Gate, s.Node} }

// Gates are the alertmanager gates among gates that hold a silence, by name.
func Gates(gates []v1alpha1.Gate) map[string]*v1alpha1.Gate {
	out := map[string]*v1alpha1.Gate{}
	for i := range gates {
		if am := gates[i].Alertmanager; am != nil && am.Silence != nil {
			out[gates[i].Name] = &gates[i]
		}
	}
	return out
}

// Matchers are the silence's matchers for node.
func Matchers(s *v1alpha1.AlertmanagerSilence, node string) []string {
	out := make([]string, len(s.Matchers))
	for i, m := range s.Matchers {
		out[i] = strings.ReplaceAll(m, v1alpha1.NodeNamePlaceholder, node)
	}
	return out
}

// comment is the silence's comment; owner says whose it is ("NodeOperation op, group g").
func comment(owner string, k Key, s *v1alpha1.AlertmanagerSilence) string {
	c := "nodeops is working on node " + k.Node
	if s.Comment != "" {
		c = strings.ReplaceAll(s.Comment, v1alpha1.NodeNamePlaceholder, k.Node)
	}
	return fmt.Sprintf("%s (%s, gate %s)", c, owner, k.Gate)
}

func maxDuration(s *v1alpha1.AlertmanagerSilence) time.Duration {
	if s.MaxDuration == nil {
		return 4 * time.Hour
	}
	return s.MaxDuration.Duration
}

// Ends is when this manager last set each silence to end, by id: zero for one it has not (it
// restarted), which is extended at once. The zero value is ready.
type Ends struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func (e *Ends) get(id string) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.m[id]
}

func (e *Ends) set(id string, end time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = map[string]time.Time{}
	}
	if end.IsZero() {
		delete(e.m, id)
	} else {
		e.m[id] = end
	}
}

// Holder creates, extends and expires silences, remembering the ends it set in Ends.
type Holder struct {
	Silencer Silencer
	// Lease is how far ahead a silence's end is set at each extension; DefaultLease when zero.
	Lease time.Duration
	Ends  *Ends
}

func (h Holder) lease() time.Duration {
	if h.Lease > 0 {
		return h.Lease
	}
	return DefaultLease
}

// Extend creates rec's silence (no ID yet) or extends it when due, up to its start plus
// maxDuration; rec comes back with the silence's id. owner says whose the silence is, for its comment.
func (h Holder) Extend(ctx context.Context, owner string, k Key, g *v1alpha1.Gate, rec v1alpha1.SilenceStatus, now time.Time) (v1alpha1.SilenceStatus, error) {
	sil := g.Alertmanager.Silence
	lease := h.lease()
	last := rec.StartTime.Add(maxDuration(sil))
	if rec.ID != "" && !now.Before(last) {
		// maxDuration reached: the silence lapses and the node's alerts fire again.
		h.Ends.set(rec.ID, last)
		return rec, nil
	}
	if end := h.Ends.get(rec.ID); rec.ID != "" && end.Sub(now) > lease/2 {
		return rec, nil
	}
	until := now.Add(lease)
	if last.Before(until) {
		until = last
	}
	id, err := h.Silencer.Silence(ctx, g.Alertmanager.URL, rec.ID, Matchers(sil, k.Node), comment(owner, k, sil), until)
	if err != nil {
		if rec.ID == "" {
			return rec, fmt.Errorf("cannot create the silence for node %s: %w", k.Node, err)
		}
		h.Ends.set(rec.ID, time.Time{}) // tried again soon (Recheck)
		return rec, fmt.Errorf("cannot extend silence %s of node %s: %w", rec.ID, k.Node, err)
	}
	if id != rec.ID && rec.ID != "" {
		h.Ends.set(rec.ID, time.Time{})
	}
	rec.ID = id
	h.Ends.set(id, until)
	return rec, nil
}

// Expire ends silence id at url; on failure it is looked at again soon (Recheck).
func (h Holder) Expire(ctx context.Context, url, id string) error {
	err := h.Silencer.Expire(ctx, url, id)
	h.Ends.set(id, time.Time{})
	return err
}

// Recheck is when the owner must look again at its silences list: when the first is due for
// extension (half a lease before the end this manager set), or soon for one it failed to extend
// or expire; zero when none needs it (a silence past its maxDuration waits for its task's end).
func (h Holder) Recheck(list []v1alpha1.SilenceStatus, now time.Time) time.Duration {
	var soonest time.Duration
	for _, rec := range list {
		end := h.Ends.get(rec.ID)
		var d time.Duration
		switch {
		case end.IsZero():
			d = Retry
		case !end.After(now):
			continue
		default:
			d = max(end.Sub(now)-h.lease()/2, time.Second)
		}
		if soonest == 0 || d < soonest {
			soonest = d
		}
	}
	return soonest
}

// Find is the record of k in list, nil when there is none.
func Find(list []v1alpha1.SilenceStatus, k Key) *v1alpha1.SilenceStatus {
	for i := range list {
		if KeyOf(list[i]) == k {
			return &list[i]
		}
	}
	return nil
}

// Sort orders records by group, node and gate, so that status does not change with map order.
func Sort(list []v1alpha1.SilenceStatus) {
	sort.Slice(list, func(i, j int) bool {
		a, b := list[i], list[j]
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		return a.Gate < b.Gate
	})
}
