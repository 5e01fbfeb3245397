package nodelock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// LedgerName is the ConfigMap, in the manager's namespace, that is the budget ledger.
const LedgerName = "nodeops-budget-ledger"

// DefaultLedgerGrace is how long a ledger entry whose task this manager's cache has not seen
// counts as held without asking the API server, from when this manager first read it (its own
// clock, so managers' clocks need not agree): another manager writes the entry just before it
// creates the task, so for that while "not in my cache" means "created by someone else, not yet
// seen", not "gone".
const DefaultLedgerGrace = time.Minute

// DefaultLedgerMaxBytes keeps the ConfigMap under the API server's 1 MiB limit for its data, with
// room for its metadata. An entry is the node's name twice at most, the owner's and group's names
// and ten digits; with 40-character node names some 10,000 nodes are held at once. Beyond it the
// claims wait, as for a budget spent, and a later batch takes their room.
const DefaultLedgerMaxBytes = 1000 * 1000

// maxAsks bounds the API reads one ledger decision makes for entries its cache does not know, so
// that a manager started after thousands of tasks were deleted does not hold its lock for long;
// entries beyond are counted, and decided by later decisions, which remember what the API server
// said of these (Ledger.ended), so the reads of successive decisions add up.
const maxAsks = 32

// Ledger is the API server's record of which NodeTask each node was given to, one ConfigMap that
// every manager updates with its resourceVersion before it creates tasks (budgets are
// cluster-wide, rule 11). A manager's own table sees another manager's tasks only once its cache has them, so
// two managers acting at once (leader election off, or an old leader's creates landing late)
// would each spend the same budget room; the ledger's optimistic concurrency orders their
// decisions: the second write conflicts, rereads the first one's entries, and counts them.
//
// An entry is the node's key with the value "<task> <unix seconds written>", the task's name
// ending "-*" when it is "<prefix>-<node>". It stops counting once a manager's cache shows its
// task no longer holding (it ended or was deleted, or was told to abort and is not running), or,
// when the cache does not know the task Grace after the manager first read the entry, once the
// API server says the task is gone or not holding. Entries that stopped counting are removed by
// the next write, so a node costs one ledger write per batch of creates and none to release it.
type Ledger struct {
	// Client writes the ConfigMap.
	Client client.Client
	// APIReader reads the ConfigMap after a conflict, and tasks the cache does not know, from the
	// API server itself.
	APIReader client.Reader
	// Cache reads tasks from the manager's cache.
	Cache client.Reader
	// Key names the ConfigMap.
	Key types.NamespacedName
	// Grace is DefaultLedgerGrace when zero.
	Grace time.Duration
	// MaxBytes is DefaultLedgerMaxBytes when zero.
	MaxBytes int
	// Now is time.Now when nil.
	Now func() time.Time

	mu sync.Mutex
	// last is the ConfigMap as this manager last wrote or read it; a write from it that conflicts
	// rereads it.
	last *corev1.ConfigMap
	// firstRead is when this manager first needed the grace of an entry its cache does not know,
	// by node, for that entry's value only.
	firstRead map[string]readAt
	// ended is, by node, the value of an entry the API server said no longer holds (its task gone
	// or finished): a later decision drops it without asking again, so that the bounded reads of
	// successive decisions add up when more stale entries than one decision may read fill a budget.
	ended map[string]string
}

// readAt is when an entry's value was first read.
type readAt struct {
	value string
	at    time.Time
}

// NewLedger is the budget ledger in namespace of the manager whose clients c are: it writes and
// rereads the ConfigMap through the API server and reads tasks from the cache.
func NewLedger(c cluster.Cluster, namespace string) *Ledger {
	return &Ledger{Client: c.GetClient(), APIReader: c.GetAPIReader(), Cache: c.GetClient(),
		Key: types.NamespacedName{Namespace: namespace, Name: LedgerName}}
}

// ledgerEntry is one node's reservation.
type ledgerEntry struct {
	task    string
	written time.Time
}

func parseEntry(node, v string) (ledgerEntry, bool) {
	task, at, ok := strings.Cut(v, " ")
	if !ok || task == "" {
		return ledgerEntry{}, false
	}
	sec, err := strconv.ParseInt(at, 10, 64)
	if err != nil {
		return ledgerEntry{}, false
	}
	if prefix, short := strings.CutSuffix(task, "-*"); short {
		task = prefix + "-" + node
	}
	return ledgerEntry{task: task, written: time.Unix(sec, 0)}, true
}

