package plan

import (
	"sort"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Unavailable counts the group's nodes that are unavailable: those whose task is unfinished
// (pending, running or failed) and those that are NotReady, each node once.
func Unavailable(groupNodes []string, tasks map[string]v1alpha1.TaskPhase, notReady map[string]bool) int {
	n := 0
	for _, node := range groupNodes {
		if phase, ok := tasks[node]; (ok && phase.Unfinished()) || notReady[node] {
			n++
		}
	}
	return n
}

// Next chooses which of the group's nodes get a task now: nodes without a task, in sorted order,
// while the unavailable count (see Unavailable) stays within maxUnavailable. NotReady nodes are
// never started; they wait until they are Ready again.
func Next(groupNodes []string, tasks map[string]v1alpha1.TaskPhase, notReady map[string]bool, maxUnavailable int) []string {
	room := maxUnavailable - Unavailable(groupNodes, tasks, notReady)
	if room <= 0 {
		return nil
	}
	sorted := append([]string(nil), groupNodes...)
	sort.Strings(sorted)
	var out []string
	for _, node := range sorted {
		if len(out) == room {
			break
		}
		if _, started := tasks[node]; started || notReady[node] {
			continue
		}
		out = append(out, node)
	}
	return out
}
