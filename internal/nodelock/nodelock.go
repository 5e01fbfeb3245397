// Package nodelock is the manager's table of which NodeTask holds which node: one task per node
// (rule 1 of docs/design.md), a node runs at most one NodeTask at a time, across all operations and
// profiles.
//
// The table is fed by the NodeTask informer and, synchronously, by the controllers that create
// tasks: a controller acquires the node before it creates the task, so a cache that has not yet
// seen the new task can never let a second task onto the node. The table itself costs no API
// writes; with a Ledger (ledger.go) each batch of acquisitions within a budget costs one, so that
// managers acting at once order their budget decisions through the API server.
//
// It holds no controller's policy and writes nothing but its budget ledger (a ConfigMap in the manager's
// namespace); deciders read only its plain-data View.
package nodelock

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Holder names the task holding a node and what owns it.
type Holder struct {
	// Task is the NodeTask's name.
	Task string
	// Owner is "NodeOperation/<name>" or "NodeProfile/<name>".
	Owner string
}

func (h Holder) String() string {
	if h.Owner == "" {
		return "NodeTask " + h.Task
	}
	return fmt.Sprintf("NodeTask %s of %s", h.Task, h.Owner)
}

// OperationOwner is the Owner of tasks created for the NodeOperation name.
func OperationOwner(name string) string { return "NodeOperation/" + name }

// ProfileOwner is the Owner of tasks created for the NodeProfile name.
func ProfileOwner(name string) string { return "NodeProfile/" + name }

// OwnerOf reads a task's owner from its controller reference.
func OwnerOf(t *v1alpha1.NodeTask) string {
	for _, ref := range t.OwnerReferences {
		if ref.Controller != nil && *ref.Controller {
			return ref.Kind + "/" + ref.Name
		}
	}
	return ""
}

// Holds reports whether the task holds its node: it is pending, running or failed, and not a
// task that was told to abort and is not running (the agent will only end it). A failed gate
// check (v1alpha1.IsGateCheck) that its agent recorded failed holds nothing: its failure is the gate's answer, which holds the
// operation, not the node; a failed task that only carries the label still holds it.
func Holds(t *v1alpha1.NodeTask) bool {
	phase := t.EffectivePhase()
	if !phase.Unfinished() {
		return false
	}
	// The agent's own word: a check the manager marked lost may still be running its script.
	if t.Status.Phase == v1alpha1.TaskFailed && v1alpha1.IsGateCheck(t) {
		return false
	}
	return !t.Spec.Abort || phase == v1alpha1.TaskRunning
}

type entry struct {
	owner string
	node  string
	// seen: the informer has delivered the task; until then the entry is a reservation made by
	// the creating controller, kept whatever the cache says about other tasks.
	seen bool
	// reserved is when a reservation was made, and uid the task's once its create returned or the
	// cache showed it, to tell an earlier task of the same name (a NodeProfile deletes the task it
	// supersedes, then creates one of that name) from this one.
	reserved time.Time
	uid      types.UID
	created  time.Time
}

// incarnationSlack is how much earlier than its reservation (or its ledger entry) a task may have
// been created and still be that reservation's task: the manager's and the API server's clocks
// may be a little apart. A task created earlier still is an earlier one of the same name.
const incarnationSlack = 5 * time.Second

// earlier reports whether task, of e's name, is an earlier task than the one e holds for: another
// UID created before e's once e knows its own, else, for a reservation, one created before it was made.
func (e *entry) earlier(task *v1alpha1.NodeTask) bool {
	if e.uid != "" && task.UID != "" {
		return task.UID != e.uid && task.CreationTimestamp.Time.Before(e.created)
	}
	return !e.seen && !task.CreationTimestamp.IsZero() && task.CreationTimestamp.Time.Before(e.reserved.Add(-incarnationSlack))
}

// end is when the cache showed a task not holding, or deleted, and when that task was created.
type end struct{ at, created time.Time }

