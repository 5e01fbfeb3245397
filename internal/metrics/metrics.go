// Package metrics computes nodeops' Prometheus series from the objects in a controller's cache at
// each scrape, as kube-state-metrics does: a restarted manager, or a second replica, reports the
// same values from the same objects, so nothing is counted twice. The one exception is the
// failure counter, counted from the NodeTask changes the manager observes (failures.go;
// docs/architecture.md, "Metrics").
//
// It only reads (the cache, at scrape time): it writes nothing to the API server.
package metrics

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/version"
)

// The manager's metrics server authenticates and authorizes each scrape
// (controller-runtime's filters.WithAuthenticationAndAuthorization) through the API server.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Names of the manager's series; the chart's PrometheusRule refers to them (test/chart checks).
const (
	Operations            = "nodeops_operations"
	Tasks                 = "nodeops_tasks"
	GroupUnavailableNodes = "nodeops_group_unavailable_nodes"
	GroupMaxUnavailable   = "nodeops_group_max_unavailable"
	CommandDuration       = "nodeops_command_duration_seconds"
	CommandPhaseDuration  = "nodeops_command_phase_duration_seconds"
	CommandsFailed        = "nodeops_commands_failed_total"
	OperationBlockedSince = "nodeops_operation_blocked_since_timestamp_seconds"
	CertificateExpiry     = "nodeops_certificate_expiry_timestamp_seconds"
	Gates                 = "nodeops_gates"
	GateSince             = "nodeops_gate_since_timestamp_seconds"
	GateWaits             = "nodeops_gate_waits_total"
	GateFailures          = "nodeops_gate_failures_total"
	BuildInfo             = "nodeops_build_info"
)

// DurationBuckets are the command duration histogram's upper bounds, in seconds: from a quick
// cordon to a long drain or kubeadm upgrade.
var DurationBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600}

// scrapeTimeout bounds a scrape's reads; they come from the informer cache, so it is only reached
// before the cache has synced.
const scrapeTimeout = 10 * time.Second

var (
	operationPhases = []v1alpha1.OperationPhase{v1alpha1.OperationPending, v1alpha1.OperationRunning, v1alpha1.OperationPaused,
		v1alpha1.OperationBlocked, v1alpha1.OperationSucceeded, v1alpha1.OperationFailed, v1alpha1.OperationAborted}
	taskPhases = []v1alpha1.TaskPhase{v1alpha1.TaskPending, v1alpha1.TaskRunning, v1alpha1.TaskSucceeded, v1alpha1.TaskFailed, v1alpha1.TaskAborted}
)

// Manager is the manager's collector: operations, tasks, budgets, commands, certificates.
type Manager struct {
	reader   client.Reader
	failures *failures
	gateRuns *gateCounts

	operations, tasks, unavailable, maxUnavailable, duration, phaseDuration, failed, blockedSince, certExpiry, build, gates, gateSince, gateWaits, gateFailures *prometheus.Desc
}

// Series is one metric family a collector exports, declared once: the collector builds its
// descriptor from it and the metrics reference (docs/reference/metrics.md) is generated from it.
type Series struct {
	Name   string
	Type   dto.MetricType
	Help   string
	Labels []string
}

func (s Series) desc() *prometheus.Desc { return prometheus.NewDesc(s.Name, s.Help, s.Labels, nil) }

