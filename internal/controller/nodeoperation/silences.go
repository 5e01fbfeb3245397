package nodeoperation

import (
	"context"
	"fmt"
	"github.com/nodeops/nodeops/internal/statuswrite"
	"net/http"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/alerting"
	"github.com/nodeops/nodeops/internal/gate"
)

// Silencer creates, extends and expires Alertmanager silences; alerting.Alertmanager does it over HTTP.
type Silencer interface {
	// Silence creates (id "") or extends (id given) a silence ending at until and returns its id,
	// a new one when the old could not be extended.
	Silence(ctx context.Context, url, id string, matchers []string, comment string, until time.Time) (string, error)
	// Expire ends a silence; one already gone is no error.
	Expire(ctx context.Context, url, id string) error
}

// HTTPSilencer is the Silencer of a running manager.
type HTTPSilencer struct{ Client *http.Client }

func (h HTTPSilencer) Silence(ctx context.Context, url, id string, matchers []string, comment string, until time.Time) (string, error) {
	return alerting.Alertmanager{URL: url, Client: h.Client}.Silence(ctx, id, matchers, "nodeops", comment, until)
}

func (h HTTPSilencer) Expire(ctx context.Context, url, id string) error {
	return alerting.Alertmanager{URL: url, Client: h.Client}.Expire(ctx, id)
}

// defaultSilenceLease is how far ahead each creation or extension sets a silence's end: a
// manager that stops extending it (it crashed, the operation was deleted) leaves it at most this
// long, and a silence is extended when less than half of it is left.
const defaultSilenceLease = 10 * time.Minute

// silenceKey names the silence held over one node for one gate of one group.
type silenceKey struct{ group, gate, node string }

func keyOf(s v1alpha1.SilenceStatus) silenceKey { return silenceKey{s.Group, s.Gate, s.Node} }

// silenceGates are the group's alertmanager gates that hold a silence, by name.
func silenceGates(gates []v1alpha1.Gate) map[string]*v1alpha1.Gate {
	out := map[string]*v1alpha1.Gate{}
	for i := range gates {
		if am := gates[i].Alertmanager; am != nil && am.Silence != nil {
			out[gates[i].Name] = &gates[i]
		}
	}
	return out
}

// silenceMatchers are the silence's matchers for node.
func silenceMatchers(s *v1alpha1.AlertmanagerSilence, node string) []string {
	out := make([]string, len(s.Matchers))
	for i, m := range s.Matchers {
		out[i] = strings.ReplaceAll(m, v1alpha1.NodeNamePlaceholder, node)
	}
	return out
}

func silenceComment(op *v1alpha1.NodeOperation, k silenceKey, s *v1alpha1.AlertmanagerSilence) string {
	c := "nodeops is working on node " + k.node
	if s.Comment != "" {
		c = strings.ReplaceAll(s.Comment, v1alpha1.NodeNamePlaceholder, k.node)
	}
	return fmt.Sprintf("%s (NodeOperation %s, group %s, gate %s)", c, op.Name, k.group, k.gate)
}

func maxSilence(s *v1alpha1.AlertmanagerSilence) time.Duration {
	if s.MaxDuration == nil {
		return 4 * time.Hour
	}
	return s.MaxDuration.Duration
}

func (r *Reconciler) silenceLease() time.Duration {
	if r.SilenceLease > 0 {
		return r.SilenceLease
	}
	return defaultSilenceLease
}

// silenceEnd is when this manager last set silence id to end; zero when it has not (it restarted).
func (r *Reconciler) silenceEnd(id string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.silenceEnds[id]
}

func (r *Reconciler) setSilenceEnd(id string, end time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.silenceEnds == nil {
		r.silenceEnds = map[string]time.Time{}
	}
	if end.IsZero() {
		delete(r.silenceEnds, id)
	} else {
		r.silenceEnds[id] = end
	}
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
		byGroup[s.in.groups[i].Name] = silenceGates(s.in.timing[i].gates)
	}
	working := func(k silenceKey) bool {
		t, ok := s.in.tasks[k.group][k.node]
		return ok && t.Phase.Unfinished() && byGroup[k.group][k.gate] != nil
	}
	var keep []v1alpha1.SilenceStatus
	have := map[silenceKey]bool{}
	for _, rec := range list {
		k := keyOf(rec)
		g := byGroup[k.group][k.gate]
		if !working(k) {
			if g == nil {
				continue // the gate is gone (not possible while the spec is immutable): nothing to reach
			}
			if err := r.Silences.Expire(ctx, g.Alertmanager.URL, rec.ID); err != nil {
				s.silenceFailed(k, fmt.Errorf("cannot expire silence %s of node %s: %w", rec.ID, k.node, err))
				r.setSilenceEnd(rec.ID, time.Time{}) // looked at again soon (silenceRecheck)
				keep = append(keep, rec)
				continue
			}
			r.setSilenceEnd(rec.ID, time.Time{})
			log.FromContext(ctx).Info("expired the silence of a node no longer worked on", "node", k.node, "gate", k.gate, "silence", rec.ID)
			continue
		}
		have[k] = true
		updated, err := r.extendSilence(ctx, s.op, k, g, rec, now)
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
				k := silenceKey{group, name, node}
				if have[k] {
					continue
				}
				rec, err := r.extendSilence(ctx, s.op, k, g, v1alpha1.SilenceStatus{Group: group, Gate: name, Node: node, StartTime: metav1.NewTime(now)}, now)
				if err != nil {
					s.silenceFailed(k, err)
					continue
				}
				keep = append(keep, rec)
			}
		}
	}
	sortSilences(keep)
	*s.in.silences = keep
}

