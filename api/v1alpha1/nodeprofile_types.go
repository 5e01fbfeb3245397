package v1alpha1

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ProfileTrigger selects nodes by an annotation, as KWasm's kwasm.sh/kwasm-node=true does.
type ProfileTrigger struct {
	// Annotation as key=value.
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^([a-z0-9.-]+/)?[A-Za-z0-9_.-]+=.*$`
	Annotation string `json:"annotation"`
}

// ProvisionedLabel is a label a NodeProfile sets on its provisioned nodes.
type ProvisionedLabel struct {
	// Key is a label key, [prefix/]name, outside nodeops.io/ (nodeops sets its own).
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('nodeops.io/')",message="nodeops.io/ labels are nodeops' own"
	Key string `json:"key"`
	// Value is a label value, or $(NODE_NAME) for the node's name.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^(\$\(NODE_NAME\)|([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?)$`
	Value string `json:"value"`
}

// ValueOn is the label's value on node: Value, with $(NODE_NAME) the node's name.
func (l ProvisionedLabel) ValueOn(node string) string {
	return strings.ReplaceAll(l.Value, NodeNameVariable, node)
}

// RuntimeClassSpec is a RuntimeClass the profile creates for its provisioned nodes.
type RuntimeClassSpec struct {
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Handler string `json:"handler"`
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
}

// NodeProfileSpec is what a set of nodes must have.
// +kubebuilder:validation:XValidation:rule="has(self.trigger) || self.autoProvision",message="set trigger.annotation or autoProvision, or no node is ever in the profile"
// +kubebuilder:validation:XValidation:rule="!has(self.selectorOnly) || !self.selectorOnly || (!has(self.trigger) && self.autoProvision)",message="selectorOnly: only the nodeSelector counts, so remove trigger and set autoProvision: true",fieldPath=".selectorOnly"
// +kubebuilder:validation:XValidation:rule="!has(self.selectorOnly) || !self.selectorOnly || (has(self.nodeSelector) && ((has(self.nodeSelector.matchLabels) && size(self.nodeSelector.matchLabels) > 0) || (has(self.nodeSelector.matchExpressions) && size(self.nodeSelector.matchExpressions) > 0)) && (!has(self.nodeSelector.matchLabels) || self.nodeSelector.matchLabels.all(k, k.startsWith('node-restriction.kubernetes.io/') || k.startsWith('node-role.kubernetes.io/'))) && (!has(self.nodeSelector.matchExpressions) || self.nodeSelector.matchExpressions.all(e, e.key.startsWith('node-restriction.kubernetes.io/') || e.key.startsWith('node-role.kubernetes.io/'))))",message="selectorOnly needs a nodeSelector whose every key is one no node may set on itself: under node-restriction.kubernetes.io/ or node-role.kubernetes.io/",fieldPath=".nodeSelector"
type NodeProfileSpec struct {
	// NodeSelector narrows the nodes the profile may provision.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn'] ? (has(e.values) && size(e.values) > 0) : (e.operator in ['Exists', 'DoesNotExist'] && (!has(e.values) || size(e.values) == 0)))",message="matchExpressions: the operator must be In, NotIn, Exists or DoesNotExist; In and NotIn need values, Exists and DoesNotExist take none"
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// Trigger: a node matching the selector is in the profile when it carries this annotation.
	// +optional
	Trigger *ProfileTrigger `json:"trigger,omitempty"`
	// AutoProvision: every node matching the selector is in the profile.
	// +optional
	AutoProvision bool `json:"autoProvision,omitempty"`
	// SelectorOnly makes the nodeSelector alone decide which nodes are in the profile, over labels
	// no node can set on itself: trigger is refused, autoProvision must be true, and every key of
	// nodeSelector must be under node-restriction.kubernetes.io/ or node-role.kubernetes.io/ (the
	// NodeRestriction admission plugin forbids a kubelet to set them on its Node). Without it,
	// whoever may annotate or label a Node, its own kubelet's credentials among them, can bring
	// that node into the profile and have its install run there.
	// +optional
	SelectorOnly bool `json:"selectorOnly,omitempty"`
	// Install runs when a node enters the profile (and again when the spec changes).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// Names are what status and the CLI show beside each index; nameless commands of one kind may repeat.
	Install CommandList `json:"install"`
	// Uninstall runs when a node leaves the profile.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// Names are what status and the CLI show beside each index; nameless commands of one kind may repeat.
	Uninstall CommandList `json:"uninstall,omitempty"`
	// ProvisionedLabels are labels set on a node once it is provisioned, beside
	// nodeops.io/profile.<name>=provisioned, and removed when it leaves the profile; the value
	// $(NODE_NAME) is the node's name. KWasm's and runtime-class-manager's workloads select
	// kwasm.sh/kwasm-provisioned: {key: kwasm.sh/kwasm-provisioned, value: $(NODE_NAME)} keeps them
	// running. A change relabels provisioned nodes without installing again; a key removed from
	// here stays on nodes already provisioned.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +listType=map
	// +listMapKey=key
	ProvisionedLabels []ProvisionedLabel `json:"provisionedLabels,omitempty"`
	// RuntimeClasses to create, selecting provisioned nodes.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	RuntimeClasses []RuntimeClassSpec `json:"runtimeClasses,omitempty"`
	// MaxUnavailable: how many nodes may be provisioning or failed at once.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^([1-9][0-9]?|100)%$')",message="must be an integer >= 1 or a percentage from 1% to 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// TTLSecondsAfterFinished deletes a superseded task (an install replaced after a spec change,
	// an install or uninstall followed by the other) this long after it finished. A node's latest
	// task is kept whatever it says, and nothing is deleted when unset (nothing deleted automatically, rule 7).
	// +optional
	// +kubebuilder:validation:Minimum=0
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
	// Windows: no new install or uninstall task starts outside all of them (none means always);
	// running tasks go on to their end. Changing them re-provisions nothing (not in the spec hash).
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Windows []MaintenanceWindow `json:"windows,omitempty"`
	// Gates must all pass before each node's install or uninstall task starts, after the windows
	// allow it; while one does not, no new task starts and running ones go on to their end. A gate
	// that has not passed for its timeout blocks the profile (condition Blocked, reason
	// GateTimedOut) until a person retries or skips it with the annotations NodeOperation's gates
	// take (docs/how-to/health-gates.md). Changing them re-provisions nothing (not in the spec hash).
	// A command gate runs its script as a gate-check NodeTask owned by the profile; an
	// alertmanager gate with a silence holds one over each node while its task runs (status.silences).
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	Gates []Gate `json:"gates,omitempty"`
}