// ManagerSeries are the manager's series, in the order the metrics reference lists them.
func ManagerSeries() []Series {
	return []Series{
		{Operations, dto.MetricType_GAUGE, "NodeOperations by phase.", []string{"phase"}},
		{Tasks, dto.MetricType_GAUGE, "NodeTasks by phase (a task whose agent was lost counts as Failed).", []string{"phase"}},
		{GroupUnavailableNodes, dto.MetricType_GAUGE, "Nodes of a running or blocked group that count against its maxUnavailable: held by an unfinished task (any operation's or profile's), NotReady or cordoned.", []string{"operation", "group"}},
		{GroupMaxUnavailable, dto.MetricType_GAUGE, "A running or blocked group's maxUnavailable, in nodes.", []string{"operation", "group"}},
		{CommandDuration, dto.MetricType_HISTOGRAM, "Duration of the succeeded commands the NodeTasks in the cluster record, by command kind.", []string{"kind"}},
		{CommandPhaseDuration, dto.MetricType_HISTOGRAM, "The succeeded commands' durations split by phase: Run, the time the work ran, and each thing a command waited for (MirrorPodGone, MirrorPodBack, NodeReady, ControlPlaneHealthy, Drain, SecretMount, Wait), by command kind.", []string{"kind", "phase"}},
		{CommandsFailed, dto.MetricType_COUNTER, "Command runs this manager saw fail since it started, by command kind and the task's failure reason (CommandFailed, Interrupted, AgentLost, NodeDeleted).", []string{"kind", "reason"}},
		{OperationBlockedSince, dto.MetricType_GAUGE, "When a Blocked NodeOperation became Blocked, in Unix seconds.", []string{"operation"}},
		{CertificateExpiry, dto.MetricType_GAUGE, "When a control plane's kubeadm certificate expires, in Unix seconds, as the ClusterTarget observed it.", []string{"node", "certificate"}},
		{Gates, dto.MetricType_GAUGE, "Health gates of unfinished NodeOperations that hold a group (Waiting) or block their operation (TimedOut: it waits for a person's retry or skip), by gate name.", []string{"gate", "state"}},
		{GateSince, dto.MetricType_GAUGE, "When a gate of an unfinished NodeOperation began holding (Waiting) or blocking (TimedOut), in Unix seconds.", []string{"operation", "group", "gate", "state"}},
		{GateWaits, dto.MetricType_COUNTER, "Times this manager saw a gate begin holding a group (its state Waiting) since it started, by gate name.", []string{"gate"}},
		{GateFailures, dto.MetricType_COUNTER, "Times this manager saw a gate block its operation (its state TimedOut) since it started, by gate name and reason: Held (what it checked said no for its whole timeout) or Unevaluable (it could not be checked: an unreachable server, a failing expression, a refused silence).", []string{"gate", "reason"}},
		{BuildInfo, dto.MetricType_GAUGE, "The manager's build: always 1.", []string{"version", "revision", "goversion"}},
	}
}

// descs builds every series' descriptor by name.
func descs(series []Series) map[string]*prometheus.Desc {
	out := make(map[string]*prometheus.Desc, len(series))
	for _, s := range series {
		out[s.Name] = s.desc()
	}
	return out
}

// NewManager reads the cluster through reader (the manager's cache) at every scrape.
func NewManager(reader client.Reader) *Manager {
	d := descs(ManagerSeries())
	return &Manager{
		reader:         reader,
		failures:       newFailures(),
		gateRuns:       newGateCounts(),
		gateWaits:      d[GateWaits],
		gateFailures:   d[GateFailures],
		operations:     d[Operations],
		tasks:          d[Tasks],
		unavailable:    d[GroupUnavailableNodes],
		maxUnavailable: d[GroupMaxUnavailable],
		duration:       d[CommandDuration],
		phaseDuration:  d[CommandPhaseDuration],
		failed:         d[CommandsFailed],
		blockedSince:   d[OperationBlockedSince],
		certExpiry:     d[CertificateExpiry],
		build:          d[BuildInfo],
		gates:          d[Gates],
		gateSince:      d[GateSince],
	}
}