func anySilence(s *scope) bool {
	for i := range s.in.timing {
		if len(silenceGates(s.in.timing[i].gates)) > 0 {
			return true
		}
	}
	return false
}

// extendSilence creates rec's silence (no ID yet) or extends it when due, up to its start plus
// maxDuration; rec comes back with the silence's id.
func (r *Reconciler) extendSilence(ctx context.Context, op *v1alpha1.NodeOperation, k silenceKey, g *v1alpha1.Gate, rec v1alpha1.SilenceStatus, now time.Time) (v1alpha1.SilenceStatus, error) {
	sil := g.Alertmanager.Silence
	lease := r.silenceLease()
	last := rec.StartTime.Add(maxSilence(sil))
	if rec.ID != "" && !now.Before(last) {
		// maxDuration reached: the silence lapses and the node's alerts fire again.
		r.setSilenceEnd(rec.ID, last)
		return rec, nil
	}
	if end := r.silenceEnd(rec.ID); rec.ID != "" && end.Sub(now) > lease/2 {
		return rec, nil
	}
	until := minTime(now.Add(lease), last)
	id, err := r.Silences.Silence(ctx, g.Alertmanager.URL, rec.ID, silenceMatchers(sil, k.node), silenceComment(op, k, sil), until)
	if err != nil {
		if rec.ID == "" {
			return rec, fmt.Errorf("cannot create the silence for node %s: %w", k.node, err)
		}
		r.setSilenceEnd(rec.ID, time.Time{}) // tried again soon (silenceRecheck)
		return rec, fmt.Errorf("cannot extend silence %s of node %s: %w", rec.ID, k.node, err)
	}
	if id != rec.ID && rec.ID != "" {
		r.setSilenceEnd(rec.ID, time.Time{})
	}
	rec.ID = id
	r.setSilenceEnd(id, until)
	return rec, nil
}

// silenceNewNodes makes the silences of the nodes the decision would start now, in group, before
// their tasks exist; a gate whose silence cannot be made holds, with the reason, so the node does
// not start (rule 14).
func (r *Reconciler) silenceNewNodes(ctx context.Context, s *scope, group string, gates []v1alpha1.Gate, results map[string]gate.Result) {
	sg := silenceGates(gates)
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
			k := silenceKey{group, name, c.node}
			if findSilence(*s.in.silences, k) != nil {
				continue
			}
			rec, err := r.extendSilence(ctx, s.op, k, g, v1alpha1.SilenceStatus{Group: group, Gate: name, Node: c.node, StartTime: metav1.NewTime(now)}, now)
			if err != nil {
				results[name] = gate.Result{Message: err.Error()}
				continue
			}
			*s.in.silences = append(*s.in.silences, rec)
		}
	}
	sortSilences(*s.in.silences)
}

func (s *scope) silenceFailed(k silenceKey, err error) {
	if s.silenceErr == nil {
		s.silenceErr = map[gateKey]error{}
	}
	s.silenceErr[gateKey{k.group, k.gate}] = err
}

func findSilence(list []v1alpha1.SilenceStatus, k silenceKey) *v1alpha1.SilenceStatus {
	for i := range list {
		if keyOf(list[i]) == k {
			return &list[i]
		}
	}
	return nil
}

func sortSilences(list []v1alpha1.SilenceStatus) {
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

// silenceRetry is how soon a silence Alertmanager did not extend or expire is tried again.
const silenceRetry = 5 * time.Second

// silenceRecheck is when the operation must look again for its silences: when the first is due
// for extension (half a lease before the end this manager set), or soon for one it failed to
// extend or expire; zero when none needs it (a silence past its maxDuration waits for its task's end).
func (r *Reconciler) silenceRecheck(list []v1alpha1.SilenceStatus) time.Duration {
	var soonest time.Duration
	now := r.now()
	for _, rec := range list {
		end := r.silenceEnd(rec.ID)
		var d time.Duration
		switch {
		case end.IsZero():
			d = silenceRetry
		case !end.After(now):
			continue
		default:
			d = max(end.Sub(now)-r.silenceLease()/2, time.Second)
		}
		if soonest == 0 || d < soonest {
			soonest = d
		}
	}
	return soonest
}

// expireLeftSilences expires the silences a finished operation still records (their expiry
// failed before it finished) and drops their records.
func (r *Reconciler) expireLeftSilences(ctx context.Context, op *v1alpha1.NodeOperation) (ctrl.Result, error) {
	if len(op.Status.Silences) == 0 {
		return ctrl.Result{}, nil
	}
	urls := map[silenceKey]string{}
	eff := func(gates []v1alpha1.Gate, group string) {
		for name, g := range silenceGates(gates) {
			urls[silenceKey{group: group, gate: name}] = g.Alertmanager.URL
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
		url, ok := urls[silenceKey{group: rec.Group, gate: rec.Gate}]
		if !ok {
			continue
		}
		if err := r.Silences.Expire(ctx, url, rec.ID); err != nil {
			left = append(left, rec)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		r.setSilenceEnd(rec.ID, time.Time{})
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
