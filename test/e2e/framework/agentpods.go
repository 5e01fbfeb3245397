package framework

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/internal/localcluster"
)

// PodEvent is one event of a watch on pods, in the order the server sent them.
type PodEvent struct {
	Type watch.EventType
	Pod  *corev1.Pod
}

// PodWatch records the events of a watch on the agents' pods (WatchAgentPods).
type PodWatch struct{ rec *recorder[*corev1.Pod] }

// WatchAgentPods records every event of the agents' pods (nodeops-system, labelled as config/agent
// labels them: the stand-in pods and the agent Jobs' pods) from now on, resuming where the server
// dropped the watch. The test's cleanup stops it.
func WatchAgentPods(t testing.TB, l *Local) *PodWatch {
	t.Helper()
	wc, err := client.NewWithWatch(l.RESTConfig, client.Options{Scheme: l.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	opts := []client.ListOption{client.InNamespace(localcluster.SystemNamespace), client.MatchingLabels{localcluster.AgentLabel: localcluster.AgentLabelValue}}
	var list corev1.PodList
	if err := wc.List(context.Background(), &list, opts...); err != nil {
		t.Fatal(err)
	}
	return &PodWatch{rec: record[*corev1.Pod](t, wc, &corev1.PodList{}, list.ResourceVersion, "the agents' pods", l.apiServerPID, opts...)}
}

// Stop ends the watch and returns its events; a watch that failed fails t, as it may have missed some.
func (pw *PodWatch) Stop(t testing.TB) []PodEvent {
	t.Helper()
	pw.rec.stop()
	var out []PodEvent
	for _, ev := range pw.rec.recordedSoFar(t) {
		out = append(out, PodEvent{Type: ev.Type, Pod: ev.Object})
	}
	return out
}

// Disruptions names, from events, every moment a pod of node that had not finished was evicted
// (an Eviction's DisruptionTarget condition), deleting or deleted: what a drain that spares the
// agent's pod never does to it.
func Disruptions(events []PodEvent, node string) []string {
	var out []string
	for _, ev := range events {
		p := ev.Pod
		if p.Spec.NodeName != node || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
				out = append(out, fmt.Sprintf("%s %s: %s (%s)", ev.Type, p.Name, c.Reason, c.Message))
			}
		}
		switch {
		case ev.Type == watch.Deleted:
			out = append(out, fmt.Sprintf("%s %s in phase %s", ev.Type, p.Name, p.Status.Phase))
		case p.DeletionTimestamp != nil:
			out = append(out, fmt.Sprintf("%s %s: deleting in phase %s", ev.Type, p.Name, p.Status.Phase))
		}
	}
	return out
}
