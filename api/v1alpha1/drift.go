package v1alpha1

import (
	"encoding/json"
	"fmt"
	"sort"
)

// AnnotationDrift is the node annotation in which a node's agent records whether its static pod
// manifests (/etc/kubernetes/manifests) and kubelet configuration (/var/lib/kubelet/config.yaml)
// match what kubeadm generates from the cluster's kubeadm-config and kubelet-config ConfigMaps,
// read on the agent's slow interval and when those files change, and written only when the reading
// changed (docs/how-to/clustertarget.md, "Drift"). The value is EncodeDrift's JSON.
const AnnotationDrift = "nodeops.io/drift"

// Drift components: the control plane's static pods and the kubelet's configuration.
const (
	DriftKubeAPIServer         = "kube-apiserver"
	DriftKubeControllerManager = "kube-controller-manager"
	DriftKubeScheduler         = "kube-scheduler"
	DriftKubelet               = "kubelet"
)

// ComponentDrift is one component of a node that differs from what kubeadm generates.
type ComponentDrift struct {
	// Component is kube-apiserver, kube-controller-manager, kube-scheduler or kubelet.
	Component string `json:"component"`
	// Reason says in short what differs, such as "flag --audit-log-maxage=7, kubeadm's has none".
	Reason string `json:"reason"`
}

// DriftReading is what a node's agent read: the components that drift, or why it could not read.
type DriftReading struct {
	// Components that differ from kubeadm's, sorted by component; none when the node matches.
	// +optional
	Components []ComponentDrift `json:"components,omitempty"`
	// Error says why the node could not be compared (kubeadm failed, a file unreadable).
	// +optional
	Error string `json:"error,omitempty"`
}

// maxDriftReason bounds each reason, so the annotation and the status stay small.
const maxDriftReason = 256

// EncodeDrift is the value of AnnotationDrift for a reading: components sorted, reasons bounded,
// so that the same reading always gives the same text.
func EncodeDrift(r DriftReading) string {
	out := DriftReading{Error: bounded(r.Error)}
	for _, c := range r.Components {
		out.Components = append(out.Components, ComponentDrift{Component: c.Component, Reason: bounded(c.Reason)})
	}
	sort.SliceStable(out.Components, func(i, j int) bool { return out.Components[i].Component < out.Components[j].Component })
	b, err := json.Marshal(out)
	if err != nil { // strings always marshal
		panic(err)
	}
	return string(b)
}

func bounded(s string) string {
	if len(s) <= maxDriftReason {
		return s
	}
	return s[:maxDriftReason-3] + "..."
}

// DecodeDrift reads a value of AnnotationDrift.
func DecodeDrift(value string) (DriftReading, error) {
	var out DriftReading
	if err := json.Unmarshal([]byte(value), &out); err != nil {
		return DriftReading{}, fmt.Errorf("annotation %s: %w", AnnotationDrift, err)
	}
	for _, c := range out.Components {
		if c.Component == "" {
			return DriftReading{}, fmt.Errorf("annotation %s: every component needs a name", AnnotationDrift)
		}
	}
	return out, nil
}

// ObservedDrift is one node's drift as its agent last read it.
type ObservedDrift struct {
	Node string `json:"node"`
	// Drifted: some component differs from what kubeadm generates from the cluster's ConfigMaps.
	Drifted bool `json:"drifted"`
	// Components that differ, with a short reason each.
	// +optional
	Components []ComponentDrift `json:"components,omitempty"`
	// Problem says why the reading says nothing: the agent could not compare, or the reading is
	// unreadable.
	// +optional
	Problem string `json:"problem,omitempty"`
}
