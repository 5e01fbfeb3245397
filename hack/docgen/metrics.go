package main

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/internal/metrics"
)

// metricsReference renders docs/reference/metrics.md from the series the manager's and the agent's
// collectors declare, after registering both collectors as their programs do: a series a collector
// describes but does not declare fails here, so the page cannot miss one.
func metricsReference() (string, error) {
	var reader client.Reader // describing reads nothing
	var b strings.Builder
	b.WriteString(generatedHeader("the collectors in internal/metrics"))
	b.WriteString("# Metrics\n\n")
	b.WriteString("nodeops computes its series from the objects in the cluster at each scrape, so a restarted or second\n")
	b.WriteString("manager reports the same values; `nodeops_commands_failed_total` alone is counted by the manager from\n")
	b.WriteString("the task changes it sees, and starts from 0 with the process. The manager also serves\n")
	b.WriteString("controller-runtime's own series (`controller_runtime_*`, `workqueue_*`, `rest_client_*`).\n\n")
	for _, c := range []struct {
		title, intro string
		collector    prometheus.Collector
		series       []metrics.Series
	}{
		{"Manager", "Served by the manager on its metrics port (HTTPS, to a token allowed to get `/metrics`).",
			metrics.NewManager(reader), metrics.ManagerSeries()},
		{"Agent", "Served by each agent about the NodeTasks of its own nodes.",
			metrics.NewAgent(reader, func(string) bool { return true }), metrics.AgentSeries()},
	} {
		if err := checkDescribed(c.collector, c.series); err != nil {
			return "", fmt.Errorf("%s collector: %w", c.title, err)
		}
		fmt.Fprintf(&b, "## %s\n\n%s\n\n", c.title, c.intro)
		b.WriteString("| Name | Type | Labels | Description |\n|---|---|---|---|\n")
		for _, s := range c.series {
			labels := "none"
			if len(s.Labels) > 0 {
				labels = codeList(s.Labels)
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", s.Name, strings.ToLower(s.Type.String()), labels, s.Help)
		}
		b.WriteString("\n")
	}
	return b.String(), nil
}

// checkDescribed registers c in a registry of its own and requires that what it describes is
// exactly the declared series.
func checkDescribed(c prometheus.Collector, series []metrics.Series) error {
	if err := prometheus.NewPedanticRegistry().Register(c); err != nil {
		return fmt.Errorf("register: %w", err)
	}
	want := map[string]bool{}
	for _, s := range series {
		want[prometheus.NewDesc(s.Name, s.Help, s.Labels, nil).String()] = true
	}
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	n := 0
	for d := range ch {
		n++
		if !want[d.String()] {
			return fmt.Errorf("it describes %s, which its Series list does not declare", d)
		}
	}
	if n != len(series) {
		return fmt.Errorf("it describes %d series but declares %d", n, len(series))
	}
	return nil
}
