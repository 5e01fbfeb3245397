package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/localcluster"
)

// Scenario names (also the -only values).
const (
	scenarioRaw     = "raw"
	scenarioOp100   = "op100"
	scenarioOp10    = "op10"
	scenarioOpGate  = "opgate"
	scenarioProfile = "profile"
)

// profileName is the benchmark's NodeProfile; its nodes get the label nodeops.io/profile.bench.
const profileName = "bench"

// settle is how long the cluster is left alone before and after a measured run, so that start-up,
// clean-up and trailing batched status writes fall outside or inside the window on purpose.
const (
	settleBefore = 5 * time.Second
	settleAfter  = 3 * time.Second
	quietWindow  = 3 * time.Second
	quietMax     = 2 * time.Minute
)

// measured are the processes whose CPU time each run records.
var measured = []string{"manager", "agent-sim", "kube-apiserver", "etcd"}

// clusterResult is everything measured on one cluster of K sim nodes.
type clusterResult struct {
	K       int
	StartUp time.Duration
	Load    string // 1/5/15-minute load averages when the cluster was ready
	// Raws are the API server's raw write limits: ConfigMap creates, then NodeTask writes.
	Raws []rawResult
	Runs []runResult
	Err  string
}

// runResult is one measured nodeops run.
type runResult struct {
	Scenario string
	// Wall: create to Succeeded (operation) or to every node labelled (profile).
	Wall time.Duration
	// Tasks: create to the earliest task's status.startTime (first Running), the last start and the last end.
	Tasks  taskTimes
	Writes writeCounts
	// LeaseWrites: the agents' writes of node Leases (nodeops-system), which the API server's
	// counters cannot tell from kwok's node heartbeats (kube-node-lease): counted by a watch.
	LeaseWrites float64
	CPU         map[string]float64
	ManagerRSS  uint64
	Load        string
	Err         string
	// TargetSize is the ClusterTarget's size as JSON (scenario target only).
	TargetSize int
}

// simSelector selects the sim nodes: the cluster's only other node is its control plane.
func simSelector() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: localcluster.LabelControlPlane, Operator: metav1.LabelSelectorOpDoesNotExist},
	}}
}

func waitZero() []v1alpha1.Command {
	return []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{Duration: metav1.Duration{}}}}
}

