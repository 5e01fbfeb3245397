package metrics

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/version"
)

// Names of the agent's series.
const (
	AgentCommands   = "nodeops_agent_commands"
	AgentLastResult = "nodeops_agent_last_result_timestamp_seconds"
	AgentBuildInfo  = "nodeops_agent_build_info"
)

// Agent is the agent's collector, computed from the NodeTasks it caches (its own nodes' only).
type Agent struct {
	reader client.Reader
	serves func(node string) bool

	commands, last, build *prometheus.Desc
}

// AgentSeries are the agent's series, in the order the metrics reference lists them.
func AgentSeries() []Series {
	return []Series{
		{AgentCommands, dto.MetricType_GAUGE, "Commands of this agent's nodes' NodeTasks by kind and result (Succeeded, Failed, Skipped), as their status records them.", []string{"kind", "result"}},
		{AgentLastResult, dto.MetricType_GAUGE, "When a command of this kind last ended with this result on this agent's nodes, in Unix seconds.", []string{"kind", "result"}},
		{AgentBuildInfo, dto.MetricType_GAUGE, "The agent's build: always 1.", []string{"version", "revision", "goversion"}},
	}
}

// NewAgent reads the agent's tasks through reader at every scrape; serves says which nodes are the agent's.
func NewAgent(reader client.Reader, serves func(node string) bool) *Agent {
	d := descs(AgentSeries())
	return &Agent{
		reader:   reader,
		serves:   serves,
		commands: d[AgentCommands],
		last:     d[AgentLastResult],
		build:    d[AgentBuildInfo],
	}
}

// Describe implements prometheus.Collector.
func (a *Agent) Describe(ch chan<- *prometheus.Desc) {
	ch <- a.commands
	ch <- a.last
	ch <- a.build
}

// Collect implements prometheus.Collector.
func (a *Agent) Collect(ch chan<- prometheus.Metric) {
	v := version.Get()
	ch <- prometheus.MustNewConstMetric(a.build, prometheus.GaugeValue, 1, v.Version, v.Revision, v.GoVersion)
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	var tasks v1alpha1.NodeTaskList
	if err := a.reader.List(ctx, &tasks, client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(a.commands, fmt.Errorf("list NodeTasks: %w", err))
		return
	}
	counts := map[[2]string]int{}
	last := map[[2]string]float64{}
	for i := range tasks.Items {
		t := &tasks.Items[i]
		if !a.serves(t.Spec.NodeName) {
			continue
		}
		for j, cs := range t.Status.Commands {
			if cs.Phase != v1alpha1.CommandSucceeded && cs.Phase != v1alpha1.CommandFailed && cs.Phase != v1alpha1.CommandSkipped {
				continue
			}
			k := [2]string{commandKind(t, j), string(cs.Phase)}
			counts[k]++
			if cs.CompletionTime != nil {
				last[k] = max(last[k], unix(cs.CompletionTime.Time))
			}
		}
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(a.commands, prometheus.GaugeValue, float64(n), k[0], k[1])
		if ts, ok := last[k]; ok {
			ch <- prometheus.MustNewConstMetric(a.last, prometheus.GaugeValue, ts, k[0], k[1])
		}
	}
}
