package main

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/localcluster"
)

// rawResult is the API server's raw write limit for one kind of write.
type rawResult struct {
	Workload                string
	Writes, Clients, Errors int
	Seconds                 float64
	// APIServerCPU is the API server's CPU seconds during the writes.
	APIServerCPU float64
	Load         string
}

func (r rawResult) rate() float64 { return float64(r.Writes-r.Errors) / r.Seconds }

// rawWorkload is a kind of write to push through the API server as fast as it takes it.
type rawWorkload interface {
	name() string
	// writesPer is how many API writes one unit of work makes.
	writesPer() int
	// prepare runs once before the clock starts; do runs unit i with one client.
	prepare(ctx context.Context, c client.Client, run string) error
	do(ctx context.Context, c client.Client, run string, i int) error
	// cleanup removes what the workload made; it is not timed.
	cleanup(ctx context.Context, c client.Client, run string) error
}

// configMapCreates: one small ConfigMap create per unit, the classic raw write.
type configMapCreates struct{}

func (configMapCreates) name() string   { return "ConfigMap creates" }
func (configMapCreates) writesPer() int { return 1 }
func (configMapCreates) prepare(ctx context.Context, c client.Client, run string) error {
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: run}}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", run, err)
	}
	return nil
}
func (configMapCreates) do(ctx context.Context, c client.Client, run string, i int) error {
	return c.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: run, Name: fmt.Sprintf("raw-%d", i)},
		Data:       map[string]string{"k": "v"},
	})
}

// The ConfigMaps stay: deleting the namespace would make the namespace controller delete them
// during the next measurement.
func (configMapCreates) cleanup(context.Context, client.Client, string) error { return nil }

// taskWrites is nodeops' own write mix for a one-command task, made as fast as the API server
// takes it: a NodeTask create and one update of its status (the quick idempotent command's result,
// with its start), the exact writes of the manager and the agent. The tasks name nodes no agent
// serves, carry no owner and no node label, so nothing acts on them.
type taskWrites struct{}

func (taskWrites) name() string   { return "NodeTask create + status update" }
func (taskWrites) writesPer() int { return 2 }
func (taskWrites) prepare(context.Context, client.Client, string) error {
	return nil
}
func (taskWrites) do(ctx context.Context, c client.Client, run string, i int) error {
	t := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", run, i), Labels: map[string]string{"bench.nodeops.io/raw": run}},
		Spec: v1alpha1.NodeTaskSpec{
			NodeName: fmt.Sprintf("%s-node-%d", run, i), Operation: run, Group: "wait",
			Commands: waitZero(), ExecutionMode: v1alpha1.ExecutionAuto,
		},
	}
	if err := c.Create(ctx, t); err != nil {
		return err
	}
	start := metav1.NewMicroTime(time.Now())
	end := metav1.NewMicroTime(time.Now())
	code := int32(0)
	t.Status = v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskSucceeded, StartTime: &start, CompletionTime: &end, AgentHeartbeat: &start,
		Attempt: 1, Progress: "1/1",
		Commands: []v1alpha1.CommandStatus{{Name: "wait", Phase: v1alpha1.CommandSucceeded, Attempt: 1, StartTime: &start,
			CompletionTime: &end, ExitCode: &code, Message: "noop host: wait recorded, nothing run"}}}
	// Not statuswrite.Write: this measures the API server's raw write rate, not a nodeops writer.
	return c.Status().Update(ctx, t)
}
func (taskWrites) cleanup(ctx context.Context, c client.Client, run string) error {
	if err := c.DeleteAllOf(ctx, &v1alpha1.NodeTask{}, client.MatchingLabels{"bench.nodeops.io/raw": run}); err != nil {
		return fmt.Errorf("deleting the raw-limit tasks: %w", err)
	}
	return nil
}

// measureRaw runs about writes API writes of workload w from clients parallel clients, each with
// its own connection and no client-side rate limit, and times them with the API server's CPU.
func measureRaw(ctx context.Context, c *cluster, w rawWorkload, writes, clients int) (rawResult, error) {
	units := max(writes/w.writesPer(), 1)
	res := rawResult{Workload: w.name(), Writes: units * w.writesPer(), Clients: clients, Load: readLoadAvg()}
	run := fmt.Sprintf("bench-raw-%d", time.Now().UnixNano())
	scheme, err := localcluster.NewScheme()
	if err != nil {
		return res, err
	}
	cs := make([]client.Client, clients)
	for i := range cs {
		cfg := rest.CopyConfig(c.cfg)
		cfg.QPS, cfg.Burst = -1, 0 // no client-side rate limit
		// A Dial function of its own keeps client-go from sharing one cached transport (and one
		// HTTP/2 connection) between the clients.
		d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
		cfg.Dial = d.DialContext
		if cs[i], err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
			return res, fmt.Errorf("client %d: %w", i, err)
		}
	}
	if err := w.prepare(ctx, cs[0], run); err != nil {
		return res, err
	}
	// Warm every connection so that TLS handshakes are not timed.
	for _, cl := range cs {
		if err := cl.List(ctx, &corev1.ConfigMapList{}, client.InNamespace("default"), client.Limit(1)); err != nil {
			return res, fmt.Errorf("warming a client: %w", err)
		}
	}
	apiPID, err := c.pid("kube-apiserver")
	if err != nil {
		return res, err
	}
	cpu0, err := cpuSeconds(apiPID)
	if err != nil {
		return res, err
	}
	var next, errs atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for _, cl := range cs {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(units) || ctx.Err() != nil {
					return
				}
				if err := w.do(ctx, cl, run, int(i)); err != nil {
					errs.Add(1)
					once.Do(func() { firstErr = err })
				}
			}
		})
	}
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	cpu1, err := cpuSeconds(apiPID)
	if err != nil {
		return res, err
	}
	res.APIServerCPU = cpu1 - cpu0
	// A failed unit may have made some of its writes; counting it as failing all of them errs low.
	res.Errors = int(errs.Load()) * w.writesPer()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if res.Errors > res.Writes/100 {
		return res, fmt.Errorf("%d of %d units failed, first: %w", errs.Load(), units, firstErr)
	}
	return res, w.cleanup(ctx, cs[0], run)
}
