package nodelock_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/testutil"
)

// startEnv starts an API server with the NodeTask CRD and the manager's namespace, where the ledger lives.
func startEnv(t *testing.T) *testutil.Env {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test` (the API server and etcd are built into bin/)")
	}
	env, err := testutil.Start("nodetasks")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	if err := env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeops-system"}}); err != nil {
		t.Fatal(err)
	}
	return env
}

// manager is one manager's view for the ledger tests: its own node lock table and a real cache
// that never sees a NodeTask (its selector matches none), the most a cache can lag behind.
type manager struct {
	name   string
	table  *nodelock.Table
	ledger *nodelock.Ledger
}

func newManager(t *testing.T, env *testutil.Env, name string, now func() time.Time) *manager {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	blind, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, ByObject: map[client.Object]cache.ByObject{
		&v1alpha1.NodeTask{}: {Label: labels.SelectorFromSet(labels.Set{"nodeops.io/never": "seen"})},
	}})
	if err != nil {
		t.Fatal(err)
	}
	table := nodelock.New()
	if err := table.Start(ctx, blind); err != nil {
		t.Fatal(err)
	}
	go func() { _ = blind.Start(ctx) }()
	if !blind.WaitForCacheSync(ctx) {
		t.Fatal("cache not synced")
	}
	ledger := &nodelock.Ledger{
		Client: env.Client, APIReader: env.Client, Cache: blind, Now: now,
		Key: types.NamespacedName{Namespace: "nodeops-system", Name: nodelock.LedgerName},
	}
	table.UseLedger(ledger)
	return &manager{name: name, table: table, ledger: ledger}
}

// start acquires nodes for operation op's tasks within b and creates the tasks it got, as the
// operation controller does; it returns the nodes it got.
func (m *manager) start(t *testing.T, env *testutil.Env, op string, b nodelock.Budget, nodes ...string) []string {
	t.Helper()
	claims := make([]nodelock.Claim, len(nodes))
	for i, n := range nodes {
		claims[i] = nodelock.Claim{Node: n, Task: op + "-g-" + n}
	}
	ok, _, err := m.table.AcquireWithin(context.Background(), nodelock.OperationOwner(op), claims, b)
	if err != nil {
		t.Fatalf("%s: %v", m.name, err)
	}
	var got []string
	for i, c := range claims {
		if !ok[i] {
			continue
		}
		got = append(got, c.Node)
		task := &v1alpha1.NodeTask{
			ObjectMeta: metav1.ObjectMeta{Name: c.Task, OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeOperation", Name: op, UID: "u-" + types.UID(op), Controller: ptr.To(true)}}},
			Spec: v1alpha1.NodeTaskSpec{NodeName: c.Node, Operation: op, Group: "g", Commands: []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}}},
		}
		if err := env.Client.Create(context.Background(), task); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// Two managers acting at once, neither of whose caches has seen the other's tasks, keep one
// budget shared by two operations: the second one's ledger write conflicts or reads the first
// one's entries, and counts them (budgets are cluster-wide, rule 11). Without the ledger each
// manager counts only its own table, and both spend the same room.
func TestSafetyRule11_TwoManagersShareOneBudgetThroughTheLedger(t *testing.T) {
	env := startEnv(t)
	ctx := context.Background()
	// The managers' clock, moved on by the test: an entry counts without asking the API server
	// for nodelock.DefaultLedgerGrace after it was written.
	var clock atomic.Int64
	clock.Store(time.Now().Unix())
	now := func() time.Time { return time.Unix(clock.Load(), 0) }
	afterGrace := func() { clock.Add(int64((nodelock.DefaultLedgerGrace + time.Second) / time.Second)) }
	a, b := newManager(t, env, "manager a", now), newManager(t, env, "manager b", now)
	budget := nodelock.Budget{Nodes: []string{"n1", "n2", "n3", "n4"}, Limit: 2}

	// A task the manager's cache saw deleted counts no more at once (its informer tells the table;
	// before the clock moves on: the API server stamps the task's creation with the real time).
	x := nodelock.Budget{Nodes: []string{"x1", "x2"}, Limit: 1}
	if got := a.start(t, env, "op-x", x, "x1"); len(got) != 1 {
		t.Fatalf("manager a got %v of x1", got)
	}
	deleted := &v1alpha1.NodeTask{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "op-x-g-x1"}, deleted); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, deleted); err != nil {
		t.Fatal(err)
	}
	a.table.Forget(deleted)
	if got := a.start(t, env, "op-y", x, "x2"); len(got) != 1 {
		t.Fatalf("manager a got %v after the task on x1 was deleted; want x2 at once", got)
	}

	if got := a.start(t, env, "op-a", budget, "n1", "n2"); len(got) != 2 {
		t.Fatalf("manager a got %v of n1, n2 under a budget of 2", got)
	}
	if got := b.start(t, env, "op-b", budget, "n3", "n4"); len(got) != 0 {
		t.Fatalf("manager b, whose cache has not seen op-a's tasks on n1 and n2, got %v under the same budget of 2", got)
	}
	// The ledger names the task holding a node, so a second task is refused there too.
	ok, holders, err := b.table.AcquireWithin(ctx, nodelock.OperationOwner("op-c"), []nodelock.Claim{{Node: "n1", Task: "op-c-g-n1"}},
		nodelock.Budget{Nodes: []string{"n1"}, Limit: 1})
	if err != nil || ok[0] || holders[0].Task != "op-a-g-n1" {
		t.Fatalf("manager b's claim on n1: ok %v, holder %+v, error %v; want refused, held by op-a-g-n1", ok, holders, err)
	}

	// A task that ended stops counting: manager b's cache never sees it, so after the grace the
	// ledger asks the API server. Within the grace it still counts.
	task := &v1alpha1.NodeTask{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "op-a-g-n1"}, task); err != nil {
		t.Fatal(err)
	}
	task.Status.Phase = v1alpha1.TaskSucceeded
	if err := env.Client.Status().Update(ctx, task); err != nil {
		t.Fatal(err)
	}
	if got := b.start(t, env, "op-b", budget, "n3", "n4"); len(got) != 0 {
		t.Fatalf("manager b got %v within the grace of op-a's entries", got)
	}
	afterGrace()
	if got := b.start(t, env, "op-b", budget, "n3", "n4"); len(got) != 1 || got[0] != "n3" {
		t.Fatalf("manager b got %v after op-a-g-n1 ended, with op-a-g-n2 pending; want n3", got)
	}

	// A reservation whose task was never created (its manager stopped between the ledger write and
	// the create) stops counting after the grace too.
	other := nodelock.Budget{Nodes: []string{"m1", "m2"}, Limit: 1}
	if ok, _, err := a.table.AcquireWithin(ctx, nodelock.OperationOwner("op-lost"), []nodelock.Claim{{Node: "m1", Task: "op-lost-g-m1"}}, other); err != nil || !ok[0] {
		t.Fatalf("reservation on m1: ok %v, error %v", ok, err)
	}
	if got := b.start(t, env, "op-d", other, "m2"); len(got) != 0 {
		t.Fatalf("manager b got %v while m1 was just reserved under a budget of 1", got)
	}
	afterGrace()
	if got := b.start(t, env, "op-d", other, "m2"); len(got) != 1 {
		t.Fatalf("manager b got %v after the grace of a reservation whose task was never created; want m2", got)
	}

	cm := &corev1.ConfigMap{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "nodeops-system", Name: nodelock.LedgerName}, cm); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"n1", "m1"} {
		if v, ok := cm.Data[gone]; ok {
			t.Errorf("ledger still records %s (%q) after its hold ended", gone, v)
		}
	}
	t.Logf("ledger: %v", cm.Data)

	// A NodeProfile deletes the finished task it supersedes and creates one of the same name (the
	// managers' clock is ahead of the API server's by now, so the earlier task was created well
	// before the reservation): the news of the earlier task's end and deletion frees neither the
	// new one's node nor its room.
	r := nodelock.Budget{Nodes: []string{"r1", "r2"}, Limit: 1}
	earlier := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: "p-g-r1"},
		Spec:       v1alpha1.NodeTaskSpec{NodeName: "r1", Group: "g", Commands: []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}}},
	}
	if err := env.Client.Create(ctx, earlier); err != nil {
		t.Fatal(err)
	}
	earlier.Status.Phase = v1alpha1.TaskSucceeded
	if err := env.Client.Status().Update(ctx, earlier); err != nil {
		t.Fatal(err)
	}
	a.table.Observe(earlier) // as manager a's informer would
	if ok, _, err := a.table.AcquireWithin(ctx, nodelock.ProfileOwner("p"), []nodelock.Claim{{Node: "r1", Task: "p-g-r1"}}, r); err != nil || !ok[0] {
		t.Fatalf("the new p-g-r1 on r1: ok %v, error %v", ok, err)
	}
	if err := env.Client.Delete(ctx, earlier); err != nil {
		t.Fatal(err)
	}
	a.table.Forget(earlier)
	if got := a.start(t, env, "op-r", r, "r2"); len(got) != 0 {
		t.Fatalf("manager a got %v after the earlier p-g-r1 was deleted, while the new one holds the budget of 1", got)
	}
}

// A ledger with no room for more entries lets the claims beyond wait, as for a spent budget,
// and grants those that fit; nothing fails.
func TestLedgerWithoutRoomLetsClaimsWait(t *testing.T) {
	env := startEnv(t)
	m := newManager(t, env, "manager", time.Now)
	m.ledger.MaxBytes = 70 // room for three entries: "n1" and "op-g-* <10 digits>" are 19 bytes
	got := m.start(t, env, "op", nodelock.Budget{Nodes: []string{"n1", "n2", "n3", "n4"}, Limit: 4}, "n1", "n2", "n3", "n4")
	if len(got) != 3 {
		t.Fatalf("got %v with room for three entries; want n1, n2, n3", got)
	}
}

// A ledger holding more stale entries than one decision may ask the API server about, plus the
// budget (a ConfigMap restored from a backup, a batch whose manager died before creating it and
// whose operation was then deleted), still grants within one grace period: what the API server
// said of an entry is remembered, so the reads of successive decisions add up instead of starting
// over, and the stale entries leave with the write that grants.
func TestLedgerPrunesMoreStaleEntriesThanOneDecisionReads(t *testing.T) {
	env := startEnv(t)
	ctx := context.Background()
	var clock atomic.Int64
	clock.Store(time.Now().Unix())
	now := func() time.Time { return time.Unix(clock.Load(), 0) }
	m := newManager(t, env, "manager", now)

	const stale = 40
	data := map[string]string{}
	budget := nodelock.Budget{Limit: 1}
	for i := range stale {
		node := fmt.Sprintf("s%02d", i)
		data[node] = fmt.Sprintf("gone-g-* %d", clock.Load()) // a task that was never created
		budget.Nodes = append(budget.Nodes, node)
	}
	budget.Nodes = append(budget.Nodes, "free")
	if err := env.Client.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "nodeops-system", Name: nodelock.LedgerName}, Data: data}); err != nil {
		t.Fatal(err)
	}

	if got := m.start(t, env, "op", budget, "free"); len(got) != 0 {
		t.Fatalf("got %v within the grace of %d entries under a budget of 1", got, stale)
	}
	clock.Add(int64((nodelock.DefaultLedgerGrace + time.Second) / time.Second))
	// Each decision reads at most a bounded number of tasks; a few decisions, all within the one
	// grace period, must get through forty.
	granted := -1
	for pass := range 5 {
		if got := m.start(t, env, "op", budget, "free"); len(got) == 1 {
			granted = pass
			break
		}
	}
	if granted < 0 {
		t.Fatalf("nothing granted in 5 decisions after the grace of %d stale entries under a budget of 1", stale)
	}
	cm := &corev1.ConfigMap{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "nodeops-system", Name: nodelock.LedgerName}, cm); err != nil {
		t.Fatal(err)
	}
	if len(cm.Data) != 1 || cm.Data["free"] == "" {
		t.Fatalf("ledger after the grant: %v; want the stale entries pruned and free's entry", cm.Data)
	}
	t.Logf("granted on decision %d after the grace", granted+1)
}
