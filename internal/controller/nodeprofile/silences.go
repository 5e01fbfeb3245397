package nodeprofile

import (
	"context"
	"fmt"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/gate"
	"github.com/nodeops/nodeops/internal/silence"
)

// An alertmanager gate with a silence has the profile hold one over each node while its task runs
// (internal/silence, shared with NodeOperation), recorded in status.silences with an empty group.

// silences is the profile controller's silence holder: its Silencer, lease and memory of ends.
func (r *Reconciler) silences() silence.Holder {
	return silence.Holder{Silencer: r.Silences, Lease: r.SilenceLease, Ends: &r.silenceEnds}
}

func silenceOwner(p *v1alpha1.NodeProfile) string { return "NodeProfile " + p.Name }

// holdSilences keeps the silences of the profile's nodes being worked on (an unfinished install or
// uninstall task): each recorded one is extended when less than half its lease is left, and never
// past its start plus maxDuration; each whose node has no unfinished task is expired and its
// record dropped. A task running without a record (a person retried it after its silence was
// expired) gets a new one. Silences for nodes about to start are made by silenceNewNodes.
// Failures are kept in s.silenceErr by gate, so that the gate holds (rule 14).
func (r *Reconciler) holdSilences(ctx context.Context, s *scope) {
	p := s.profile
	gates := silence.Gates(p.Spec.Gates)
	if len(p.Status.Silences) == 0 && len(gates) == 0 {
		return
	}
	now := s.in.Now
	working := map[string]bool{}
	for _, t := range s.in.Tasks {
		if t.Phase.Unfinished() {
			working[t.Node] = true
		}
	}
	var keep []v1alpha1.SilenceStatus
	have := map[silence.Key]bool{}
	for _, rec := range p.Status.Silences {
		k := silence.KeyOf(rec)
		g := gates[k.Gate]
		switch {
		case g == nil:
			// The gate left the spec (a profile's gates may change): its Alertmanager is no longer
			// known, and the silence lapses at the end of its lease.
			log.FromContext(ctx).Info("dropped the silence of a gate no longer in the spec", "node", k.Node, "gate", k.Gate, "silence", rec.ID)
		case !working[k.Node]:
			if err := r.silences().Expire(ctx, g.Alertmanager.URL, rec.ID); err != nil {
				s.silenceFailed(k.Gate, fmt.Errorf("cannot expire silence %s of node %s: %w", rec.ID, k.Node, err))
				keep = append(keep, rec) // looked at again soon (silence.Holder.Recheck)
				continue
			}
			log.FromContext(ctx).Info("expired the silence of a node no longer worked on", "node", k.Node, "gate", k.Gate, "silence", rec.ID)
		default:
			have[k] = true
			updated, err := r.silences().Extend(ctx, silenceOwner(p), k, g, rec, now)
			if err != nil {
				s.silenceFailed(k.Gate, err)
			}
			keep = append(keep, updated)
		}
	}
	// Running tasks without a silence (retried after theirs was expired): make one.
	nodes := make([]string, 0, len(working))
	for node := range working {
		nodes = append(nodes, node)
	}
	sort.Strings(nodes)
	for _, node := range nodes {
		for name, g := range gates {
			k := silence.Key{Gate: name, Node: node}
			if have[k] {
				continue
			}
			rec, err := r.silences().Extend(ctx, silenceOwner(p), k, g, v1alpha1.SilenceStatus{Gate: name, Node: node, StartTime: metav1.NewTime(now)}, now)
			if err != nil {
				s.silenceFailed(name, err)
				continue
			}
			keep = append(keep, rec)
		}
	}
	silence.Sort(keep)
	s.silences = &keep
}

// silenceNewNodes makes the silences of the nodes that start now, before their tasks exist, when
// every gate passes; a gate whose silence cannot be made holds with the reason, so that no node
// starts without its silence (rule 14).
func (r *Reconciler) silenceNewNodes(ctx context.Context, s *scope, starts []Start) {
	p := s.profile
	gates := silence.Gates(p.Spec.Gates)
	if len(gates) == 0 || len(starts) == 0 {
		return
	}
	now := s.in.Now
	v := applyGates(p, s.gateResults, metav1.NewTime(now), r.GateRecheck)
	if v.Reason != "" {
		return // nothing starts: no silence needed yet
	}
	starts = gatedStarts(p, starts, v.Gates, s.about)
	if s.silences == nil {
		s.silences = &[]v1alpha1.SilenceStatus{}
	}
	for _, st := range starts {
		for name, g := range gates {
			k := silence.Key{Gate: name, Node: st.Node}
			if silence.Find(*s.silences, k) != nil {
				continue
			}
			rec, err := r.silences().Extend(ctx, silenceOwner(p), k, g, v1alpha1.SilenceStatus{Gate: name, Node: st.Node, StartTime: metav1.NewTime(now)}, now)
			if err != nil {
				s.gateResults[name] = gate.Result{Message: err.Error()}
				continue
			}
			*s.silences = append(*s.silences, rec)
		}
	}
	silence.Sort(*s.silences)
}

func (s *scope) silenceFailed(gateName string, err error) {
	if s.silenceErr == nil {
		s.silenceErr = map[string]error{}
	}
	s.silenceErr[gateName] = err
}

// silenceRecheck is when the profile must look again for its silences (silence.Holder.Recheck).
func (r *Reconciler) silenceRecheck(list []v1alpha1.SilenceStatus) time.Duration {
	return r.silences().Recheck(list, r.Now.Now())
}