// benchK brings up a cluster of k sim nodes and runs every scenario on it.
func benchK(ctx context.Context, o options, k int, dir string, logf func(string, ...any)) (clusterResult, error) {
	res := clusterResult{K: k}
	start := time.Now()
	c, err := startCluster(ctx, o.binDir, dir, k, o.profileDir != "", logf)
	if err != nil {
		return res, err
	}
	defer func() {
		logf("K=%d: stopping nodeops-local", k)
		c.stop()
	}()
	res.StartUp = time.Since(start)
	res.Load = readLoadAvg()
	logf("K=%d: ready in %s (load %s)", k, res.StartUp.Round(time.Second), res.Load)

	if o.wants(scenarioRaw) {
		for _, w := range []rawWorkload{configMapCreates{}, taskWrites{}} {
			_ = clock.Sleep(ctx, settleBefore)
			raw, err := measureRaw(ctx, c, w, o.rawCreates, o.rawClients)
			if err != nil {
				return res, fmt.Errorf("raw write limit (%s): %w", w.name(), err)
			}
			res.Raws = append(res.Raws, raw)
			logf("K=%d: raw write limit, %s: %.0f writes/s (%d writes, %d clients, %d errors, apiserver %.1f ms CPU per write)",
				k, raw.Workload, raw.rate(), raw.Writes, raw.Clients, raw.Errors, 1000*raw.APIServerCPU/float64(raw.Writes))
		}
	}
	if o.wants(scenarioTarget) {
		size, err := waitTargetSettled(ctx, c, k, o.timeout)
		if err != nil {
			return res, err
		}
		r := measure(ctx, c, scenarioTarget, o.timeout, runAtRest)
		r.TargetSize = size
		res.Runs = append(res.Runs, r)
		logf("K=%d: %s: %.1f nodeops writes a minute, manager %.2f%% of a core, ClusterTarget %d KiB", k, scenarioTarget,
			r.Writes.total(nodeopsWrite)/r.Wall.Minutes(), 100*r.CPU["manager"]/r.Wall.Seconds(), size/1024)
	}
	type scenario struct {
		name string
		run  func(context.Context) (time.Duration, taskTimes, error)
		undo func(context.Context) error
	}
	var scenarios []scenario
	for _, op := range []struct {
		name  string
		pct   int
		gates []v1alpha1.Gate
	}{{scenarioOp100, 100, nil}, {scenarioOp10, 10, nil}, {scenarioOpGate, 100, passingGates()}} {
		if !o.wants(op.name) {
			continue
		}
		opName := "bench-" + op.name
		scenarios = append(scenarios, scenario{
			name: op.name,
			run: func(ctx context.Context) (time.Duration, taskTimes, error) {
				return runOperation(ctx, c, opName, op.pct, k, op.gates)
			},
			undo: func(ctx context.Context) error { return deleteOperation(ctx, c, opName) },
		})
	}
	if o.wants(scenarioProfile) {
		scenarios = append(scenarios, scenario{
			name: scenarioProfile,
			run:  func(ctx context.Context) (time.Duration, taskTimes, error) { return runProfile(ctx, c, k) },
		})
	}
	if o.profileDir != "" {
		c.profile = func(scenario string) func() error {
			return startProfiles(ctx, c.pprof, o.profileDir, k, scenario, o.profileSeconds)
		}
	}
	for _, s := range scenarios {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		r := measure(ctx, c, s.name, o.timeout, s.run)
		res.Runs = append(res.Runs, r)
		logf("K=%d: %s: %s", k, s.name, r.summary(k))
		if s.undo != nil {
			if err := s.undo(ctx); err != nil {
				return res, fmt.Errorf("cleaning up after %s: %w", s.name, err)
			}
		}
	}
	return res, nil
}

