// Package statuswrite is the one way nodeops writes an object's status, after cluster-api's
// util/patch.Helper: Write, under the writer's Rule. Every status write of every nodeops kind
// goes through it: the NodeOperation, NodeProfile and ClusterTarget controllers (through the
// reconcile skeleton), the manager's NodeTask conditions (internal/controller/nodetask) and the
// agent's NodeTask records, heartbeats and notes (internal/agent). It is a package of its own so
// that the agent, which links no controller, writes through it too.
//
// It imports nothing of nodeops: it knows statuses only as JSON.
package statuswrite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ErrStale is what Write returns (wrapped, with the API server's error) when the status was
// decided on an object older than the API server's, or the object is gone: nothing was written,
// and the writer acts on nothing it decided; it reads again and decides again.
var ErrStale = errors.New("status decided on a stale object")

// Fields is the part of an object's status a writer owns: one writer per field (the kubelet alone
// writes a Pod's status). A NodeTask's status is split between its agent and the manager
// (v1alpha1.NodeTaskStatus); every other kind's status has one writer, its controller.
type Fields int

const (
	// AllFields: the whole status (a controller of its own kind).
	AllFields Fields = iota
	// AllButConditions: every field but conditions (a NodeTask's agent; conditions are the manager's).
	AllButConditions
	// ConditionsOnly: conditions alone (the manager on a NodeTask; the other fields are the agent's).
	ConditionsOnly
)

const conditions = "conditions"

func (f Fields) owns(field string) bool {
	switch f {
	case AllButConditions:
		return field != conditions
	case ConditionsOnly:
		return field == conditions
	}
	return true
}

func (f Fields) String() string {
	return [...]string{"the whole status", "every status field but conditions", "status.conditions alone"}[f]
}

// Rule is one writer's rule for writing status; Write is the one function that applies it.
//
// The conflict rule, the same for every writer: the patch holds only the writer's own Fields,
// and of conditions only those in Owned may change (a change to another writer's field or
// condition is an error, never written). It goes whole (every owned field, null for each one
// gone); with Lock it carries the resourceVersion read, so a write decided on a stale copy is
// refused. A refused write, or a vanished object, returns ErrStale, and the writer acts on nothing
// it decided (intent recorded before action, rule 4): it reads again and decides again.
type Rule struct {
	// Kind names the objects in errors.
	Kind string
	// Fields is the part of status this writer owns; the zero value is all of it.
	Fields Fields
	// Owned are the condition types this writer sets and clears (when it owns conditions).
	Owned []string
	// Lock makes each write conditional on the resourceVersion read (optimistic lock).
	Lock bool
	// Changed sends only the fields that changed, for a writer's lock-free signs beside its own
	// locked records (the agent's heartbeat and notes): a stale copy then sets back nothing.
	Changed bool
}

// Change is one status write: Obj carries the decided status, Orig is Obj as it was read.
type Change struct {
	Orig, Obj client.Object
	// Urgent changes (a phase, a condition's state) go at once; others at most once per Interval.
	Urgent   bool
	Interval time.Duration
	Now      time.Time
}

// Written is what a Write did.
type Written int

const (
	// Unchanged: the status equals the one read; nothing was written.
	Unchanged Written = iota
	// Throttled: a change that is not urgent waits for the interval; the result says when.
	Throttled
	// Wrote: the API server took the new status (and Obj holds the object it returned).
	Wrote
)

// Write writes w.Obj's status under rule, throttled by throttle (keyed by the object's name; nil
// for none), and says what it did; ErrStale (wrapped) when the API server holds a newer object or none.
func Write(ctx context.Context, c client.Client, rule Rule, throttle *Throttle, w Change) (Written, ctrl.Result, error) {
	name := w.Obj.GetName()
	before, err := statusOf(w.Orig)
	if err != nil {
		return Unchanged, ctrl.Result{}, err
	}
	after, err := statusOf(w.Obj)
	if err != nil {
		return Unchanged, ctrl.Result{}, err
	}
	if reflect.DeepEqual(before, after) {
		return Unchanged, ctrl.Result{}, nil
	}
	if f := rule.foreignField(before, after); f != "" {
		return Unchanged, ctrl.Result{}, fmt.Errorf("%s %s: status.%s is not this writer's to write (it writes %s)", rule.Kind, name, f, rule.Fields)
	}
	if t := rule.foreignCondition(before, after); t != "" {
		return Unchanged, ctrl.Result{}, fmt.Errorf("%s %s: condition %s is not this writer's to write", rule.Kind, name, t)
	}
	if wait := throttle.Wait(name, w.Urgent, w.Interval, w.Now); wait > 0 {
		return Throttled, ctrl.Result{RequeueAfter: wait}, nil
	}
	before, after = rule.own(before), rule.own(after)
	var status any
	if rule.Changed {
		status = changed(before, after)
	} else {
		status = whole(before, after)
	}
	body := map[string]any{"status": status}
	if rule.Lock {
		body["metadata"] = map[string]any{"resourceVersion": w.Orig.GetResourceVersion()}
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return Unchanged, ctrl.Result{}, fmt.Errorf("encode status of %s %s: %w", rule.Kind, name, err)
	}
	err = c.Status().Patch(ctx, w.Obj, client.RawPatch(types.MergePatchType, raw))
	switch {
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		return Unchanged, ctrl.Result{}, fmt.Errorf("write status of %s %s: %w", rule.Kind, name, errors.Join(ErrStale, err))
	case err != nil:
		return Unchanged, ctrl.Result{}, fmt.Errorf("write status of %s %s: %w", rule.Kind, name, err)
	}
	throttle.Wrote(name, w.Now)
	return Wrote, ctrl.Result{}, nil
}

// foreignField is a status field that differs between before and after and is not the writer's, or "".
func (rule Rule) foreignField(before, after map[string]any) string {
	keys := joinKeys(before, after)
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if !rule.Fields.owns(k) && !reflect.DeepEqual(before[k], after[k]) {
			return k
		}
	}
	return ""
}

