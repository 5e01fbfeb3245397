package gate

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// DefaultTimeout is a gate's timeout when the API server did not default it (a status written
// by an older manager, a unit test).
const DefaultTimeout = 30 * time.Minute

// Subject is the object whose gates are checked, a NodeOperation or a NodeProfile: its name for
// messages and its annotations, by which a person approves, retries and skips a gate.
type Subject struct {
	// Kind is "NodeOperation" or "NodeProfile".
	Kind        string
	Name        string
	Annotations map[string]string
}

// Ref is how `kubectl nodeops approve|retry|skip` names the subject: an operation by its name, any
// other kind as kind/name.
func (s Subject) Ref() string {
	if s.Kind == "" || s.Kind == "NodeOperation" {
		return s.Name
	}
	return strings.ToLower(s.Kind) + "/" + s.Name
}

// Timeout is how long g may hold before it times out.
func Timeout(g *v1alpha1.Gate) time.Duration {
	if g.Timeout != nil {
		return g.Timeout.Duration
	}
	return DefaultTimeout
}

// HoldMessage says why g, whose record is s, holds: since when it waits and when it times out, or
// that it held what ("group g", "the profile") for its whole timeout. "" when it does not hold.
func HoldMessage(g *v1alpha1.Gate, s v1alpha1.GateStatus, what string) string {
	switch s.State {
	case v1alpha1.GateWaiting:
		return fmt.Sprintf("gate %s (since %s, times out at %s): %s", g.Name,
			s.Since.UTC().Format(time.RFC3339), s.Since.Add(Timeout(g)).UTC().Format(time.RFC3339), s.Message)
	case v1alpha1.GateTimedOut:
		return fmt.Sprintf("gate %s held %s for its timeout (%s): %s", g.Name, what, Timeout(g), s.Message)
	}
	return ""
}

// NeedsCheck reports whether g must be evaluated before a node may start: not when a person
// skipped it, nor when it timed out and nobody has asked for a retry since (it blocks until a
// person acts, so there is nothing to look at).
func NeedsCheck(g *v1alpha1.Gate, rec *v1alpha1.GateStatus, annotations map[string]string) bool {
	if _, skip := annotations[v1alpha1.AnnotationSkipGatePrefix+g.Name]; skip {
		return false
	}
	return rec == nil || rec.State != v1alpha1.GateTimedOut || rec.Retried != annotations[v1alpha1.AnnotationRetryGatePrefix+g.Name]
}

// Step is a gate's record after one look.
type Step struct {
	// Next is the record to keep; equal to the last one, LastChecked included, when nothing
	// changed, so that a check whose result did not change writes nothing.
	Next v1alpha1.GateStatus
	// Unchecked: the gate needs a check and has no result in this look; it holds (Waiting), and
	// the caller checks it and looks again. An unchecked gate never lets a node start (rule 14).
	Unchecked bool
	// Due is when a gate still Waiting after this check times out; zero otherwise.
	Due time.Time
}

// Advance moves gate g's record rec (nil when never recorded; group is its group, "" for a
// NodeProfile) on by a person's annotations and this look's result (have is false when the gate
// was not checked), at now. It is pure: the one state machine of gates, for every kind that has them.
//
// A retry annotation with a new value clears the state, so the wait and its timeout start again;
// a skip annotation passes the gate; a timed-out gate stays so until one of them; a gate that does
// not pass is Waiting since the first look that found it so, and TimedOut once that was its
// timeout ago.
func Advance(g *v1alpha1.Gate, rec *v1alpha1.GateStatus, group string, annotations map[string]string, res Result, have bool, now metav1.Time) Step {
	next := v1alpha1.GateStatus{Group: group, Name: g.Name}
	if rec != nil {
		next = *rec
	}
	var st Step
	if retry, ok := annotations[v1alpha1.AnnotationRetryGatePrefix+g.Name]; ok && retry != next.Retried {
		// A person asked for a fresh look: the wait and its timeout start again now.
		next.Retried = retry
		next.State = ""
	}
	switch _, skip := annotations[v1alpha1.AnnotationSkipGatePrefix+g.Name]; {
	case skip:
		set(&next, v1alpha1.GateSkipped, "skipped by a person ("+v1alpha1.AnnotationSkipGatePrefix+g.Name+")", now)
	case next.State == v1alpha1.GateTimedOut:
		// Stays so until a person retries or skips it (a failure blocks until a person decides, rule 3).
	case !have:
		st.Unchecked = true
		if next.State == "" || next.State == v1alpha1.GatePassed {
			set(&next, v1alpha1.GateWaiting, "not checked yet", now)
		}
	case res.Passed:
		set(&next, v1alpha1.GatePassed, res.Message, now)
		next.LastChecked = now
	default:
		set(&next, v1alpha1.GateWaiting, res.Message, now)
		next.LastChecked = now
		if due := next.Since.Add(Timeout(g)); !now.Time.Before(due) {
			set(&next, v1alpha1.GateTimedOut, res.Message, now)
		} else {
			st.Due = due
		}
	}
	if next.LastChecked.IsZero() {
		next.LastChecked = now
	}
	if rec != nil && rec.State == next.State && rec.Message == next.Message && rec.Since.Equal(&next.Since) && rec.Retried == next.Retried {
		// An unchanged result costs no write: the check time rides along with the next one.
		next.LastChecked = rec.LastChecked
	}
	st.Next = next
	return st
}

// set moves a gate's record to state with message; Since moves only when the state changes.
func set(g *v1alpha1.GateStatus, state v1alpha1.GateState, message string, now metav1.Time) {
	if g.State != state {
		g.Since = now
	}
	g.State, g.Message = state, Truncate(message, 1024)
}

// Truncate shortens s to at most n bytes, marking the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// Find is the record of gate name of group in list, nil when there is none.
func Find(list []v1alpha1.GateStatus, group, name string) *v1alpha1.GateStatus {
	for i := range list {
		if list[i].Group == group && list[i].Name == name {
			return &list[i]
		}
	}
	return nil
}

// Put replaces or adds g in a copy of list, keeping the order gates were first checked.
func Put(list []v1alpha1.GateStatus, g v1alpha1.GateStatus) []v1alpha1.GateStatus {
	for i := range list {
		if list[i].Group == g.Group && list[i].Name == g.Name {
			out := append([]v1alpha1.GateStatus(nil), list...)
			out[i] = g
			return out
		}
	}
	return append(append([]v1alpha1.GateStatus(nil), list...), g)
}