// measure runs one scenario between two samples of the API server's write counters and the
// processes' CPU times; the manager's peak RSS is reset before and read after.
func measure(ctx context.Context, c *cluster, name string, timeout time.Duration,
	run func(context.Context) (time.Duration, taskTimes, error)) runResult {
	r := runResult{Scenario: name, CPU: map[string]float64{}}
	fail := func(err error) runResult { r.Err = err.Error(); return r }
	if err := waitQuiet(ctx, c); err != nil {
		return fail(err)
	}
	pids := map[string]int{}
	for _, p := range measured {
		pid, err := c.pid(p)
		if err != nil {
			return fail(err)
		}
		pids[p] = pid
	}
	if err := resetPeakRSS(pids["manager"]); err != nil {
		return fail(err)
	}
	before := map[string]float64{}
	for p, pid := range pids {
		s, err := cpuSeconds(pid)
		if err != nil {
			return fail(err)
		}
		before[p] = s
	}
	leases, err := countLeaseWrites(ctx, c.client)
	if err != nil {
		return fail(err)
	}
	w0, err := scrapeWrites(ctx, c.cfg)
	if err != nil {
		return fail(err)
	}
	r.Load = readLoadAvg()
	profiled := func() error { return nil }
	if c.profile != nil {
		profiled = c.profile(name)
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	r.Wall, r.Tasks, err = run(rctx)
	cancel()
	// Waited for after the CPU times are read, so that the run's window is the same with or without.
	defer func() {
		if perr := profiled(); perr != nil {
			// The measurement stands without its profile.
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", name, perr)
		}
	}()
	if err != nil {
		return fail(err)
	}
	_ = clock.Sleep(ctx, settleAfter)
	w1, err := scrapeWrites(ctx, c.cfg)
	if err != nil {
		return fail(err)
	}
	r.Writes = w1.sub(w0)
	r.LeaseWrites = float64(leases())
	for p, pid := range pids {
		s, err := cpuSeconds(pid)
		if err != nil {
			return fail(fmt.Errorf("%s restarted during the run? %w", p, err))
		}
		r.CPU[p] = s - before[p]
	}
	if r.ManagerRSS, err = peakRSS(pids["manager"]); err != nil {
		return fail(err)
	}
	return r
}

// background is a write that a quiet local cluster keeps making: kwok's node heartbeats.
func background(k writeKey) bool {
	return k.Resource == "leases" || (k.Resource == "nodes" && k.Subresource == "status")
}

// waitQuiet waits until the cluster made no writes but kwok's heartbeats for quietWindow (at
// most quietMax), so that the controller-manager's start-up work on the nodes (for example the
// TTL controller annotating every node once there are more than 100) is not counted as nodeops'.
func waitQuiet(ctx context.Context, c *cluster) error {
	deadline := time.Now().Add(quietMax)
	prev, err := scrapeWrites(ctx, c.cfg)
	if err != nil {
		return err
	}
	for time.Now().Before(deadline) {
		if err := clock.Sleep(ctx, quietWindow); err != nil {
			return err
		}
		cur, err := scrapeWrites(ctx, c.cfg)
		if err != nil {
			return err
		}
		busy := cur.sub(prev).total(func(k writeKey) bool { return !background(k) })
		prev = cur
		if busy == 0 {
			return nil
		}
	}
	return nil // measured anyway; the write breakdown shows what else ran
}

// passingGates are the opgate scenario's health gates: a CEL gate over the default Namespace, true
// from the start, so the run shows what checking a gate before every node costs when it passes at
// once (issue 27: gates read, they do not write per check).
func passingGates() []v1alpha1.Gate {
	return []v1alpha1.Gate{{Name: "default-namespace-active", CEL: &v1alpha1.CELGate{
		APIVersion: "v1", Kind: "Namespace", Name: "default", Expression: "self.status.phase == 'Active'",
	}}}
}

// runOperation creates a custom operation with one `wait 0s` over the sim nodes at maxUnavailable
// pct%, checking gates before each node, and returns the time from create to the Succeeded
// condition and to the first task's start.
func runOperation(ctx context.Context, c *cluster, name string, pct, k int, gates []v1alpha1.Gate) (time.Duration, taskTimes, error) {
	mu := intstr.FromString(fmt.Sprintf("%d%%", pct))
	op := &v1alpha1.NodeOperation{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.NodeOperationSpec{
			Custom:         &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{{Name: "wait", Commands: waitZero()}}},
			NodeSelector:   simSelector(),
			MaxUnavailable: &mu,
			Scheduling:     v1alpha1.Scheduling{Gates: gates},
		},
	}
	w, err := c.client.Watch(ctx, &v1alpha1.NodeOperationList{}, client.MatchingFields{"metadata.name": name})
	if err != nil {
		return 0, taskTimes{}, fmt.Errorf("watching NodeOperation %s: %w", name, err)
	}
	defer w.Stop()
	t0 := time.Now()
	if err := c.client.Create(ctx, op); err != nil {
		return 0, taskTimes{}, fmt.Errorf("creating NodeOperation %s: %w", name, err)
	}
	done := func(o *v1alpha1.NodeOperation) (bool, error) {
		if meta.IsStatusConditionTrue(o.Status.Conditions, v1alpha1.ConditionSucceeded) {
			return true, nil
		}
		switch o.Status.Phase {
		case v1alpha1.OperationFailed, v1alpha1.OperationAborted, v1alpha1.OperationBlocked:
			return false, fmt.Errorf("NodeOperation %s is %s: %s", name, o.Status.Phase, conditionMessages(o.Status.Conditions))
		}
		return false, nil
	}
	if err := untilOperation(ctx, c, w, name, done); err != nil {
		return 0, taskTimes{}, err
	}
	wall := time.Since(t0)
	tt, err := observeTasks(ctx, c, client.MatchingLabels{v1alpha1.LabelOperation: name}, t0)
	if err != nil {
		return 0, tt, err
	}
	if tt.Count != k {
		return 0, tt, fmt.Errorf("NodeOperation %s succeeded with %d tasks, not %d", name, tt.Count, k)
	}
	return wall, tt, nil
}

