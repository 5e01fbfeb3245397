package nodeoperation

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/gate"
	"github.com/nodeops/nodeops/internal/silence"
	"github.com/nodeops/nodeops/internal/statuswrite"
)

// silences is the operation controller's silence holder: its Silencer, lease and memory of ends.
func (r *Reconciler) silences() silence.Holder {
	return silence.Holder{Silencer: r.Silences, Lease: r.SilenceLease, Ends: &r.silenceEnds}
}

func silenceOwner(op *v1alpha1.NodeOperation, group string) string {
	return fmt.Sprintf("NodeOperation %s, group %s", op.Name, group)
}

// holdSilences keeps the silences of the operation's nodes being worked on (an unfinished task in
// a group with a silencing gate): each recorded one is extended when less than half its lease is
// left, and never past its start plus maxDuration; each whose task ended (or never came) is
// expired and its record dropped. A task running without a record (a person retried it after its
// silence was expired) gets a new one. Silences for nodes about to start are made by
// silenceNewNodes, which holds their gate when it cannot. Failures are kept in s.silenceErr, by
// group and gate, so that the gate holds (a gate that cannot be evaluated blocks, rule 14).
func (r *Reconciler) holdSilences(ctx context.Context, s *scope) {
	recorded := s.op.Status.Silences
	if len(recorded) == 0 && !anySilence(s) {
		return
	}
	now := r.now()
	list := append([]v1alpha1.SilenceStatus(nil), recorded...)
	s.in.silences = &list
	byGroup := map[string]map[string]*v1alpha1.Gate{}
	for i := range s.in.groups {
		byGroup[s.in.groups[i].Name] = silence.Gates(s.in.timing[i].gates)
	}
	working := func(k silence.Key) bool {
		t, ok := s.in.tasks[k.Group][k.Node]
		return ok && t.Phase.Unfinished() && byGroup[k.Group][k.Gate] != nil
	}
	var keep []v1alpha1.SilenceStatus
	have := map[silence.Key]bool{}
	for _, rec := range list {
		k := silence.KeyOf(rec)
		g := byGroup[k.Group][k.Gate]
		if !working(k) {
			if g == nil {
				continue // the gate is gone (not possible while the spec is immutable): nothing to reach
			}
			if err := r.silences().Expire(ctx, g.Alertmanager.URL, rec.ID); err != nil {
				s.silenceFailed(k, fmt.Errorf("cannot expire silence %s of node %s: %w", rec.ID, k.Node, err))
				keep = append(keep, rec) // looked at again soon (silenceRecheck)
				continue
			}
			log.FromContext(ctx).Info("expired the silence of a node no longer worked on", "node", k.Node, "gate", k.Gate, "silence", rec.ID)
			continue
		}
		have[k] = true
		updated, err := r.silences().Extend(ctx, silenceOwner(s.op, k.Group), k, g, rec, now)
		if err != nil {
			s.silenceFailed(k, err)
		}
		keep = append(keep, updated)
	}
	// Running tasks without a silence (retried after theirs was expired): make one.
	for group, nodes := range s.in.tasks {
		for node, t := range nodes {
			if !t.Phase.Unfinished() {
				continue
			}
			for name, g := range byGroup[group] {
				k := silence.Key{Group: group, Gate: name, Node: node}
				if have[k] {
					continue
				}
				rec, err := r.silences().Extend(ctx, silenceOwner(s.op, k.Group), k, g, v1alpha1.SilenceStatus{Group: group, Gate: name, Node: node, StartTime: metav1.NewTime(now)}, now)
				if err != nil {
					s.silenceFailed(k, err)
					continue
				}
				keep = append(keep, rec)
			}
		}
	}
	silence.Sort(keep)
	*s.in.silences = keep
}

func anySilence(s *scope) bool {
	for i := range s.in.timing {
		if len(silence.Gates(s.in.timing[i].gates)) > 0 {
			return true
		}
	}
	return false
}

