package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Gate is a check that must pass before each node of a group starts. While it does not pass the
// operation waits (reason WaitingForGate); once it has not passed for Timeout the operation goes
// Blocked with the gate's message, and a person retries (re-checks) or skips it. A gate that
// cannot be evaluated (an unreachable server, an expression that fails) does not pass: no gate
// ever lets work go on by default (rule 14).
// +kubebuilder:validation:XValidation:rule="[has(self.cel), has(self.clusterHealth), has(self.prometheus), has(self.alertmanager), has(self.command), has(self.approval)].filter(x, x).size() == 1",message="exactly one of cel, clusterHealth, prometheus, alertmanager, command or approval must be set"
type Gate struct {
	// Name identifies the gate in status, events, metrics and `kubectl nodeops approve|retry|skip --gate`.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Timeout is how long the gate may hold a group before the operation goes Blocked.
	// +optional
	// +kubebuilder:default="30m0s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('168h')",message="must be from 1s to 168h"
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// +optional
	CEL *CELGate `json:"cel,omitempty"`
	// +optional
	ClusterHealth *ClusterHealthGate `json:"clusterHealth,omitempty"`
	// +optional
	Prometheus *PrometheusGate `json:"prometheus,omitempty"`
	// +optional
	Alertmanager *AlertmanagerGate `json:"alertmanager,omitempty"`
	// +optional
	Command *CommandGate `json:"command,omitempty"`
	// +optional
	Approval *ApprovalGate `json:"approval,omitempty"`
}

// CELGate passes when Expression is true for one object (Name) or for every object matching
// Selector (none matching holds). The object is `self`, read through the manager's client, which
// needs read access to its kind (see docs/how-to/health-gates.md).
// +kubebuilder:validation:XValidation:rule="has(self.name) != has(self.selector)",message="set exactly one of name or selector"
type CELGate struct {
	// APIVersion of the object, "apps/v1" or "v1".
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	APIVersion string `json:"apiVersion"`
	// Kind of the object, "Deployment".
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Kind string `json:"kind"`
	// Namespace of a namespaced object; empty for cluster-scoped kinds.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
	// Name of the one object.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`
	// Selector picks every object of the kind (in Namespace) carrying these labels.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
	// Expression is a CEL expression over `self` that must be true, with the Kubernetes CEL
	// libraries, for example `self.status.availableReplicas == self.spec.replicas`. Admission
	// checks only its length: without a webhook the API server cannot compile user CEL, so the
	// manager compiles and type-checks it at its first look and fails the operation
	// (InvalidSpec, naming this field) before anything runs; `kubectl nodeops create` and `plan`
	// do the same on the client.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Expression string `json:"expression"`
}

// ClusterHealthGate passes when every control plane's API server, etcd and scheduler mirror pods
// are Ready, the API server answers /readyz, and the nodes the operation finished most recently
// are Ready with their pods Ready.
type ClusterHealthGate struct{}

// PrometheusGate passes when an instant query returns no series (a query for what is wrong,
// kured-style: `ALERTS{alertstate="firing"}`).
type PrometheusGate struct {
	// URL of the Prometheus server, "http://prometheus.monitoring:9090".
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && (self.startsWith('http://') || self.startsWith('https://'))",message="must be an http or https URL"
	URL string `json:"url"`
	// Query is PromQL; the gate passes when it returns no series.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Query string `json:"query"`
}

// AlertmanagerGate passes when no active (not silenced, not inhibited) alert matches all Matchers.
type AlertmanagerGate struct {
	// URL of the Alertmanager, "http://alertmanager.monitoring:9093" (API v2).
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && (self.startsWith('http://') || self.startsWith('https://'))",message="must be an http or https URL"
	URL string `json:"url"`
	// Matchers select alerts: "name=value", "name!=value", "name=~regex" or "name!~regex"; none matches every alert.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=256
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z_][a-zA-Z0-9_]*(=|!=|=~|!~).*$`
	Matchers []string `json:"matchers,omitempty"`
	// Silence, when set, has nodeops hold an Alertmanager silence over each node while its task
	// runs: created before the task is created (a node whose silence cannot be created does not
	// start, and the gate holds with the reason), extended while the task runs, expired once it
	// ends, never longer than MaxDuration. Its id is recorded in the operation's or profile's status
	// (status.silences), so a restarted manager extends or expires the same silence.
	// +optional
	Silence *AlertmanagerSilence `json:"silence,omitempty"`
}

// NodeNamePlaceholder in a silence's matchers and comment is replaced by the node's name.
const NodeNamePlaceholder = "{{node}}"

// AlertmanagerSilence is the silence nodeops holds over a node while it works on it.
type AlertmanagerSilence struct {
	// Matchers of the silence, as the gate's ("name=value", "name!=value", "name=~regex",
	// "name!~regex"), each with {{node}} replaced by the node's name: "instance={{node}}".
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=256
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z_][a-zA-Z0-9_]*(=|!=|=~|!~).*$`
	Matchers []string `json:"matchers"`
	// MaxDuration bounds how long one node's silence lasts, however long its task runs: past it
	// the silence is not extended and the node's alerts fire again.
	// +optional
	// +kubebuilder:default="4h0m0s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('168h')",message="must be from 1m to 168h"
	MaxDuration *metav1.Duration `json:"maxDuration,omitempty"`
	// Comment of the silence, with {{node}} replaced; nodeops adds the operation and group, or the profile.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Comment string `json:"comment,omitempty"`
}

