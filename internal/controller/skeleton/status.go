package skeleton

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

// StaleRetry is when a reconcile whose status write met a newer object (or none) looks again.
const StaleRetry = 100 * time.Millisecond

// ErrStale is what WriteStatus returns when the decision was made on an object older than the
// API server's: the decision is not recorded, and Run acts on nothing and asks again in StaleRetry.
var ErrStale = errors.New("status decided on a stale object")

// StatusRule is a controller's rule for writing its objects' status, after cluster-api's patch
// helper; WriteStatus is the one function that applies it. The conflict rule: the status goes
// whole (a merge patch setting every field and clearing those gone); with Lock, it carries the
// resourceVersion read, so a write decided on a stale copy is refused; a refused write or a
// vanished object returns ErrStale, and nothing acts on a decision that was not recorded (intent
// before action). Only the conditions in Owned may change; one that another writer owns is an
// error, never written over.
type StatusRule struct {
	// Kind names the objects in errors.
	Kind string
	// Owned are the condition types this controller sets and clears.
	Owned []string
	// Lock makes each write conditional on the resourceVersion read (optimistic lock).
	Lock bool
}

// StatusWrite is one status write: Obj carries the decided status, Orig is Obj as it was read.
type StatusWrite struct {
	Orig, Obj client.Object
	// Urgent changes (a phase, a condition's state) go at once; others at most once per Interval.
	Urgent   bool
	Interval time.Duration
	Now      time.Time
}

// StatusWritten is what a WriteStatus did.
type StatusWritten int

const (
	// StatusUnchanged: the status equals the one read; nothing was written.
	StatusUnchanged StatusWritten = iota
	// StatusThrottled: a change that is not urgent waits for the interval; the result says when.
	StatusThrottled
	// StatusWrote: the API server took the new status.
	StatusWrote
)

// WriteStatus writes w.Obj's status under rule, throttled by throttle (keyed by the object's
// name), and says what it did; ErrStale (wrapped) when the API server holds a newer object or none.
func WriteStatus(ctx context.Context, c client.Client, rule StatusRule, throttle *StatusThrottle, w StatusWrite) (StatusWritten, ctrl.Result, error) {
	name := w.Obj.GetName()
	before, err := statusOf(w.Orig)
	if err != nil {
		return StatusUnchanged, ctrl.Result{}, err
	}
	after, err := statusOf(w.Obj)
	if err != nil {
		return StatusUnchanged, ctrl.Result{}, err
	}
	if reflect.DeepEqual(before, after) {
		return StatusUnchanged, ctrl.Result{}, nil
	}
	if t := rule.foreignCondition(before, after); t != "" {
		return StatusUnchanged, ctrl.Result{}, fmt.Errorf("%s %s: condition %s is not this controller's to write", rule.Kind, name, t)
	}
	if wait := throttle.Wait(name, w.Urgent, w.Interval, w.Now); wait > 0 {
		return StatusThrottled, ctrl.Result{RequeueAfter: wait}, nil
	}
	body := map[string]any{"status": whole(before, after)}
	if rule.Lock {
		body["metadata"] = map[string]any{"resourceVersion": w.Orig.GetResourceVersion()}
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return StatusUnchanged, ctrl.Result{}, fmt.Errorf("encode status of %s %s: %w", rule.Kind, name, err)
	}
	err = c.Status().Patch(ctx, w.Obj, client.RawPatch(types.MergePatchType, raw))
	switch {
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		return StatusUnchanged, ctrl.Result{}, fmt.Errorf("write status of %s %s: %w", rule.Kind, name, errors.Join(ErrStale, err))
	case err != nil:
		return StatusUnchanged, ctrl.Result{}, fmt.Errorf("write status of %s %s: %w", rule.Kind, name, err)
	}
	throttle.Wrote(name, w.Now)
	return StatusWrote, ctrl.Result{}, nil
}

// foreignCondition is a condition type that differs between before and after and is not owned, or "".
func (rule StatusRule) foreignCondition(before, after map[string]any) string {
	b, a := conditionsByType(before), conditionsByType(after)
	for t := range joinKeys(a, b) {
		if !slices.Contains(rule.Owned, t) && !reflect.DeepEqual(a[t], b[t]) {
			return t
		}
	}
	return ""
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
	list, _ := status["conditions"].([]any)
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