// untilOperation follows the operation's watch (falling back to a read when the watch ends) until done says so.
func untilOperation(ctx context.Context, c *cluster, w watch.Interface, name string, done func(*v1alpha1.NodeOperation) (bool, error)) error {
	for {
		select {
		case <-ctx.Done():
			var o v1alpha1.NodeOperation
			_ = c.client.Get(context.Background(), client.ObjectKey{Name: name}, &o)
			return fmt.Errorf("waiting for NodeOperation %s (phase %q, groups %+v): %w", name, o.Status.Phase, o.Status.Groups, ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The watch ended (a timeout on the server): read once, then watch again.
				var o v1alpha1.NodeOperation
				if err := c.client.Get(ctx, client.ObjectKey{Name: name}, &o); err != nil {
					return fmt.Errorf("reading NodeOperation %s: %w", name, err)
				}
				if ok, err := done(&o); ok || err != nil {
					return err
				}
				nw, err := c.client.Watch(ctx, &v1alpha1.NodeOperationList{}, client.MatchingFields{"metadata.name": name})
				if err != nil {
					return fmt.Errorf("watching NodeOperation %s again: %w", name, err)
				}
				defer nw.Stop()
				w = nw
				continue
			}
			o, isOp := ev.Object.(*v1alpha1.NodeOperation)
			if !isOp {
				continue
			}
			if ok, err := done(o); ok || err != nil {
				return err
			}
		}
	}
}

func conditionMessages(cs []metav1.Condition) string {
	var out string
	for _, c := range cs {
		if c.Status == metav1.ConditionTrue {
			out += fmt.Sprintf("%s=%s (%s) ", c.Type, c.Reason, c.Message)
		}
	}
	return out
}

// taskTimes are the selected tasks' start and end times, from t0.
type taskTimes struct {
	FirstStart, LastStart, LastDone time.Duration
	Count                           int
}

// observeTasks lists the selected tasks, which must all have Succeeded, and returns when the
// first and the last started and when the last finished (status.startTime and completionTime,
// written by the agent on this machine), measured from t0.
func observeTasks(ctx context.Context, c *cluster, sel client.MatchingLabels, t0 time.Time) (taskTimes, error) {
	var tasks v1alpha1.NodeTaskList
	if err := c.client.List(ctx, &tasks, sel); err != nil {
		return taskTimes{}, fmt.Errorf("listing tasks: %w", err)
	}
	tt := taskTimes{Count: len(tasks.Items), FirstStart: -1}
	for i := range tasks.Items {
		t := &tasks.Items[i]
		if t.Status.Phase != v1alpha1.TaskSucceeded {
			return tt, fmt.Errorf("task %s is %q, not Succeeded", t.Name, t.Status.Phase)
		}
		if st := t.Status.StartTime; st != nil {
			d := st.Sub(t0)
			if tt.FirstStart < 0 || d < tt.FirstStart {
				tt.FirstStart = d
			}
			tt.LastStart = max(tt.LastStart, d)
		}
		if ct := t.Status.CompletionTime; ct != nil {
			tt.LastDone = max(tt.LastDone, ct.Sub(t0))
		}
	}
	if tt.FirstStart < 0 {
		return tt, errors.New("no task recorded a start time")
	}
	return tt, nil
}

// deleteOperation deletes the operation and its tasks and waits until the tasks are gone, so the
// next run starts from the same state.
func deleteOperation(ctx context.Context, c *cluster, name string) error {
	sel := client.MatchingLabels{v1alpha1.LabelOperation: name}
	op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.client.Delete(ctx, op); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting NodeOperation %s: %w", name, err)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var deleteErr error
	for {
		// One deletecollection rather than thousands of deletes by the garbage collector. At
		// thousands of tasks on a loaded machine it can outlast the API server's request timeout
		// (a 504, or the HTTP/2 stream reset) while the server goes on deleting: so its error
		// is kept, and it is asked again while tasks are left.
		if err := c.client.DeleteAllOf(dctx, &v1alpha1.NodeTask{}, sel); err != nil {
			deleteErr = err
		}
		for range 30 {
			var tasks v1alpha1.NodeTaskList
			if err := c.client.List(dctx, &tasks, sel, client.Limit(1)); err != nil {
				return fmt.Errorf("listing tasks of %s: %w", name, errors.Join(err, deleteErr))
			}
			if len(tasks.Items) == 0 {
				return nil
			}
			if err := clock.Sleep(dctx, time.Second); err != nil {
				return fmt.Errorf("waiting for the tasks of %s to go: %w", name, errors.Join(err, deleteErr))
			}
		}
	}
}