// foreignCondition is a condition type that differs between before and after and is not owned, or "".
func (rule Rule) foreignCondition(before, after map[string]any) string {
	if !rule.Fields.owns(conditions) {
		return "" // foreignField has refused any change to them
	}
	b, a := conditionsByType(before), conditionsByType(after)
	for t := range joinKeys(a, b) {
		if !slices.Contains(rule.Owned, t) && !reflect.DeepEqual(a[t], b[t]) {
			return t
		}
	}
	return ""
}

// own is status less the fields that are not the writer's, which its patch then never holds.
func (rule Rule) own(status map[string]any) map[string]any {
	if rule.Fields == AllFields || status == nil {
		return status
	}
	out := make(map[string]any, len(status))
	for k, v := range status {
		if rule.Fields.owns(k) {
			out[k] = v
		}
	}
	return out
}

func joinKeys(a, b map[string]any) map[string]bool {
	out := make(map[string]bool, len(a)+len(b))
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

func conditionsByType(status map[string]any) map[string]any {
	list, _ := status[conditions].([]any)
	out := make(map[string]any, len(list))
	for _, c := range list {
		if m, ok := c.(map[string]any); ok {
			if t, ok := m["type"].(string); ok {
				out[t] = m
			}
		}
	}
	return out
}

// statusOf is o's status as the API server would store it.
func statusOf(o client.Object) (map[string]any, error) {
	raw, err := json.Marshal(o)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", o.GetName(), err)
	}
	var m struct {
		Status map[string]any `json:"status"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("decode %s: %w", o.GetName(), err)
	}
	return m.Status, nil
}

// whole is after as a merge patch over before that leaves nothing of before's: every field of
// after, unchanged ones too (a field the stored object lacks is then never left half written),
// and null for every field gone.
func whole(before, after any) any {
	b, okB := before.(map[string]any)
	a, okA := after.(map[string]any)
	if !okA {
		return after
	}
	out := make(map[string]any, len(a)+len(b))
	for k, v := range a {
		out[k] = whole(b[k], v)
	}
	if okB {
		for k := range b {
			if _, ok := a[k]; !ok {
				out[k] = nil
			}
		}
	}
	return out
}

// changed is after as a merge patch over before of what differs alone: changed fields (objects
// field by field, lists whole), null for every field gone.
func changed(before, after map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range after {
		if reflect.DeepEqual(before[k], v) {
			continue
		}
		b, okB := before[k].(map[string]any)
		a, okA := v.(map[string]any)
		if okB && okA {
			out[k] = changed(b, a)
			continue
		}
		out[k] = v
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			out[k] = nil
		}
	}
	return out
}
