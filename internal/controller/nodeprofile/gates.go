package nodeprofile

import (
	"context"
	"fmt"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/cmdgate"
	"github.com/nodeops/nodeops/internal/gate"
)

// DefaultGateRecheck is how soon a gate that holds is checked again.
const DefaultGateRecheck = 10 * time.Second

// Reasons of a profile held by its gates.
const (
	// ReasonWaitingForGate: a gate does not pass yet, so no new task starts.
	ReasonWaitingForGate = "WaitingForGate"
	// ReasonGateTimedOut: a gate held the profile for its whole timeout; a person retries or skips it.
	ReasonGateTimedOut = "GateTimedOut"
	// ReasonNotBlocked: nothing stops the profile's new tasks but maxUnavailable, the node lock and the windows.
	ReasonNotBlocked = "NotBlocked"
)

// wantsGates reports whether d would start a task now were it not for the gates: there are
// candidates, room under maxUnavailable, and the windows are open (checked by the caller). Only
// then do the gates cost a check.
func wantsGates(p *v1alpha1.NodeProfile, d decision) bool {
	return len(p.Spec.Gates) > 0 && len(d.Starts) > 0 && d.Room > 0
}

// checkGates evaluates the profile's gates that may let a task start (not skipped, not timed out
// without a retry), a command gate for the node about to start (s.about). They only read, but for
// the checks a command gate asks act to create; decide applies what they found.
func (r *Reconciler) checkGates(ctx context.Context, s *scope) {
	p := s.profile
	target := gate.Target{Subject: subject(p), Finished: recentlyFinished(s.in.Tasks, 10)}
	s.gateResults = map[string]gate.Result{}
	for i := range p.Spec.Gates {
		g := &p.Spec.Gates[i]
		if !gate.NeedsCheck(g, gate.Find(p.Status.Gates, "", g.Name), p.Annotations) {
			continue
		}
		if g.Command != nil {
			if g.Command.Node == "" && s.about == "" {
				// Every candidate's node is held, or the lock table has not synced: no node to run
				// the script on yet. Unchecked, the gate holds without its timeout running down.
				continue
			}
			s.gateResults[g.Name] = s.look.Check(ctx, r.Client, "", g, s.about)
			continue
		}
		if r.Gates == nil {
			// No checker: the gate cannot be evaluated, and so it holds (rule 14).
			s.gateResults[g.Name] = gate.Result{Message: "no gate checker in this manager"}
			continue
		}
		res := r.Gates.Check(ctx, g, target)
		if err := s.silenceErr[g.Name]; err != nil && res.Passed {
			// A silence Alertmanager did not extend or expire: the gate holds until it does (rule 14).
			res = gate.Result{Message: err.Error()}
		}
		s.gateResults[g.Name] = res
	}
}

// checkOwner is the profile as the owner of its command gates' checks (internal/cmdgate, shared
// with NodeOperation). A profile has no dry run.
func checkOwner(p *v1alpha1.NodeProfile) cmdgate.Owner {
	return cmdgate.Owner{Kind: kind, Name: p.Name, UID: p.UID}
}

// gatedStarts are the starts the passed gates let go: all of them, but the node about to start
// alone when a command gate that runs on the node about to start passed, for its script answered
// for that node only (each node is checked before it starts, as in an operation).
func gatedStarts(p *v1alpha1.NodeProfile, starts []Start, records []v1alpha1.GateStatus, about string) []Start {
	for i := range p.Spec.Gates {
		g := &p.Spec.Gates[i]
		if g.Command == nil || g.Command.Node != "" {
			continue
		}
		if rec := gate.Find(records, "", g.Name); rec != nil && rec.State == v1alpha1.GatePassed {
			var out []Start
			for _, st := range starts {
				if st.Node == about {
					out = append(out, st)
				}
			}
			return out
		}
	}
	return starts
}