// Table maps nodes to the tasks holding them. The zero value is not usable; call New.
type Table struct {
	// acquire orders this manager's AcquireWithin calls end to end, ledger write included.
	acquire sync.Mutex
	ledger  *Ledger

	mu     sync.Mutex
	byNode map[string]map[string]*entry // node -> task -> entry
	byTask map[string]*entry
	// ended is when the cache last showed each task not holding, or deleted, for the ledger: an
	// entry of a task that ended since it was written counts no more (kept endedFor).
	ended       map[string]end
	endedPruned time.Time
	synced      func() bool
}

// New returns an empty table. Until Start has been called and the informer has delivered its
// initial list, Synced is false and callers must not acquire.
func New() *Table {
	return &Table{byNode: map[string]map[string]*entry{}, byTask: map[string]*entry{}, ended: map[string]end{}}
}

// Start registers the table with the cache's NodeTask informer. Call it once, before the
// manager starts (from main, next to the controllers' setup).
func (t *Table) Start(ctx context.Context, c cache.Cache) error {
	inf, err := c.GetInformer(ctx, &v1alpha1.NodeTask{})
	if err != nil {
		return fmt.Errorf("get NodeTask informer: %w", err)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.observe(obj) },
		UpdateFunc: func(_, obj any) { t.observe(obj) },
		DeleteFunc: func(obj any) { t.forget(obj) },
	})
	if err != nil {
		return fmt.Errorf("watch NodeTasks for the node lock: %w", err)
	}
	t.mu.Lock()
	t.synced = reg.HasSynced
	t.mu.Unlock()
	return nil
}

// UseLedger makes AcquireWithin record its grants in l before it returns them. Call it once,
// before the manager starts.
func (t *Table) UseLedger(l *Ledger) { t.ledger = l }

// Synced reports whether the table has seen every task that existed when the manager started.
// A table never started (tests feeding Observe directly) counts as synced.
func (t *Table) Synced() bool {
	t.mu.Lock()
	synced := t.synced
	t.mu.Unlock()
	return synced == nil || synced()
}

// TryAcquire gives node to task (owned by owner) unless another task holds it, in which case it
// returns that holder and false. Acquiring a node the task already holds succeeds. The caller
// creates the task after a successful acquire, and calls Release if the create fails.
func (t *Table) TryAcquire(node, task, owner string) (Holder, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if h, ok := t.holderLocked(node, task); ok {
		return h, false
	}
	if _, ok := t.byTask[task]; !ok {
		t.putLocked(task, &entry{owner: owner, node: node, reserved: t.now()})
	}
	return Holder{}, true
}

// Claim is one node a controller wants for one of its tasks.
type Claim struct{ Node, Task string }

// Budget is a maxUnavailable limit over a group's or a profile's nodes, for AcquireWithin.
type Budget struct {
	// Nodes are the nodes the limit covers.
	Nodes []string
	// Down reports a node unavailable for a reason the table cannot see (NotReady, cordoned); nil for none.
	Down func(node string) bool
	// Limit is the most nodes of Nodes that may be unavailable.
	Limit int
}

// AcquireWithin acquires the claims' nodes in order for owner, as TryAcquire does, while the
// budget's unavailable nodes (held by any task, or Down) stay within its limit; a claim on a node
// Down already spends nothing and is always granted. The count and
// the acquisitions are one step under the table's lock, so controllers deciding at the same
// moment (two operations, an operation and a profile) cannot each spend the same last room
// (budgets are cluster-wide, rule 11). With a ledger, the grants are then recorded there, counting
// the nodes other managers recorded too; a claim the ledger refuses is given back. ok[i] tells
// whether claim i was acquired; holders[i] names the task holding its node when another does, and
// is empty when it was refused for want of room. On an error this call acquired nothing.
func (t *Table) AcquireWithin(ctx context.Context, owner string, claims []Claim, b Budget) ([]bool, []Holder, error) {
	t.acquire.Lock()
	defer t.acquire.Unlock()
	ok, fresh, holders := t.acquireWithin(owner, claims, b)
	if t.ledger == nil {
		return ok, holders, nil
	}
	var got []Claim
	var at []int
	for i, c := range claims {
		if ok[i] {
			got, at = append(got, c), append(at, i)
		}
	}
	if len(got) == 0 {
		return ok, holders, nil
	}
	held := func(node, except string) bool {
		t.mu.Lock()
		defer t.mu.Unlock()
		_, h := t.holderLocked(node, except)
		return h
	}
	recorded, others, err := t.ledger.reserve(ctx, got, b, tableView{held: held, holding: t.Held, endedSince: t.endedSince})
	for j, i := range at {
		if err == nil && recorded[j] {
			continue
		}
		if fresh[i] {
			t.Release(claims[i].Node, claims[i].Task) // one acquired before keeps its task's hold
		}
		ok[i] = false
		if err == nil {
			holders[i] = others[j]
		}
	}
	return ok, holders, err
}

