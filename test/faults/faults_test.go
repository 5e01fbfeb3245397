//go:build faults

package faults

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

const (
	workers  = 5
	poolKey  = "faults.nodeops.io/pool"
	profile  = "prof"
	loadName = "load"
	// opBound is how long, after the last fault ended, each operation has to be Succeeded, or Blocked
	// and then Aborted: a lost agent is marked after --agent-lost-after (1m by default, a lost agent fails its task in bounded time, rule 9).
	opBound = 150 * time.Second
	// busyWait bounds the wait for a command to be running before a fault that wants one.
	busyWait = 20 * time.Second
)

var operations = []string{"op-a", "op-b"}

// TestFaults is `make test-faults`: see the package documentation and docs/development/evidence/faults.md.
func TestFaults(t *testing.T) {
	began := time.Now()
	seed := uint64(1)
	if s := os.Getenv("FAULTS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FAULTS_SEED=%q: %v", s, err)
		}
		seed = v
	}
	fmt.Printf("faults: FAULTS_SEED=%d\n", seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

	clusterDir := filepath.Join(t.TempDir(), "cluster")
	// The journal's markers can come before the cluster exists: the proxy marks every NodeTask create.
	if err := os.MkdirAll(clusterDir, 0o755); err != nil {
		t.Fatal(err)
	}
	journal := filepath.Join(t.TempDir(), "journal")
	jf, err := os.OpenFile(journal, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	defer jf.Close()
	var jmu sync.Mutex
	mark := func(format string, args ...any) {
		jmu.Lock()
		defer jmu.Unlock()
		_, _ = fmt.Fprintf(jf, "- "+format+" %d\n", append(args, time.Now().Unix())...)
	}
	px := newProxy(filepath.Join(clusterDir, "kubeconfig"), func(via, name, node string, code int) {
		mark("create %s on %s by %s: %d", name, node, via, code)
	})
	t.Cleanup(px.Close)
	componentKubeconfig := filepath.Join(t.TempDir(), "components.kubeconfig")
	if err := px.Listen("manager", componentKubeconfig); err != nil {
		t.Fatal(err)
	}
	secondKubeconfig := filepath.Join(t.TempDir(), "manager-2.kubeconfig")
	if err := px.Listen("manager-2", secondKubeconfig); err != nil {
		t.Fatal(err)
	}
	l := framework.StartLocal(t, "--dir", clusterDir, "--control-planes=1", fmt.Sprintf("--workers=%d", workers),
		// The proxy reaches the API server as an administrator, so the components run as one too.
		"--component-kubeconfig", componentKubeconfig, "--agent-credentials=admin")
	ctx := context.Background()
	var nodes []string
	for i := 1; i <= workers; i++ {
		nodes = append(nodes, fmt.Sprintf("worker-%d", i))
	}
	l.WaitNodesReady(t, 1+workers, 3*time.Minute)

	// One journal file, hard-linked into every node root (see JournalPath).
	readJournal := func() []Entry {
		f, err := os.Open(journal)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		entries, err := ParseJournal(f)
		if err != nil {
			t.Fatal(err)
		}
		return entries
	}
	schedulable := map[string]bool{}
	for _, n := range nodes {
		if err := os.Link(journal, filepath.Join(l.NodeRoot(n), JournalPath)); err != nil {
			t.Fatal(err)
		}
		node := &corev1.Node{}
		if err := l.Client.Get(ctx, client.ObjectKey{Name: n}, node); err != nil {
			t.Fatal(err)
		}
		schedulable[n] = !node.Spec.Unschedulable
		if err := l.Client.Patch(ctx, node, client.RawPatch(client.Merge.Type(), []byte(`{"metadata":{"labels":{"`+poolKey+`":"w"}}}`))); err != nil {
			t.Fatal(err)
		}
	}
	startLoad(t, l)
	var injected []string
	var imu sync.Mutex
	record := func(s string) {
		imu.Lock()
		defer imu.Unlock()
		injected = append(injected, fmt.Sprintf("[%5.1fs] %s", time.Since(began).Seconds(), s))
		t.Logf("fault: %s", s)
	}
	var windows sync.WaitGroup

	// A second manager without leader election while the operations and the profile start, when both
	// managers have tasks to create for the same nodes.
	stopSecond := startSecondManager(t, l, secondKubeconfig)
	mark("second-manager started")
	windows.Go(func() {
		time.Sleep(60 * time.Second)
		stopSecond()
		mark("second-manager stopped")
		record("a second manager without leader election for the first 60s of the race")
	})

	// Two operations and a profile over the same five nodes.
	spec := Spec{Idempotent: map[string]bool{}, LastCommand: map[string]string{profile: "install"}, MaxUnavailable: map[string]int{profile: 2}}
	pool := &metav1.LabelSelector{MatchLabels: map[string]string{poolKey: "w"}}
	for _, op := range operations {
		spec.Idempotent[op+"/work"] = true
		spec.LastCommand[op] = "finish"
		spec.MaxUnavailable[op] = 2
		framework.Create(t, l, &v1alpha1.NodeOperation{
			ObjectMeta: metav1.ObjectMeta{Name: op},
			Spec: v1alpha1.NodeOperationSpec{
				NodeSelector: pool,
				// Two, so that one failed node (it counts, unavailable nodes count against maxUnavailable, rule 2) leaves the operation running.
				MaxUnavailable: ptr.To(intstr.FromInt32(2)),
				Custom: &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{{Name: "w", Commands: []v1alpha1.Command{
					{Name: "begin", Script: &v1alpha1.ScriptCommand{Inline: JournalScript(op, "begin", "sleep 1")}},
					{Name: "cordon", Cordon: &v1alpha1.CordonCommand{}},
					{Name: "drain", Drain: &v1alpha1.DrainCommand{Timeout: &metav1.Duration{Duration: time.Minute}}},
					{Name: "work", Script: &v1alpha1.ScriptCommand{Inline: JournalScript(op, "work", "sleep 4"), Idempotent: true}},
					{Name: "uncordon", Uncordon: &v1alpha1.UncordonCommand{}},
					{Name: "finish", Script: &v1alpha1.ScriptCommand{Inline: JournalScript(op, "finish", "sleep 1")}},
				}}}},
			},
		})
	}
	if err := l.Client.Create(ctx, &v1alpha1.NodeProfile{
		ObjectMeta: metav1.ObjectMeta{Name: profile},
		Spec: v1alpha1.NodeProfileSpec{
			NodeSelector:  pool,
			AutoProvision: true,
			// The operations' 2 as well: it races them for the same budget of free nodes (budgets are cluster-wide, rule 11).
			MaxUnavailable: ptr.To(intstr.FromInt32(2)),
			Install:        []v1alpha1.Command{{Name: "install", Script: &v1alpha1.ScriptCommand{Inline: JournalScript(profile, "install", "sleep 2")}}},
			Uninstall:      []v1alpha1.Command{{Name: "uninstall", Script: &v1alpha1.ScriptCommand{Inline: "true", Idempotent: true}}},
		},
	}); err != nil {
		t.Fatal(err)
	}

	// The faults, in a seeded order at seeded moments; the node deletion comes last, as it blocks an operation.
	busyNode := func(want bool) string {
		deadline := time.Now().Add(busyWait)
		for {
			busy := Running(readJournal())
			if len(busy) > 0 {
				return busy[rng.IntN(len(busy))]
			}
			if !want || time.Now().After(deadline) {
				return nodes[rng.IntN(len(nodes))] + " (idle)"
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	signal := func(name string, sig syscall.Signal) {
		procs, err := l.Processes()
		if err != nil {
			t.Fatal(err)
		}
		pid, ok := procs[name]
		if !ok {
			t.Fatalf("no %s among %v", name, procs)
		}
		if err := syscall.Kill(pid, sig); err != nil {
			t.Errorf("signalling %s (pid %d): %v", name, pid, err)
		}
	}
	proxyFault := func(f fault, d time.Duration) func() {
		return func() {
			n := busyNode(true)
			live := px.inject(f, d)
			mark("fault %s", strings.ReplaceAll(f.name, " ", "_"))
			at := time.Since(began).Seconds()
			windows.Go(func() {
				time.Sleep(d)
				record(fmt.Sprintf("%s for %s from %.1fs, when %s was busy: %d requests refused", f.name, d, at, n, px.hits(live)))
			})
		}
	}
	agentFault := func(sig syscall.Signal) func() {
		return func() {
			n := node(busyNode(true))
			signal("agent-"+n, sig)
			if sig == syscall.SIGKILL {
				mark("%s %s", Killed, n)
				record("kill -9 agent-" + n)
				return
			}
			mark("sigterm %s", n)
			record("SIGTERM agent-" + n)
		}
	}
	// The kills and two of the proxy's windows in a seeded order, then the 503s on node writes (a 503 on
	// a cordon fails its task and blocks its operation, so earlier it would leave the kills nothing to
	// hit), then the node deletion, which blocks an operation too.
	faults := []func(){
		agentFault(syscall.SIGKILL),
		agentFault(syscall.SIGKILL),
		agentFault(syscall.SIGTERM),
		func() {
			n := busyNode(true)
			signal("manager", syscall.SIGKILL)
			mark("manager-killed")
			record("kill -9 manager while " + n + " busy")
		},
		func() {
			n := busyNode(true)
			signal("kube-apiserver", syscall.SIGKILL)
			mark("kube-apiserver-killed")
			record("kill -9 kube-apiserver while " + n + " busy")
		},
		proxyFault(evictions, 20*time.Second),
		proxyFault(resultWrites, 15*time.Second),
	}
	rng.Shuffle(len(faults), func(i, j int) { faults[i], faults[j] = faults[j], faults[i] })
	faults = append(faults, proxyFault(cordonWrites, 20*time.Second), func() {
		n := node(busyNode(true))
		if err := l.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Errorf("deleting node %s: %v", n, err)
		}
		delete(schedulable, n)
		mark("deleted %s", n)
		record("delete node " + n)
	})
	for _, f := range faults {
		time.Sleep(time.Duration(1000+rng.IntN(4000)) * time.Millisecond)
		f()
	}
	windows.Wait()
	faultsEnded := time.Now()
	t.Logf("faults ended after %s", faultsEnded.Sub(began).Round(time.Second))

	// Every operation ends within opBound: Succeeded, or Blocked and then Aborted once a person
	// aborts it. The abort comes as soon as it is Blocked, since a Blocked operation's failed node
	// holds back every other operation selecting it (one task per node and budgets are cluster-wide, rules 1 and 11) until a person decides.
	notSettled := map[string]string{}
	for _, op := range operations {
		notSettled[op] = "never read"
	}
	aborted := map[string]bool{}
	deadline := faultsEnded.Add(opBound)
	for len(notSettled) > 0 && time.Now().Before(deadline) {
		for _, name := range operations {
			if _, ok := notSettled[name]; !ok {
				continue
			}
			op := &v1alpha1.NodeOperation{}
			if err := l.Client.Get(ctx, client.ObjectKey{Name: name}, op); err != nil {
				notSettled[name] = err.Error()
				continue
			}
			p := op.Status.Phase
			switch {
			case p == v1alpha1.OperationSucceeded || (p == v1alpha1.OperationAborted && aborted[name]):
				delete(notSettled, name)
				t.Logf("%s %s %s after the faults ended", name, p, time.Since(faultsEnded).Round(time.Second))
			case p == v1alpha1.OperationBlocked && !aborted[name]:
				why := ""
				if c := meta.FindStatusCondition(op.Status.Conditions, v1alpha1.ConditionBlocked); c != nil {
					why = c.Reason + ": " + c.Message
				}
				t.Logf("%s Blocked %s after the faults ended (%s): aborting it, as a person would", name, time.Since(faultsEnded).Round(time.Second), why)
				framework.RequestAbort(t, l, name)
				aborted[name] = true
				notSettled[name] = "Blocked, abort requested"
			default:
				notSettled[name] = string(p)
			}
		}
		time.Sleep(framework.PollInterval)
	}
	var phases []string
	for _, name := range operations {
		op := &v1alpha1.NodeOperation{}
		if err := l.Client.Get(ctx, client.ObjectKey{Name: name}, op); err == nil {
			phases = append(phases, fmt.Sprintf("%s %s %s", name, op.Status.Phase, taskSummary(ctx, l, name)))
		}
	}
	prof := &v1alpha1.NodeProfile{}
	if err := l.Client.Get(ctx, client.ObjectKey{Name: profile}, prof); err == nil {
		phases = append(phases, fmt.Sprintf("profile %s nodes %+v", profile, prof.Status.Nodes))
	}

	// A person ends what went Blocked since: abort, which always ends an operation and restores the
	// schedulability of every node it cordoned (uncordon restores what cordon found and a lost agent fails its task in bounded time, rules 5 and 9); only then is it compared. An
	// abort requested above that did not end its operation is a row of the table, not waited for again.
	for _, name := range operations {
		op := &v1alpha1.NodeOperation{}
		if err := l.Client.Get(ctx, client.ObjectKey{Name: name}, op); err == nil && op.Status.Phase == v1alpha1.OperationBlocked && !aborted[name] {
			t.Logf("%s Blocked: aborting it, as a person would", name)
			framework.AbortOperation(t, l, name)
		}
	}

	// Schedulability of the nodes left, as at the start.
	var changed []string
	for _, n := range sortedNodes(schedulable) {
		node := &corev1.Node{}
		if err := l.Client.Get(ctx, client.ObjectKey{Name: n}, node); err != nil {
			changed = append(changed, fmt.Sprintf("%s: %v", n, err))
			continue
		}
		if !node.Spec.Unschedulable != schedulable[n] {
			changed = append(changed, fmt.Sprintf("%s unschedulable=%t (was %t)", n, node.Spec.Unschedulable, !schedulable[n]))
		}
	}

	r := Check(readJournal(), spec)
	var notSettledList []string
	for _, name := range sortedKeysString(notSettled) {
		notSettledList = append(notSettledList, name+" "+notSettled[name])
	}
	table := renderTable(seed, time.Since(began), injected, r, notSettledList, changed, phases)
	fmt.Print(table)
	out := os.Getenv("FAULTS_RESULTS")
	if out == "" {
		out = filepath.Join(os.TempDir(), "faults-results.md")
	}
	if err := os.WriteFile(out, []byte(table), 0o644); err != nil {
		t.Errorf("writing %s: %v", out, err)
	}
	// The journal outlives the test's directory, for reading the findings against it.
	if data, err := os.ReadFile(journal); err == nil {
		if err := os.WriteFile(out+".journal", data, 0o644); err != nil {
			t.Errorf("writing %s.journal: %v", out, err)
		}
	}
	fmt.Printf("faults: table written to %s, the journal to %s.journal\n", out, out)
	if len(r.RunTwice) > 0 || r.MostAtOnce > 1 || r.MostCommandsAtOnce > 1 || len(r.MaxUnavailable) > 0 || len(notSettledList) > 0 || len(changed) > 0 {
		t.Errorf("safety violated under faults (table above)")
	}
}

// node drops the "(idle)" that busyNode adds when nothing ran.
func node(s string) string { return strings.Fields(s)[0] }

// startLoad runs a Deployment on the pool so that drains evict something.
func startLoad(t *testing.T, l *framework.Local) {
	t.Helper()
	labels := map[string]string{"app": loadName}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: loadName, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(workers)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{poolKey: "w"},
					Containers:   []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10.1"}},
				},
			},
		},
	}
	if err := l.Client.Create(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyEvery(t, 2*time.Minute, framework.PollInterval, "the load's pods Running", func(ctx context.Context) error {
		var pods corev1.PodList
		if err := l.Client.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels(labels)); err != nil {
			return err
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		if running < workers {
			return fmt.Errorf("%d of %d running", running, workers)
		}
		return nil
	})
}