// ProfileNodeCounts counts the profile's nodes.
type ProfileNodeCounts struct {
	Matched      int32 `json:"matched"`
	Provisioned  int32 `json:"provisioned"`
	Provisioning int32 `json:"provisioning"`
	Failed       int32 `json:"failed"`
	// Outdated: nodes in the profile still provisioned at an older spec hash (a spec change rolls
	// them over under maxUnavailable).
	// +optional
	Outdated int32 `json:"outdated,omitempty"`
}

// ProfileHashNodes counts the nodes provisioned at one spec hash.
type ProfileHashNodes struct {
	Hash  string `json:"hash"`
	Nodes int32  `json:"nodes"`
}

// ProfileNodeFailure names a node whose install or uninstall failed.
type ProfileNodeFailure struct {
	Node    string `json:"node"`
	Task    string `json:"task"`
	Message string `json:"message"`
}

// NodeProfileStatus reports the profile's nodes.
type NodeProfileStatus struct {
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// +optional
	Nodes ProfileNodeCounts `json:"nodes"`
	// +optional
	// +kubebuilder:validation:MaxItems=100
	Failures []ProfileNodeFailure `json:"failures,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Hashes are the spec hashes the profile's nodes are provisioned at, the current one first:
	// during a rollout, the nodes at the old and at the new hash.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Hashes []ProfileHashNodes `json:"hashes,omitempty"`
	// SpecHash is the hash provisioned nodes carry in their annotation.
	// +optional
	SpecHash string `json:"specHash,omitempty"`
	// NextStart is when a task may start again while nodes wait outside the maintenance windows
	// (condition Provisioning, reason WaitingForWindow); unset otherwise or when no window opens
	// within a year.
	// +optional
	NextStart *metav1.Time `json:"nextStart,omitempty"`
	// Gates are the last result of each of spec.gates checked so far, and when it was checked.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Gates []GateStatus `json:"gates,omitempty"`
	// Silences are the Alertmanager silences the profile holds over nodes being worked on
	// (spec.gates[].alertmanager.silence), so that a restarted manager extends and expires them
	// rather than creating others. Their group is empty.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	Silences []SilenceStatus `json:"silences,omitempty"`
}

// Condition types of a NodeProfile.
const (
	ConditionReady        = "Ready"
	ConditionProvisioning = "Provisioning"
	ConditionDegraded     = "Degraded"
)

// A NodeProfile also has ConditionBlocked (NodeOperation's type): True while a gate that timed
// out stops its new tasks until a person retries or skips it, so that
// `kubectl wait nodeprofile/NAME --for=condition=Blocked` works.

// NodeProfile is what a set of nodes must have: installed by NodeTasks, then labelled.
// The name is at most 50 characters because it becomes part of the node label key
// nodeops.io/profile.<name> and annotation key nodeops.io/profile-hash.<name> (63 at most after the prefix).
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 50",message="a NodeProfile's name is at most 50 characters: it becomes part of node label and annotation keys"
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=nprof,categories=nodeops
// +kubebuilder:printcolumn:name="Matched",type=integer,JSONPath=`.status.nodes.matched`
// +kubebuilder:printcolumn:name="Provisioned",type=integer,JSONPath=`.status.nodes.provisioned`
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.nodes.failed`
// +kubebuilder:printcolumn:name="Outdated",type=integer,JSONPath=`.status.nodes.outdated`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeProfile struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeProfileSpec   `json:"spec"`
	Status NodeProfileStatus `json:"status,omitempty"`
}

// NodeProfileList lists NodeProfiles.
// +kubebuilder:object:root=true
type NodeProfileList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeProfile `json:"items"`
}