// acquireWithin is AcquireWithin in the table alone; fresh[i] tells whether claim i was acquired
// by this call (not before).
func (t *Table) acquireWithin(owner string, claims []Claim, b Budget) (ok, fresh []bool, holders []Holder) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	unavailable := 0
	for _, n := range b.Nodes {
		if len(t.byNode[n]) > 0 || (b.Down != nil && b.Down(n)) {
			unavailable++
		}
	}
	ok, fresh, holders = make([]bool, len(claims)), make([]bool, len(claims)), make([]Holder, len(claims))
	for i, c := range claims {
		if h, held := t.holderLocked(c.Node, c.Task); held {
			holders[i] = h
			continue
		}
		if _, mine := t.byTask[c.Task]; mine {
			ok[i] = true // already acquired: counted above
			continue
		}
		if b.Down != nil && b.Down(c.Node) {
			// Unavailable already, and counted: a task on it spends nothing more.
			t.putLocked(c.Task, &entry{owner: owner, node: c.Node, reserved: now})
			ok[i], fresh[i] = true, true
			continue
		}
		if unavailable >= b.Limit {
			continue
		}
		t.putLocked(c.Task, &entry{owner: owner, node: c.Node, reserved: now})
		unavailable++
		ok[i], fresh[i] = true, true
	}
	return ok, fresh, holders
}

// Release drops a reservation whose task was never created. A task the informer has already
// delivered stays: only the cache can say it no longer holds the node.
func (t *Table) Release(node, task string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byTask[task]; ok && !e.seen && e.node == node {
		t.deleteLocked(task)
	}
}

// View is the table as plain data at one moment, for decisions that take no locks: a pure
// decide reads it, and the act step that follows acquires for real (TryAcquire), so a node taken
// in between is only passed over for a round.
type View struct {
	// Nodes maps each held node to a task holding it (the first by name when several do).
	Nodes map[string]Holder
	// Reserved maps the tasks acquired by a controller that the informer has not delivered yet
	// to their nodes. Every other holding task is in the cache already: the informer updates the
	// cache before it tells the table.
	Reserved map[string]string
}

// Holder returns the task holding node in the view, if any.
func (v View) Holder(node string) (Holder, bool) {
	h, ok := v.Nodes[node]
	return h, ok
}

// IsReserved reports whether task is a reservation in the view: acquired, not yet in the cache.
func (v View) IsReserved(task string) bool {
	_, ok := v.Reserved[task]
	return ok
}

// Snapshot returns the table as a View; it costs one pass over the held nodes, not over all nodes.
func (t *Table) Snapshot() View {
	t.mu.Lock()
	defer t.mu.Unlock()
	v := View{Nodes: make(map[string]Holder, len(t.byNode)), Reserved: map[string]string{}}
	for node, tasks := range t.byNode {
		first := ""
		for name := range tasks {
			if first == "" || name < first {
				first = name
			}
		}
		if first != "" {
			v.Nodes[node] = Holder{Task: first, Owner: tasks[first].owner}
		}
	}
	for name, e := range t.byTask {
		if !e.seen {
			v.Reserved[name] = e.node
		}
	}
	return v
}

