package nodeoperation

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/gate"
)

// CEL gates read their objects through the manager; the workloads a gate most often waits for
// are readable here, and any other kind needs a ClusterRole of its own bound to the manager
// (docs/how-to/health-gates.md). Cluster health reads pods and nodes, already granted.
// +kubebuilder:rbac:groups=apps,resources=deployments;statefulsets;daemonsets,verbs=get;list

// gated applies the group's gates, checked in this reconcile (in.gates) or recorded in st, and
// records each one's state in st.Gates (gate.Advance, shared with NodeProfile). It returns "" when
// all pass; otherwise the reason (WaitingForGate or GateTimedOut), the message, and when to look
// again. A group whose gates have not been checked yet is named in d.checkGates and holds: the
// controller checks them and decides again, so that an unchecked gate never lets a node start (a
// gate that cannot be evaluated blocks, rule 14).
func gated(in *input, group string, gates []v1alpha1.Gate, st *v1alpha1.NodeOperationStatus, d *decision) (reason, message string, recheck time.Time) {
	results, checked := in.gates[group]
	now := in.now
	about := d.create[0].node
	perNode := false
	var waiting, timedOut []string
	var msgs = map[string]string{}
	for i := range gates {
		g := &gates[i]
		res, have := results[g.Name]
		step := gate.Advance(g, gate.Find(st.Gates, group, g.Name), group, in.op.Annotations, res, checked && have, now)
		next := step.Next
		if step.Unchecked {
			d.checkGates, d.checkNode = group, about
		}
		if g.Command != nil && g.Command.Node == "" && next.State == v1alpha1.GatePassed {
			perNode = true
		}
		if !step.Due.IsZero() {
			if soon := minTime(step.Due, now.Add(in.gateRecheck)); recheck.IsZero() || soon.Before(recheck) {
				recheck = soon
			}
		}
		st.Gates = gate.Put(st.Gates, next)
		switch next.State {
		case v1alpha1.GateWaiting:
			waiting = append(waiting, g.Name)
		case v1alpha1.GateTimedOut:
			timedOut = append(timedOut, g.Name)
		}
		msgs[g.Name] = gate.HoldMessage(g, next, "group "+group)
	}
	if len(timedOut) > 0 {
		n := timedOut[0]
		return ReasonGateTimedOut, msgs[n] + fmt.Sprintf("; kubectl nodeops retry %s --gate %s checks it again, skip --gate %s passes it, or abort the operation", in.op.Name, n, n), time.Time{}
	}
	if d.checkGates != "" {
		// Checked at once by the controller; this decision is never written.
		return ReasonWaitingForGate, "checking the gates of group " + group, now.Add(in.gateRecheck)
	}
	if len(waiting) > 0 {
		msg := fmt.Sprintf("group %s waits for %s", group, msgs[waiting[0]])
		if len(waiting) > 1 {
			msg += fmt.Sprintf(" (and %d more gates)", len(waiting)-1)
		}
		return ReasonWaitingForGate, msg, recheck
	}
	if perNode {
		// The script ran on the node about to start, and answers for that node only: the others
		// wait for their own check, one per look (docs/how-to/health-gates.md).
		d.create = d.create[:1]
	}
	return "", "", time.Time{}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func truncate(s string, n int) string { return gate.Truncate(s, n) }

// checkGates decides once, and when the decision wants a group's gates checked before its nodes
// start, checks them: the gates only read, and the second decision (the skeleton's) uses what
// they found. Only gates that may let a node start now cost a check.
func (r *Reconciler) checkGates(ctx context.Context, s *scope) {
	if s.in.fail != nil || r.Gates == nil || !anyGates(s.in.timing) {
		// Without gates no decision asks for a check (gated sets checkGates only for a gate), so
		// the decision made to look for one is not made (it was a tenth of the manager's CPU).
		return
	}
	first := decide(&s.in)
	group := first.checkGates
	if group == "" {
		return
	}
	var gates []v1alpha1.Gate
	for i := range s.in.groups {
		if s.in.groups[i].Name == group {
			gates = s.in.timing[i].gates
		}
	}
	target := gate.Target{Subject: gate.Subject{Kind: kind, Name: s.op.Name, Annotations: s.op.Annotations}, Group: group, Finished: recentlyFinished(s, 10)}
	results := map[string]gate.Result{}
	for i := range gates {
		g := &gates[i]
		if !gate.NeedsCheck(g, gate.Find(s.op.Status.Gates, group, g.Name), s.op.Annotations) {
			continue // skipped, or blocked until a person acts: nothing to look at
		}
		if g.Command != nil {
			results[g.Name] = r.checkCommand(ctx, s, group, g, first.checkNode)
			continue
		}
		results[g.Name] = r.Gates.Check(ctx, g, target)
		if err := s.silenceErr[gateKey{group, g.Name}]; err != nil && results[g.Name].Passed {
			results[g.Name] = gate.Result{Message: err.Error()}
		}
	}
	if s.in.gates == nil {
		s.in.gates = map[string]map[string]gate.Result{}
	}
	s.in.gates[group] = results
	r.silenceNewNodes(ctx, s, group, gates, results)
	for _, g := range gates {
		if _, ok := results[g.Name]; ok {
			s.checked = append(s.checked, gateKey{group, g.Name})
		}
	}
}

type gateKey struct{ group, name string }

func anyGates(timing []timing) bool {
	for _, t := range timing {
		if len(t.gates) > 0 {
			return true
		}
	}
	return false
}

// recentlyFinished are up to n nodes whose task in this operation succeeded last, newest first.
func recentlyFinished(s *scope, n int) []string {
	type done struct {
		node string
		at   time.Time
	}
	var all []done
	seen := map[string]bool{}
	for _, t := range s.tasks {
		if t.EffectivePhase() == v1alpha1.TaskSucceeded && !seen[t.Spec.NodeName] && t.Status.CompletionTime != nil {
			seen[t.Spec.NodeName] = true
			all = append(all, done{t.Spec.NodeName, t.Status.CompletionTime.Time})
		}
	}
	sort.Slice(all, func(i, j int) bool {
		if !all[i].at.Equal(all[j].at) {
			return all[i].at.After(all[j].at)
		}
		return all[i].node < all[j].node
	})
	out := make([]string, 0, min(n, len(all)))
	for i := 0; i < len(all) && i < n; i++ {
		out = append(out, all[i].node)
	}
	return out
}