// silenceNewNodes makes the silences of the nodes the decision would start now, in group, before
// their tasks exist; a gate whose silence cannot be made holds, with the reason, so the node does
// not start (rule 14).
func (r *Reconciler) silenceNewNodes(ctx context.Context, s *scope, group string, gates []v1alpha1.Gate, results map[string]gate.Result) {
	sg := silence.Gates(gates)
	if len(sg) == 0 {
		return
	}
	for _, res := range results {
		if !res.Passed {
			return // nothing starts: no silence needed yet
		}
	}
	d := decide(&s.in)
	if s.in.silences == nil {
		s.in.silences = &[]v1alpha1.SilenceStatus{}
	}
	now := r.now()
	for _, c := range d.create {
		for name, g := range sg {
			k := silence.Key{Group: group, Gate: name, Node: c.node}
			if silence.Find(*s.in.silences, k) != nil {
				continue
			}
			rec, err := r.silences().Extend(ctx, silenceOwner(s.op, k.Group), k, g, v1alpha1.SilenceStatus{Group: group, Gate: name, Node: c.node, StartTime: metav1.NewTime(now)}, now)
			if err != nil {
				results[name] = gate.Result{Message: err.Error()}
				continue
			}
			*s.in.silences = append(*s.in.silences, rec)
		}
	}
	silence.Sort(*s.in.silences)
}

func (s *scope) silenceFailed(k silence.Key, err error) {
	if s.silenceErr == nil {
		s.silenceErr = map[gateKey]error{}
	}
	s.silenceErr[gateKey{k.Group, k.Gate}] = err
}

// silenceRecheck is when the operation must look again for its silences (silence.Holder.Recheck).
func (r *Reconciler) silenceRecheck(list []v1alpha1.SilenceStatus) time.Duration {
	return r.silences().Recheck(list, r.now())
}

// expireLeftSilences expires the silences a finished operation still records (their expiry
// failed before it finished) and drops their records.
func (r *Reconciler) expireLeftSilences(ctx context.Context, op *v1alpha1.NodeOperation) (ctrl.Result, error) {
	if len(op.Status.Silences) == 0 {
		return ctrl.Result{}, nil
	}
	urls := map[silence.Key]string{}
	eff := func(gates []v1alpha1.Gate, group string) {
		for name, g := range silence.Gates(gates) {
			urls[silence.Key{Group: group, Gate: name}] = g.Alertmanager.URL
		}
	}
	for _, rec := range op.Status.Silences {
		eff(op.Spec.Gates, rec.Group)
		if op.Spec.Custom != nil {
			for i := range op.Spec.Custom.Groups {
				if g := &op.Spec.Custom.Groups[i]; g.Name == rec.Group && len(g.Gates) > 0 {
					eff(g.Gates, rec.Group)
				}
			}
		}
	}
	var left []v1alpha1.SilenceStatus
	var firstErr error
	for _, rec := range op.Status.Silences {
		url, ok := urls[silence.Key{Group: rec.Group, Gate: rec.Gate}]
		if !ok {
			continue
		}
		if err := r.silences().Expire(ctx, url, rec.ID); err != nil {
			left = append(left, rec)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
	}
	orig := op.DeepCopy()
	op.Status.Silences = left
	// The one status writer (statuswrite): a stale copy is read again and expired once more.
	if _, res, err := statuswrite.Write(ctx, r.Client, statusRule, nil, statuswrite.Change{Orig: orig, Obj: op, Urgent: true, Now: r.now()}); err != nil {
		return res, fmt.Errorf("record the expired silences of NodeOperation %s: %w", op.Name, err)
	}
	if firstErr != nil {
		log.FromContext(ctx).Error(firstErr, "cannot expire a silence of a finished operation; trying again")
		return ctrl.Result{RequeueAfter: 30 * time.Second}, nil
	}
	return ctrl.Result{}, nil
}