// startSecondManager starts bin/manager with the arguments nodeops-local started its own with (the
// first line of logs/manager.log), leader election off as there; stop ends it.
func startSecondManager(t *testing.T, l *framework.Local, kubeconfig string) (stop func()) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(l.Dir, "logs", "manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(data), "\n")
	const prefix = "=== nodeops-local: starting "
	if !strings.HasPrefix(first, prefix) {
		t.Fatalf("logs/manager.log starts with %q", first)
	}
	f := strings.Fields(strings.TrimPrefix(first, prefix))
	var args []string
	for _, a := range f[1 : len(f)-2] { // the path first, "at <time>" last
		if strings.HasPrefix(a, "--kubeconfig=") {
			a = "--kubeconfig=" + kubeconfig // its own port of the proxy, so that its creates are told apart
		}
		args = append(args, a)
	}
	log, err := os.Create(filepath.Join(l.Dir, "logs", "manager-2.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(f[0], args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Dir = l.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = log.Close(); close(done) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func taskSummary(ctx context.Context, l *framework.Local, op string) string {
	var tasks v1alpha1.NodeTaskList
	if err := l.Client.List(ctx, &tasks, client.MatchingLabels{"nodeops.io/operation": op}); err != nil {
		return err.Error()
	}
	var parts []string
	for _, task := range tasks.Items {
		s := fmt.Sprintf("%s=%s", task.Spec.NodeName, task.Status.Phase)
		for _, c := range task.Status.Conditions {
			if c.Status == metav1.ConditionTrue {
				s += "(" + c.Type + ":" + c.Reason + ")"
			}
		}
		for _, c := range task.Status.Commands {
			if c.Phase == v1alpha1.CommandFailed {
				s += fmt.Sprintf("[%s: %s]", c.Name, firstLine(c.Message))
			}
		}
		parts = append(parts, s)
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
}

func renderTable(seed uint64, took time.Duration, injected []string, r Result, notSettled, changed, phases []string) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "\n## Faults (FAULTS_SEED=%d, %s)\n\n", seed, took.Round(time.Second))
	fmt.Fprintf(&b, "| check | found | target |\n|---|---|---|\n")
	most := strconv.Itoa(r.MostAtOnce)
	if r.MostAt != "" && r.MostAtOnce > 1 {
		most += " (" + r.MostAt + ")"
	}
	fmt.Fprintf(&b, "| faults injected | %d | - |\n", len(injected))
	fmt.Fprintf(&b, "| non-idempotent commands run twice without a person's retry | %d | 0 |\n", len(r.RunTwice))
	fmt.Fprintf(&b, "| most tasks executing on one node at once | %s | 1 |\n", most)
	fmt.Fprintf(&b, "| (most operations with a command running on one node at once) | %d | 1 |\n", r.MostCommandsAtOnce)
	held := strconv.Itoa(r.MostHeldAtOnce)
	if r.MostHeldAtOnce > 1 {
		held += " (" + r.MostHeldAt + ")"
	}
	// Informational: tasks that exist on one node at once (a second manager, or a manager restarted
	// without its lock table, creates them); the node's lock (a flock on the node, rule 8) keeps them from executing together,
	// which the two rows above measure (exclusion that cannot be bypassed, rule 8).
	fmt.Fprintf(&b, "| (most tasks on one node at once, from their create to their last journal line; informational) | %s | - |\n", held)
	// Shared budgets hold while two managers act at once too: the budget ledger orders their decisions.
	fmt.Fprintf(&b, "| maxUnavailable violations | %d | 0 |\n", len(r.MaxUnavailable))
	fmt.Fprintf(&b, "| operations not ended within %s after the faults stopped (Succeeded, or Blocked and then Aborted by the suite's abort) | %d | 0 |\n", opBound, len(notSettled))
	fmt.Fprintf(&b, "| nodes whose schedulability changed | %d | 0 |\n\n", len(changed))
	section := func(title string, lines []string) {
		if len(lines) == 0 {
			return
		}
		fmt.Fprintf(&b, "%s:\n", title)
		for _, l := range lines {
			fmt.Fprintf(&b, "- %s\n", l)
		}
		b.WriteString("\n")
	}
	section("Faults", injected)
	section("Run twice", r.RunTwice)
	section("maxUnavailable", r.MaxUnavailable)
	section("Not settled", notSettled)
	section("Schedulability changed", changed)
	section("At the end", phases)
	return b.String()
}

func sortedNodes(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sortedKeysString(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
