package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Hooks run at four points of an operation. A hook is a step: the step after it waits for its
// success, and a hook that fails, cannot be run or does not answer within its timeout blocks the
// node or the operation with its reason (Blocked, reason HookFailed) until a person retries or
// skips it (`kubectl nodeops retry|skip OP --hook NAME`); no hook ever passes by default (rule 14).
// Hooks at one point run one after another, in the order listed.
type Hooks struct {
	// PreOperation hooks run before the operation's first task.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +listType=map
	// +listMapKey=name
	PreOperation []Hook `json:"preOperation,omitempty"`
	// PreNode hooks run for each node before its task in the group is created.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +listType=map
	// +listMapKey=name
	PreNode []Hook `json:"preNode,omitempty"`
	// PostNode hooks run for each node after its task succeeded; until they have, the node counts
	// against maxUnavailable and its group has not succeeded. HTTP hooks here also get
	// io.nodeops.node.failed when the node's task fails (that delivery gates nothing: the
	// operation is already Blocked).
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +listType=map
	// +listMapKey=name
	PostNode []Hook `json:"postNode,omitempty"`
	// PostOperation hooks run after the last group succeeded; the operation is Succeeded only
	// once they have.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +listType=map
	// +listMapKey=name
	PostOperation []Hook `json:"postOperation,omitempty"`
}

// Empty reports whether no hook is set.
func (h *Hooks) Empty() bool {
	return h == nil || len(h.PreOperation)+len(h.PreNode)+len(h.PostNode)+len(h.PostOperation) == 0
}

// Hook is a Job made from a template, or a CloudEvent POSTed to a URL.
// +kubebuilder:validation:XValidation:rule="[has(self.job), has(self.http)].filter(x, x).size() == 1",message="exactly one of job or http must be set"
type Hook struct {
	// Name identifies the hook in status, events and `kubectl nodeops retry|skip --hook`.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Timeout is how long the hook may take (a Job to complete, an event to get a 2xx) before
	// the node or operation goes Blocked.
	// +optional
	// +kubebuilder:default="10m0s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="must be from 1s to 24h"
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// +optional
	Job *JobHook `json:"job,omitempty"`
	// +optional
	HTTP *HTTPHook `json:"http,omitempty"`
}

// JobHook is a batch/v1 Job the manager creates in the namespace nodeops-hooks from
// Template, named for the operation, point, node and hook, owned by the operation and labelled
// nodeops.io/operation, nodeops.io/hook and (for node hooks) nodeops.io/node. The hook succeeds
// when the Job completes and fails when it fails. The Job's pods get NODEOPS_OPERATION,
// NODEOPS_HOOK_POINT, NODEOPS_GROUP and NODEOPS_NODE in their environment.
type JobHook struct {
	// Template is a batch/v1 JobTemplateSpec: `metadata` (labels, annotations) and `spec`.
	// Its schema is left to the Job API (embedding the whole pod schema at every hook point
	// would make the CRD too large to store): the manager decodes it strictly at its first look
	// and fails the operation (InvalidSpec, naming this field) before anything runs when it is
	// not a JobTemplateSpec; the API server validates the Job when it is created.
	// +kubebuilder:validation:Type=object
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:pruning:PreserveUnknownFields
	Template runtime.RawExtension `json:"template"`
}

// HTTPHook POSTs the point's CloudEvent (CloudEvents 1.0, structured JSON mode) to URL, signed
// with HMAC-SHA256 over the body in the header X-Nodeops-Signature ("sha256=" and the hex
// digest), and retries with exponential back-off until a 2xx or its timeout. Each event keeps
// its id on every retry and is recorded delivered only after a 2xx.
type HTTPHook struct {
	// URL receives the events: https, or http to a loopback address (127.0.0.1, ::1, localhost).
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && (self.startsWith('https://') || (self.startsWith('http://') && url(self).getHostname() in ['127.0.0.1', 'localhost', '::1']))",message="must be an https URL, or http to a loopback address (127.0.0.1, ::1, localhost)"
	URL string `json:"url"`
	// SigningKey names the key of the Secret nodeops-hooks/nodeops-hook-signing whose value signs
	// each body: the one Secret the manager may read.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	SigningKey string `json:"signingKey"`
}

