package nodeprofile

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// NodePatchBody is the JSON merge patch that labels a node provisioned with hash (or, for a node
// leaving, removes label and annotation): one write per node, with no read-modify-write conflict.
// extra are the profile's spec.provisionedLabels, set and removed with its own label; a value
// $(NODE_NAME) is the node's name.
func NodePatchBody(profile string, extra []v1alpha1.ProvisionedLabel, np NodePatch, hash string) ([]byte, error) {
	var label, annotation any // nil removes
	if np.Provisioned {
		label, annotation = v1alpha1.ProvisionedValue, hash
	}
	labels := map[string]any{ProvisionedLabel(profile): label}
	for _, l := range extra {
		if !np.Provisioned {
			labels[l.Key] = nil
			continue
		}
		labels[l.Key] = l.ValueOn(np.Node)
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels":      labels,
		"annotations": map[string]any{HashAnnotation(profile): annotation},
	}})
	if err != nil {
		return nil, fmt.Errorf("encode patch for node %s: %w", np.Node, err)
	}
	return body, nil
}

func statusEqual(a, b *v1alpha1.NodeProfileStatus) bool { return equality.Semantic.DeepEqual(a, b) }

// sameConditionStates compares conditions by type, status and reason, ignoring messages (which carry counts).
func sameConditionStates(a, b []metav1.Condition) bool {
	if len(a) != len(b) {
		return false
	}
	state := map[string]string{}
	for _, c := range a {
		state[c.Type] = string(c.Status) + "/" + c.Reason
	}
	for _, c := range b {
		if s, ok := state[c.Type]; !ok || s != string(c.Status)+"/"+c.Reason {
			return false
		}
	}
	return true
}

func failuresEqual(a, b []v1alpha1.ProfileNodeFailure) bool { return equality.Semantic.DeepEqual(a, b) }