// Holder returns a task holding node, if any (the first by name when, after an unclean history,
// several do).
func (t *Table) Holder(node string) (Holder, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.holderLocked(node, "")
}

// Held reports whether task holds a node according to the table, including reservations the
// cache has not seen yet.
func (t *Table) Held(task string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.byTask[task]
	return ok
}

// Observe records what the cache says about a task. Controllers need not call it: the informer does.
// A task that does not hold, of the name of a reservation but created before it, is an earlier one:
// the reservation stays.
func (t *Table) Observe(task *v1alpha1.NodeTask) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !Holds(task) {
		if e, ok := t.byTask[task.Name]; ok && e.earlier(task) {
			return
		}
		t.deleteLocked(task.Name)
		t.endLocked(task)
		return
	}
	t.putLocked(task.Name, &entry{owner: OwnerOf(task), node: task.Spec.NodeName, seen: true, uid: task.UID, created: task.CreationTimestamp.Time})
}

// Created records the task a reservation's create made (as the API server answered), so that news
// of an earlier task of its name, whenever it comes, is told apart by its UID.
func (t *Table) Created(task *v1alpha1.NodeTask) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byTask[task.Name]; ok && !e.seen && e.node == task.Spec.NodeName {
		e.uid, e.created = task.UID, task.CreationTimestamp.Time
	}
}

// Forget records that a task was deleted; the deletion of an earlier task of a reservation's name
// leaves the reservation.
func (t *Table) Forget(task *v1alpha1.NodeTask) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byTask[task.Name]; ok && e.earlier(task) {
		return
	}
	t.deleteLocked(task.Name)
	t.endLocked(task)
}

// endedFor is how long the table remembers that a task ended: longer than the ledger's grace,
// after which the ledger asks the API server about a task its cache does not know.
const endedFor = 10 * time.Minute

func (t *Table) endLocked(task *v1alpha1.NodeTask) {
	now := t.now()
	t.ended[task.Name] = end{at: now, created: task.CreationTimestamp.Time}
	if now.Sub(t.endedPruned) < time.Minute {
		return
	}
	t.endedPruned = now
	for n, e := range t.ended {
		if now.Sub(e.at) > endedFor {
			delete(t.ended, n)
		}
	}
}

// endedSince reports whether the cache showed task not holding, or deleted, at since or later, and
// that task was created at since or later too (within incarnationSlack), so not an earlier one of its name.
func (t *Table) endedSince(task string, since time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.ended[task]
	return ok && !e.at.Before(since) && !e.created.Before(since.Add(-incarnationSlack))
}

// now is the ledger's clock when there is one (the entries' times are compared with it), else the time.
func (t *Table) now() time.Time {
	if t.ledger != nil {
		return t.ledger.now()
	}
	return time.Now()
}

func (t *Table) observe(obj any) {
	if task, ok := obj.(*v1alpha1.NodeTask); ok {
		t.Observe(task)
	}
}

func (t *Table) forget(obj any) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if task, ok := obj.(*v1alpha1.NodeTask); ok {
		t.Forget(task)
	}
}

func (t *Table) holderLocked(node, except string) (Holder, bool) {
	tasks := t.byNode[node]
	names := make([]string, 0, len(tasks))
	for name := range tasks {
		if name != except {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return Holder{}, false
	}
	sort.Strings(names)
	return Holder{Task: names[0], Owner: tasks[names[0]].owner}, true
}

func (t *Table) putLocked(task string, e *entry) {
	if old, ok := t.byTask[task]; ok && old.node != e.node {
		t.deleteLocked(task)
	}
	if t.byNode[e.node] == nil {
		t.byNode[e.node] = map[string]*entry{}
	}
	t.byNode[e.node][task] = e
	t.byTask[task] = e
}

func (t *Table) deleteLocked(task string) {
	e, ok := t.byTask[task]
	if !ok {
		return
	}
	delete(t.byTask, task)
	delete(t.byNode[e.node], task)
	if len(t.byNode[e.node]) == 0 {
		delete(t.byNode, e.node)
	}
}