func (e ledgerEntry) value(node string) string {
	task := e.task
	if prefix, short := strings.CutSuffix(task, "-"+node); short {
		task = prefix + "-*" // "*" is in no task name
	}
	return task + " " + strconv.FormatInt(e.written.Unix(), 10)
}

// tableView is what the ledger asks of this manager's table.
type tableView struct {
	// held reports whether a task other than except holds node.
	held func(node, except string) bool
	// holding reports whether the table holds task: its own reservation, or a task the cache shows holding.
	holding func(task string) bool
	// endedSince reports whether the cache showed task not holding, or deleted, at since or later.
	endedSince func(task string, since time.Time) bool
}

// reserve records claims in the ledger within b, counting the nodes its entries hold besides the
// ones this manager's table holds and b.Down. granted[i] tells whether claims[i] was recorded;
// holders[i] names the task another manager recorded on its node when that is why not.
func (l *Ledger) reserve(ctx context.Context, claims []Claim, b Budget, tv tableView) (granted []bool, holders []Holder, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for range 10 {
		cm, err := l.current(ctx)
		if err != nil {
			return nil, nil, err
		}
		granted, holders, data, changed := l.decide(ctx, cm.Data, claims, b, tv)
		if !changed {
			return granted, holders, nil
		}
		next := cm.DeepCopy()
		next.Data = data
		if next.ResourceVersion == "" {
			err = l.Client.Create(ctx, next)
			if apierrors.IsNotFound(err) {
				return nil, nil, fmt.Errorf("create budget ledger ConfigMap %s: namespace %s not found (it is the manager's --leader-election-namespace): %w", l.Key, l.Key.Namespace, err)
			}
		} else {
			err = l.Client.Update(ctx, next)
		}
		switch {
		case err == nil:
			l.last = next
			return granted, holders, nil
		case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err):
			l.last = nil // another manager wrote it, or someone deleted it: read it and decide again
		default:
			l.last = nil
			return nil, nil, fmt.Errorf("write budget ledger ConfigMap %s: %w", l.Key, err)
		}
	}
	return nil, nil, fmt.Errorf("write budget ledger ConfigMap %s: ten conflicts in a row", l.Key)
}

// current is the ConfigMap as last written, or read from the API server; a new one when there is none.
func (l *Ledger) current(ctx context.Context) (*corev1.ConfigMap, error) {
	if l.last != nil {
		return l.last, nil
	}
	cm := &corev1.ConfigMap{}
	err := l.APIReader.Get(ctx, l.Key, cm)
	if apierrors.IsNotFound(err) {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: l.Key.Namespace, Name: l.Key.Name,
			Labels: map[string]string{"app.kubernetes.io/name": "nodeops"}}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read budget ledger ConfigMap %s: %w", l.Key, err)
	}
	l.last = cm
	return cm, nil
}

