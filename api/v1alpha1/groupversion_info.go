// Package v1alpha1 holds the nodeops.io/v1alpha1 API: NodeOperation, NodeTask and NodeProfile.
// +kubebuilder:object:generate=true
// +groupName=nodeops.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every nodeops kind.
	GroupVersion = schema.GroupVersion{Group: "nodeops.io", Version: "v1alpha1"}

	// SchemeBuilder registers the nodeops kinds with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the nodeops kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Labels and annotations nodeops sets.
const (
	// LabelOperation names the NodeOperation a NodeTask belongs to.
	LabelOperation = "nodeops.io/operation"
	// LabelProfile names the NodeProfile a NodeTask belongs to.
	LabelProfile = "nodeops.io/profile"
	// LabelNode names the node a NodeTask runs on.
	LabelNode = "nodeops.io/node"
	// LabelGroup names the group of a NodeTask within its operation.
	LabelGroup = "nodeops.io/group"
	// ProfileLabelPrefix prefixes the node label a NodeProfile sets once a node is provisioned.
	ProfileLabelPrefix = "nodeops.io/profile."
	// ProfileHashAnnotationPrefix prefixes the node annotation holding the provisioned spec hash.
	ProfileHashAnnotationPrefix = "nodeops.io/profile-hash."
	// ProvisionedValue is the value of the profile label on provisioned nodes.
	ProvisionedValue = "provisioned"
)