func subject(p *v1alpha1.NodeProfile) gate.Subject {
	return gate.Subject{Kind: kind, Name: p.Name, Annotations: p.Annotations}
}

// gateVerdict is what the gates say of the tasks the profile would start now.
type gateVerdict struct {
	// Gates are the records for status.gates.
	Gates []v1alpha1.GateStatus
	// Reason is "" when every gate passes; else ReasonWaitingForGate or ReasonGateTimedOut, with Message.
	Reason, Message string
	// Recheck is when to look again at a gate that holds; zero for none.
	Recheck time.Time
}

// applyGates moves each gate's record on (gate.Advance) by results (nil: not checked in this
// reconcile) and the profile's annotations. A gate without a result holds: an unchecked gate
// never lets a task start (a gate that cannot be evaluated blocks, rule 14).
func applyGates(p *v1alpha1.NodeProfile, results map[string]gate.Result, now metav1.Time, recheckEvery time.Duration) gateVerdict {
	var v gateVerdict
	var waiting, timedOut []string
	msgs := map[string]string{}
	for i := range p.Spec.Gates {
		g := &p.Spec.Gates[i]
		res, have := results[g.Name]
		step := gate.Advance(g, gate.Find(p.Status.Gates, "", g.Name), "", p.Annotations, res, have, now)
		next := step.Next
		v.Gates = append(v.Gates, next)
		soon := time.Time{}
		switch {
		case step.Unchecked:
			soon = now.Add(recheckEvery)
		case !step.Due.IsZero():
			soon = now.Add(recheckEvery)
			if step.Due.Before(soon) {
				soon = step.Due
			}
		}
		if !soon.IsZero() && (v.Recheck.IsZero() || soon.Before(v.Recheck)) {
			v.Recheck = soon
		}
		switch next.State {
		case v1alpha1.GateWaiting:
			waiting = append(waiting, g.Name)
		case v1alpha1.GateTimedOut:
			timedOut = append(timedOut, g.Name)
		}
		msgs[g.Name] = gate.HoldMessage(g, next, "the profile")
	}
	ref := subject(p).Ref()
	switch {
	case len(timedOut) > 0:
		n := timedOut[0]
		v.Reason = ReasonGateTimedOut
		v.Message = msgs[n] + fmt.Sprintf("; kubectl nodeops retry %s --gate %s checks it again, kubectl nodeops skip %s --gate %s passes it", ref, n, ref, n)
		v.Recheck = time.Time{}
	case len(waiting) > 0:
		v.Reason = ReasonWaitingForGate
		v.Message = "waiting for " + msgs[waiting[0]]
		if len(waiting) > 1 {
			v.Message += fmt.Sprintf(" (and %d more gates)", len(waiting)-1)
		}
	}
	return v
}

// keptGates is status.gates when the gates were not looked at: the last records of the gates
// still in the spec.
func keptGates(p *v1alpha1.NodeProfile) []v1alpha1.GateStatus {
	var out []v1alpha1.GateStatus
	for i := range p.Spec.Gates {
		if rec := gate.Find(p.Status.Gates, "", p.Spec.Gates[i].Name); rec != nil {
			out = append(out, *rec)
		}
	}
	return out
}

// recentlyFinished are up to n nodes whose task succeeded last, newest first: what cluster health checks.
func recentlyFinished(tasks []TaskView, n int) []string {
	var done []TaskView
	seen := map[string]bool{}
	for _, t := range tasks {
		if t.Phase == v1alpha1.TaskSucceeded && !t.Completed.IsZero() {
			done = append(done, t)
		}
	}
	sort.Slice(done, func(i, j int) bool {
		if !done[i].Completed.Equal(done[j].Completed) {
			return done[i].Completed.After(done[j].Completed)
		}
		return done[i].Node < done[j].Node
	})
	var out []string
	for _, t := range done {
		if len(out) == n {
			break
		}
		if !seen[t.Node] {
			seen[t.Node] = true
			out = append(out, t.Node)
		}
	}
	return out
}