// CommandGate is a script run on a node that must exit 0, for what only the host can tell (a
// storage rebuild finished, a RAID resync done). The manager runs it as a gate-check NodeTask (one
// script command, owned by the operation or profile, its spec.gateCheck naming the gate) and reads its
// result: exit 0 passes, anything else holds with the exit code and the tail of the output. In an
// operation's DryRun it is not run: it passes, saying where it would have run.
type CommandGate struct {
	// Script is run with /bin/sh on the node, as a script command is.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Script string `json:"script"`
	// Node runs the script; the node about to start when empty (then nodes start one per check:
	// each node is checked before it starts).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node,omitempty"`
}

// ApprovalGate passes once a person or another controller approves it with the annotation
// `approve.gate.nodeops.io/<name>` on the operation or profile (`kubectl nodeops approve OP --gate NAME`,
// `kubectl nodeops approve nodeprofile/PROFILE --gate NAME`).
type ApprovalGate struct{}

// LabelGateCheck is set on a NodeTask that checks a command gate, to the gate's name, for
// selection and display only: spec.gateCheck, which is immutable, is what makes a task a check (IsGateCheck).
const LabelGateCheck = "nodeops.io/gate-check"

// LabelGateAttempt numbers a gate's checks within its operation and group, or its profile, from 1.
const LabelGateAttempt = "nodeops.io/gate-attempt"

// AnnotationGateCheckFor names the node a gate check was run for: the node about to start, which
// the check ran on unless the gate names another.
const AnnotationGateCheckFor = "nodeops.io/gate-check-for"

// IsGateCheck reports whether t checks a command gate: its immutable spec.gateCheck is set, a
// NodeOperation or a NodeProfile is its controller, and it runs exactly one script command. Such a
// task makes no node unavailable once its agent recorded it failed (a failed check holds nothing,
// unlike a failed task) and counts in no operation's or profile's progress or budget. Only spec fields decide it, never labels:
// a person who may edit a task's labels (to retry or skip it) cannot turn work into a check.
func IsGateCheck(t *NodeTask) bool {
	if t.Spec.GateCheck == "" {
		return false
	}
	if len(t.Spec.Commands) != 1 || t.Spec.Commands[0].Script == nil {
		return false
	}
	for _, ref := range t.OwnerReferences {
		if ref.Controller != nil && *ref.Controller {
			return (ref.Kind == "NodeOperation" || ref.Kind == "NodeProfile") && ref.APIVersion == GroupVersion.String()
		}
	}
	return false
}

// Annotations on a NodeOperation or a NodeProfile by which a person acts on its gates.
const (
	// AnnotationApproveGatePrefix + gate name, any value: the approval gate passes.
	AnnotationApproveGatePrefix = "approve.gate.nodeops.io/"
	// AnnotationRetryGatePrefix + gate name, a new value each time: a gate that timed out is checked
	// again with a fresh timeout.
	AnnotationRetryGatePrefix = "retry.gate.nodeops.io/"
	// AnnotationSkipGatePrefix + gate name, any value: the gate passes for the rest of the
	// operation; on a profile, until the annotation is removed.
	AnnotationSkipGatePrefix = "skip.gate.nodeops.io/"
)

// GateState is a gate's last result.
// +kubebuilder:validation:Enum=Passed;Waiting;TimedOut;Skipped
type GateState string

const (
	GatePassed   GateState = "Passed"
	GateWaiting  GateState = "Waiting"
	GateTimedOut GateState = "TimedOut"
	GateSkipped  GateState = "Skipped"
)

// GateStatus is a gate's last result for a group of a NodeOperation, or for a NodeProfile.
type GateStatus struct {
	// Group the gate was checked for; empty on a NodeProfile, whose gates are checked before
	// each node's install or uninstall.
	// +optional
	Group string `json:"group,omitempty"`
	// Name of the gate.
	Name  string    `json:"name"`
	State GateState `json:"state"`
	// Message is the gate's own word: what it saw, or why it could not look.
	// +optional
	Message string `json:"message,omitempty"`
	// Since is when the gate entered State.
	Since metav1.Time `json:"since"`
	// LastChecked is when the gate was last evaluated, as of the last status write: checks that
	// change nothing are not written on their own.
	LastChecked metav1.Time `json:"lastChecked"`
	// Retried is the value of the retry annotation last acted on.
	// +optional
	Retried string `json:"retried,omitempty"`
}
