package metrics

import (
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Reasons a gate failed (nodeops_gate_failures_total): it held its group for its whole timeout,
// either because what it checked said no (Held) or because it could not be checked at all
// (Unevaluable: an unreachable server, an expression that fails, a silence Alertmanager refused;
// a gate that cannot be evaluated blocks, rule 14).
const (
	GateFailureHeld        = "Held"
	GateFailureUnevaluable = "Unevaluable"
)

// gateCounts counts, from the NodeOperation changes the manager observes, each time a gate began
// holding a group (entered Waiting) and each time it blocked its operation (entered TimedOut):
// once per gate record and Since, as the status records it, so a status written again or seen by
// a second informer event is not counted twice. Like failures, records already there when the
// manager starts are not counted.
type gateCounts struct {
	mu     sync.Mutex
	seen   map[types.UID]map[gateEntry]bool
	waits  map[string]float64    // gate
	failed map[[2]string]float64 // gate, reason
}

type gateEntry struct {
	group, gate string
	state       v1alpha1.GateState
	since       int64
}

func newGateCounts() *gateCounts {
	return &gateCounts{seen: map[types.UID]map[gateEntry]bool{}, waits: map[string]float64{}, failed: map[[2]string]float64{}}
}

func (g *gateCounts) observe(op *v1alpha1.NodeOperation, count bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, st := range op.Status.Gates {
		if st.State != v1alpha1.GateWaiting && st.State != v1alpha1.GateTimedOut {
			continue
		}
		e := gateEntry{st.Group, st.Name, st.State, st.Since.UnixNano()}
		if g.seen[op.UID][e] {
			continue
		}
		if g.seen[op.UID] == nil {
			g.seen[op.UID] = map[gateEntry]bool{}
		}
		g.seen[op.UID][e] = true
		if !count {
			continue
		}
		if st.State == v1alpha1.GateWaiting {
			g.waits[st.Name]++
		} else {
			g.failed[[2]string{st.Name, gateFailureReason(st.Message)}]++
		}
	}
}

// gateFailureReason tells a gate that could not be evaluated from one that said no: the gates'
// messages for the first kind all begin "cannot " (internal/gate, the silences).
func gateFailureReason(message string) string {
	if strings.HasPrefix(message, "cannot ") {
		return GateFailureUnevaluable
	}
	return GateFailureHeld
}

func (g *gateCounts) forget(obj any) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if op, ok := obj.(*v1alpha1.NodeOperation); ok {
		g.mu.Lock()
		delete(g.seen, op.UID)
		g.mu.Unlock()
	}
}

func (g *gateCounts) snapshot() (waits map[string]float64, failed map[[2]string]float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	waits = make(map[string]float64, len(g.waits))
	for k, v := range g.waits {
		waits[k] = v
	}
	failed = make(map[[2]string]float64, len(g.failed))
	for k, v := range g.failed {
		failed[k] = v
	}
	return waits, failed
}