// Describe implements prometheus.Collector.
func (m *Manager) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.operations, m.tasks, m.unavailable, m.maxUnavailable, m.duration, m.phaseDuration, m.failed, m.blockedSince, m.certExpiry, m.build, m.gates, m.gateSince, m.gateWaits, m.gateFailures} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: it lists from the reader and computes every series.
func (m *Manager) Collect(ch chan<- prometheus.Metric) {
	v := version.Get()
	ch <- prometheus.MustNewConstMetric(m.build, prometheus.GaugeValue, 1, v.Version, v.Revision, v.GoVersion)
	for k, n := range m.failures.snapshot() {
		ch <- prometheus.MustNewConstMetric(m.failed, prometheus.CounterValue, n, k[0], k[1])
	}
	waits, gateFailed := m.gateRuns.snapshot()
	for gate, n := range waits {
		ch <- prometheus.MustNewConstMetric(m.gateWaits, prometheus.CounterValue, n, gate)
	}
	for k, n := range gateFailed {
		ch <- prometheus.MustNewConstMetric(m.gateFailures, prometheus.CounterValue, n, k[0], k[1])
	}

	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	var (
		ops     v1alpha1.NodeOperationList
		tasks   v1alpha1.NodeTaskList
		nodes   corev1.NodeList
		targets v1alpha1.ClusterTargetList
	)
	for _, l := range []client.ObjectList{&ops, &tasks, &nodes, &targets} {
		if err := m.reader.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
			ch <- prometheus.NewInvalidMetric(m.operations, fmt.Errorf("list %T: %w", l, err))
			return
		}
	}
	m.collectOperations(ch, ops.Items, tasks.Items, nodes.Items)
	m.collectTasks(ch, tasks.Items)
	for i := range targets.Items {
		for _, oc := range targets.Items[i].Status.Certificates {
			for _, c := range oc.Certificates {
				ch <- prometheus.MustNewConstMetric(m.certExpiry, prometheus.GaugeValue, unix(c.NotAfter.Time), oc.Node, c.Name)
			}
		}
	}
}

func (m *Manager) collectOperations(ch chan<- prometheus.Metric, ops []v1alpha1.NodeOperation, tasks []v1alpha1.NodeTask, nodes []corev1.Node) {
	byPhase := map[v1alpha1.OperationPhase]int{}
	var active []*v1alpha1.NodeOperation
	for i := range ops {
		op := &ops[i]
		p := op.Status.Phase
		if p == "" {
			p = v1alpha1.OperationPending
		}
		byPhase[p]++
		if p == v1alpha1.OperationBlocked {
			if c := meta.FindStatusCondition(op.Status.Conditions, v1alpha1.ConditionBlocked); c != nil && c.Status == metav1.ConditionTrue {
				ch <- prometheus.MustNewConstMetric(m.blockedSince, prometheus.GaugeValue, unix(c.LastTransitionTime.Time), op.Name)
			}
		}
		if !p.Finished() {
			active = append(active, op)
		}
	}
	for _, p := range operationPhases {
		ch <- prometheus.MustNewConstMetric(m.operations, prometheus.GaugeValue, float64(byPhase[p]), string(p))
	}
	m.collectGates(ch, active)
	if len(active) == 0 {
		return
	}
	down := downNodes(tasks, nodes)
	for _, op := range active {
		groups, err := plan.Resolve(&op.Spec, nodes)
		if err != nil {
			continue // the operation fails with the same error; it has no budget to report
		}
		for _, gs := range op.Status.Groups {
			if gs.Phase != v1alpha1.GroupRunning && gs.Phase != v1alpha1.GroupBlocked {
				continue
			}
			for _, g := range groups {
				if g.Name != gs.Name {
					continue
				}
				n := 0
				for _, node := range g.Nodes {
					if down[node] {
						n++
					}
				}
				ch <- prometheus.MustNewConstMetric(m.unavailable, prometheus.GaugeValue, float64(n), op.Name, g.Name)
				ch <- prometheus.MustNewConstMetric(m.maxUnavailable, prometheus.GaugeValue, float64(g.MaxUnavailable), op.Name, g.Name)
			}
		}
	}
}

// downNodes are the nodes counted unavailable everywhere (unavailable nodes count against maxUnavailable and budgets are cluster-wide, rules 2 and 11):
// held by an unfinished task of any owner, NotReady, or cordoned.
func downNodes(tasks []v1alpha1.NodeTask, nodes []corev1.Node) map[string]bool {
	down := map[string]bool{}
	for i := range tasks {
		// As nodelock.Holds: a gate check its agent recorded failed holds no node.
		if tasks[i].EffectivePhase().Unfinished() && (tasks[i].Status.Phase != v1alpha1.TaskFailed || !v1alpha1.IsGateCheck(&tasks[i])) {
			down[tasks[i].Spec.NodeName] = true
		}
	}
	for i := range nodes {
		if !plan.NodeReady(&nodes[i]) || nodes[i].Spec.Unschedulable {
			down[nodes[i].Name] = true
		}
	}
	return down
}