// decide is reserve's step on one version of the ledger: the entries that still count, the
// claims granted within b, and the data to write when anything was granted.
func (l *Ledger) decide(ctx context.Context, old map[string]string, claims []Claim, b Budget, tv tableView) (granted []bool, holders []Holder, data map[string]string, changed bool) {
	claimed := make(map[string]string, len(claims)) // node -> claiming task
	for _, c := range claims {
		claimed[c.Node] = c.Task
	}
	inBudget := make(map[string]bool, len(b.Nodes))
	for _, n := range b.Nodes {
		inBudget[n] = true
	}
	now := l.now()
	for node, r := range l.firstRead {
		if old[node] != r.value {
			delete(l.firstRead, node) // the entry is gone, or another now
		}
	}
	for node, v := range l.ended {
		if old[node] != v {
			delete(l.ended, node)
		}
	}

	// Entries that count, and the data to write: only those, so ended holds leave with the next
	// write. Asking the API server costs a read: first for the nodes this decision counts, then,
	// with the reads left, for the others, so that entries of nodes no budget counts leave too.
	live := map[string]ledgerEntry{}
	data = make(map[string]string, len(old)+len(claims))
	asks := maxAsks
	for _, pass := range []bool{true, false} {
		for node, v := range old {
			if concerned := inBudget[node] || claimed[node] != ""; concerned != pass {
				continue
			}
			e, ok := parseEntry(node, v)
			if !ok {
				continue // not ours to read: dropped on the next write
			}
			if l.counts(ctx, node, v, e, tv, &asks) {
				live[node] = e
				data[node] = v
			}
		}
	}

	unavailable := 0
	for _, n := range b.Nodes {
		e, recorded := live[n]
		down := b.Down != nil && b.Down(n)
		if task := claimed[n]; task != "" && (!recorded || e.task == task) && !tv.held(n, task) && !down {
			continue // counted below, as it is granted
		}
		if recorded || tv.held(n, "") || down {
			unavailable++
		}
	}
	size, limit := dataSize(data), l.maxBytes()
	granted, holders = make([]bool, len(claims)), make([]Holder, len(claims))
	for i, c := range claims {
		e, recorded := live[c.Node]
		down := b.Down != nil && b.Down(c.Node)
		value := ledgerEntry{task: c.Task, written: now}.value(c.Node)
		switch {
		case recorded && e.task != c.Task:
			holders[i] = Holder{Task: e.task}
			continue
		case !recorded && size+len(c.Node)+len(value) > limit:
			continue // no room in the ConfigMap: waits as for a budget spent
		case down:
			// Unavailable already, and counted: a task on it spends nothing more.
		case recorded:
			// Recorded already (a create that is being retried): it holds its room.
			unavailable++
		case unavailable >= b.Limit:
			continue
		default:
			unavailable++
		}
		granted[i] = true
		if recorded {
			continue
		}
		data[c.Node] = value
		size += len(c.Node) + len(value)
		changed = true
	}
	return granted, holders, data, changed
}

// counts reports whether entry e (node's, of value v) still holds its node: this
// manager's table holds its task (its own reservation, or a task the cache shows holding); or the
// cache has not shown that task ending since the entry was written (deleted, finished, or an
// earlier task of that name), and this manager first read it less than Grace ago or, while asks
// are left, the API server shows the task holding.
func (l *Ledger) counts(ctx context.Context, node, v string, e ledgerEntry, tv tableView, asks *int) bool {
	if tv.holding(e.task) {
		return true
	}
	if tv.endedSince(e.task, e.written) {
		return false
	}
	// The entry is written just before the create; a task of that name created before is an
	// earlier one, since deleted and made again.
	task := &v1alpha1.NodeTask{}
	err := l.Cache.Get(ctx, client.ObjectKey{Name: e.task}, task)
	if err == nil && !task.CreationTimestamp.Time.Before(e.written.Add(-incarnationSlack)) {
		return Holds(task)
	}
	if l.firstRead == nil {
		l.firstRead = map[string]readAt{}
	}
	r, ok := l.firstRead[node]
	if !ok {
		r = readAt{value: v, at: l.now()}
		l.firstRead[node] = r
	}
	if l.now().Sub(r.at) < l.grace() {
		return true
	}
	if l.ended[node] == v {
		return false
	}
	if *asks <= 0 {
		return true
	}
	*asks--
	err = l.APIReader.Get(ctx, client.ObjectKey{Name: e.task}, task)
	holds := true // an error is unknown: the safe side
	switch {
	case apierrors.IsNotFound(err):
		holds = false // never created (its manager stopped first), or deleted
	case err == nil:
		holds = Holds(task)
	}
	if !holds {
		// A task that stopped holding never holds again, and a missing one only if its manager
		// creates it after the grace, which the next write's drop would not survive either.
		if l.ended == nil {
			l.ended = map[string]string{}
		}
		l.ended[node] = v
	}
	return holds
}

func (l *Ledger) grace() time.Duration {
	if l.Grace > 0 {
		return l.Grace
	}
	return DefaultLedgerGrace
}

func (l *Ledger) maxBytes() int {
	if l.MaxBytes > 0 {
		return l.MaxBytes
	}
	return DefaultLedgerMaxBytes
}

func (l *Ledger) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

func dataSize(data map[string]string) int {
	n := 0
	for k, v := range data {
		n += len(k) + len(v)
	}
	return n
}