// HookSigningSecret is the Secret, in HookNamespace, that holds the http hooks' signing keys.
const HookSigningSecret = "nodeops-hook-signing"

// HookNamespace is where hook Jobs run and the signing Secret lives: a namespace of their own,
// so that a hook's pods never run beside nodeops' own service accounts.
const HookNamespace = "nodeops-hooks"

// Annotations on a NodeOperation by which a person acts on a failed hook.
const (
	// AnnotationRetryHookPrefix + hook name, a new value each time: the failed hook runs again
	// (a new Job; the same event, same id, for an http hook).
	AnnotationRetryHookPrefix = "retry.hook.nodeops.io/"
	// AnnotationSkipHookPrefix + hook name, a new value each time: the failed hook counts as done.
	AnnotationSkipHookPrefix = "skip.hook.nodeops.io/"
	// LabelHook is the hook's name on the Jobs it makes.
	LabelHook = "nodeops.io/hook"
)

// HookPoint is where in an operation a hook runs.
// +kubebuilder:validation:Enum=PreOperation;PreNode;PostNode;PostOperation
type HookPoint string

const (
	HookPreOperation  HookPoint = "PreOperation"
	HookPreNode       HookPoint = "PreNode"
	HookPostNode      HookPoint = "PostNode"
	HookPostOperation HookPoint = "PostOperation"
)

// HookState is how far the hooks at one point have got.
// +kubebuilder:validation:Enum=Running;Succeeded;Failed
type HookState string

const (
	HookRunning   HookState = "Running"
	HookSucceeded HookState = "Succeeded"
	HookFailed    HookState = "Failed"
)

// HookRun is the progress of the hooks at one point for one node of a group, or for the
// operation. A node's PreNode record goes once its task exists and its PostNode record once
// its group succeeded: the task and the group's phase say it from then on.
type HookRun struct {
	Point HookPoint `json:"point"`
	// +optional
	Group string `json:"group,omitempty"`
	// +optional
	Node string `json:"node,omitempty"`
	// Outcome is what a post hook reports: Succeeded, or Failed (http hooks only, for a failed task).
	// +optional
	Outcome string `json:"outcome,omitempty"`
	// Hook is the hook running or failed, or the last one done.
	Hook string `json:"hook"`
	// Index of Hook in its point's list.
	Index int32     `json:"index"`
	State HookState `json:"state"`
	// Attempt counts the runs of Hook: a retry makes a new Job.
	// +optional
	Attempt int32 `json:"attempt,omitempty"`
	// Message is the hook's result or why it failed (the Job's reason, the receiver's answer).
	// +optional
	Message string `json:"message,omitempty"`
	// Since is when Hook started (its timeout counts from here) and the time of its CloudEvent.
	Since metav1.Time `json:"since"`
	// Acted is the retry or skip annotation value last acted on.
	// +optional
	Acted string `json:"acted,omitempty"`
}

// Over is h with each point it leaves empty taken from def.
func (h *Hooks) Over(def *Hooks) *Hooks {
	if h == nil {
		return def
	}
	if def == nil {
		return h
	}
	out := *h
	if len(out.PreOperation) == 0 {
		out.PreOperation = def.PreOperation
	}
	if len(out.PreNode) == 0 {
		out.PreNode = def.PreNode
	}
	if len(out.PostNode) == 0 {
		out.PostNode = def.PostNode
	}
	if len(out.PostOperation) == 0 {
		out.PostOperation = def.PostOperation
	}
	return &out
}

// At is the hooks at point.
func (h *Hooks) At(point HookPoint) []Hook {
	if h == nil {
		return nil
	}
	switch point {
	case HookPreOperation:
		return h.PreOperation
	case HookPreNode:
		return h.PreNode
	case HookPostNode:
		return h.PostNode
	case HookPostOperation:
		return h.PostOperation
	}
	return nil
}