func (m *Manager) collectTasks(ch chan<- prometheus.Metric, tasks []v1alpha1.NodeTask) {
	byPhase := map[v1alpha1.TaskPhase]int{}
	durations := map[string]*histogram{}
	phases := map[[2]string]*histogram{} // by kind and phase
	for i := range tasks {
		t := &tasks[i]
		byPhase[t.EffectivePhase()]++
		for j := range t.Status.Commands {
			cs := &t.Status.Commands[j]
			if cs.Phase != v1alpha1.CommandSucceeded || cs.StartTime == nil || cs.CompletionTime == nil {
				continue
			}
			kind := commandKind(t, j)
			took := cs.CompletionTime.Sub(cs.StartTime.Time)
			histogramOf(durations, kind).observe(took.Seconds())
			histogramOf(phases, [2]string{kind, "Run"}).observe(max(took-cs.Waited(), 0).Seconds())
			for _, w := range cs.Waits {
				histogramOf(phases, [2]string{kind, string(w.For)}).observe(w.Duration.Seconds())
			}
		}
	}
	for _, p := range taskPhases {
		ch <- prometheus.MustNewConstMetric(m.tasks, prometheus.GaugeValue, float64(byPhase[p]), string(p))
	}
	for _, kind := range sortedKeys(durations) {
		h := durations[kind]
		ch <- prometheus.MustNewConstHistogram(m.duration, h.count, h.sum, h.buckets, kind)
	}
	keys := make([][2]string, 0, len(phases))
	for k := range phases {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i][0] < keys[j][0] || keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1]
	})
	for _, k := range keys {
		h := phases[k]
		ch <- prometheus.MustNewConstHistogram(m.phaseDuration, h.count, h.sum, h.buckets, k[0], k[1])
	}
}

// commandKind is the kind of t's command j as its spec names it, "unknown" past the spec's end.
func commandKind(t *v1alpha1.NodeTask, j int) string {
	if j < len(t.Spec.Commands) {
		return t.Spec.Commands[j].Kind()
	}
	return "unknown"
}

// failureReason is why a failed task failed (CommandFailed, Interrupted, AgentLost, NodeDeleted),
// empty for a task that has not failed.
func failureReason(t *v1alpha1.NodeTask) string {
	if t.EffectivePhase() != v1alpha1.TaskFailed {
		return ""
	}
	if c := t.Lost(); c != nil {
		return c.Reason
	}
	if t.Status.Reason != "" {
		return t.Status.Reason
	}
	return v1alpha1.ReasonCommandFailed
}

// histogramOf is hs[k], made on first use.
func histogramOf[K comparable](hs map[K]*histogram, k K) *histogram {
	h := hs[k]
	if h == nil {
		h = newHistogram()
		hs[k] = h
	}
	return h
}

type histogram struct {
	count   uint64
	sum     float64
	buckets map[float64]uint64
}

func newHistogram() *histogram {
	h := &histogram{buckets: make(map[float64]uint64, len(DurationBuckets))}
	for _, b := range DurationBuckets {
		h.buckets[b] = 0
	}
	return h
}

// observe adds one duration; buckets are cumulative, as Prometheus histograms are.
func (h *histogram) observe(seconds float64) {
	h.count++
	h.sum += seconds
	for _, b := range DurationBuckets {
		if seconds <= b {
			h.buckets[b]++
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// collectGates reports the gates of unfinished operations that hold or block: how many by gate
// name and state, and since when each one.
func (m *Manager) collectGates(ch chan<- prometheus.Metric, active []*v1alpha1.NodeOperation) {
	type key struct{ gate, state string }
	count := map[key]int{}
	for _, op := range active {
		for _, g := range op.Status.Gates {
			if g.State != v1alpha1.GateWaiting && g.State != v1alpha1.GateTimedOut {
				continue
			}
			count[key{g.Name, string(g.State)}]++
			ch <- prometheus.MustNewConstMetric(m.gateSince, prometheus.GaugeValue, unix(g.Since.Time), op.Name, g.Group, g.Name, string(g.State))
		}
	}
	for k, n := range count {
		ch <- prometheus.MustNewConstMetric(m.gates, prometheus.GaugeValue, float64(n), k.gate, k.state)
	}
}