// runProfile creates an autoProvision NodeProfile (install: one `wait 0s`, maxUnavailable 100%)
// over the sim nodes and returns the time from create until every one of them carries the
// provisioned label, and to the first task's start.
func runProfile(ctx context.Context, c *cluster, k int) (time.Duration, taskTimes, error) {
	label := v1alpha1.ProfileLabelPrefix + profileName
	sel := client.MatchingLabels{label: v1alpha1.ProvisionedValue}
	mu := intstr.FromString("100%")
	p := &v1alpha1.NodeProfile{
		ObjectMeta: metav1.ObjectMeta{Name: profileName},
		Spec: v1alpha1.NodeProfileSpec{
			NodeSelector:   simSelector(),
			AutoProvision:  true,
			Install:        waitZero(),
			MaxUnavailable: &mu,
		},
	}
	w, err := c.client.Watch(ctx, &corev1.NodeList{}, sel)
	if err != nil {
		return 0, taskTimes{}, fmt.Errorf("watching labelled nodes: %w", err)
	}
	defer func() { w.Stop() }()
	t0 := time.Now()
	if err := c.client.Create(ctx, p); err != nil {
		return 0, taskTimes{}, fmt.Errorf("creating NodeProfile %s: %w", profileName, err)
	}
	labelled := map[string]bool{}
	for len(labelled) < k {
		select {
		case <-ctx.Done():
			return 0, taskTimes{}, fmt.Errorf("waiting for %d nodes labelled %s (have %d): %w", k, label, len(labelled), ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				var nodes corev1.NodeList
				if err := c.client.List(ctx, &nodes, sel); err != nil {
					return 0, taskTimes{}, fmt.Errorf("listing labelled nodes: %w", err)
				}
				for i := range nodes.Items {
					labelled[nodes.Items[i].Name] = true
				}
				if w, err = c.client.Watch(ctx, &corev1.NodeList{}, sel); err != nil {
					return 0, taskTimes{}, fmt.Errorf("watching labelled nodes again: %w", err)
				}
				continue
			}
			if n, isNode := ev.Object.(*corev1.Node); isNode && ev.Type != watch.Deleted && n.Labels[label] == v1alpha1.ProvisionedValue {
				labelled[n.Name] = true
			}
		}
	}
	wall := time.Since(t0)
	tt, err := observeTasks(ctx, c, client.MatchingLabels{v1alpha1.LabelProfile: profileName}, t0)
	if err != nil {
		return 0, tt, err
	}
	if tt.Count != k {
		return 0, tt, fmt.Errorf("NodeProfile %s provisioned with %d tasks, not %d", profileName, tt.Count, k)
	}
	return wall, tt, nil
}

// countLeaseWrites counts the node Lease writes (creates and updates) that the API server
// accepted from now until the returned function is called, which returns the count.
func countLeaseWrites(ctx context.Context, c client.WithWatch) (func() int, error) {
	// A watch from no resourceVersion would first replay every existing Lease as ADDED.
	sel := []client.ListOption{client.InNamespace(agent.DefaultLeaseNamespace), client.HasLabels{v1alpha1.LabelNode}}
	list := &coordinationv1.LeaseList{}
	if err := c.List(ctx, list, sel...); err != nil {
		return nil, fmt.Errorf("listing node leases: %w", err)
	}
	sel = append(sel, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	w, err := c.Watch(ctx, &coordinationv1.LeaseList{}, sel...)
	if err != nil {
		return nil, fmt.Errorf("watching node leases: %w", err)
	}
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if ev.Type == watch.Added || ev.Type == watch.Modified {
				n++
			}
		}
	}()
	return func() int { w.Stop(); <-done; return n }, nil
}
