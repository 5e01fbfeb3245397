// Package v1alpha1 holds the nodeops.io/v1alpha1 API: NodeOperation, NodeTask, NodeProfile and ClusterTarget.
// +kubebuilder:object:generate=true
// +groupName=nodeops.io
//
// It may import no nodeops package and not controller-runtime, so that any client imports the API alone;
// its zz_generated files are written by make generate, never by hand.
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every nodeops kind.
	GroupVersion = schema.GroupVersion{Group: "nodeops.io", Version: "v1alpha1"}

	// SchemeBuilder registers the nodeops kinds with a scheme. It is apimachinery's, so
	// importing the API does not pull in controller-runtime.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the nodeops kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&NodeOperation{}, &NodeOperationList{},
		&NodeTask{}, &NodeTaskList{},
		&NodeProfile{}, &NodeProfileList{},
		&ClusterTarget{}, &ClusterTargetList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

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
	// LabelTask names the NodeTask whose pod command created a pod.
	LabelTask = "nodeops.io/task"
	// ProfileLabelPrefix prefixes the node label a NodeProfile sets once a node is provisioned.
	ProfileLabelPrefix = "nodeops.io/profile."
	// ProfileHashAnnotationPrefix prefixes the node annotation holding the provisioned spec hash.
	ProfileHashAnnotationPrefix = "nodeops.io/profile-hash."
	// ProvisionedValue is the value of the profile label on provisioned nodes.
	ProvisionedValue = "provisioned"
	// NodeNameVariable in a NodeProfile's provisionedLabels value is the node's name.
	NodeNameVariable = "$(NODE_NAME)"
)
