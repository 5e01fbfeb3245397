package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RecoveryMode is a person's choice for a failed task.
// +kubebuilder:validation:Enum="";Retry;Skip
type RecoveryMode string

const (
	RecoveryNone  RecoveryMode = ""
	RecoveryRetry RecoveryMode = "Retry"
	RecoverySkip  RecoveryMode = "Skip"
)

// NodeTaskSpec is one node's part of one group. Only recoveryMode, approvedCommands,
// paused and abort change after creation.
// +kubebuilder:validation:XValidation:rule="self.nodeName == oldSelf.nodeName",message="nodeName is immutable",fieldPath=".nodeName"
// +kubebuilder:validation:XValidation:rule="self.commands == oldSelf.commands",message="commands are immutable",fieldPath=".commands"
// +kubebuilder:validation:XValidation:rule="self.executionMode == oldSelf.executionMode || (oldSelf.executionMode == 'Controlled' && self.executionMode == 'Auto')",message="executionMode may only change from Controlled to Auto",fieldPath=".executionMode"
// +kubebuilder:validation:XValidation:rule="self.approvedCommands >= oldSelf.approvedCommands",message="approvedCommands cannot decrease",fieldPath=".approvedCommands"
type NodeTaskSpec struct {
	// NodeName is the node the task runs on.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName"`
	// Operation or profile that owns the task, passed to scripts as NODEOPS_OPERATION.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Operation string `json:"operation,omitempty"`
	// Group the task belongs to.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Group string `json:"group,omitempty"`
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	Commands []Command `json:"commands"`
	// +optional
	// +kubebuilder:default=Auto
	ExecutionMode ExecutionMode `json:"executionMode,omitempty"`
	// ApprovedCommands is how many commands, from the first, may start in Controlled mode.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ApprovedCommands int32 `json:"approvedCommands"`
	// RecoveryMode, set by a person on a failed task: Retry runs the failed command again, Skip goes on after it.
	// Cleared once acted on.
	// +optional
	RecoveryMode RecoveryMode `json:"recoveryMode,omitempty"`
	// Paused: no new command starts.
	// +optional
	Paused bool `json:"paused,omitempty"`
	// Abort: no new command starts, and the task ends Aborted.
	// +optional
	Abort bool `json:"abort,omitempty"`
}

// TaskPhase is a task's state.
type TaskPhase string

const (
	TaskPending   TaskPhase = "Pending"
	TaskRunning   TaskPhase = "Running"
	TaskSucceeded TaskPhase = "Succeeded"
	TaskFailed    TaskPhase = "Failed"
	TaskAborted   TaskPhase = "Aborted"
)

// Unfinished reports whether a task in this phase still holds its node: pending, running, or failed and not yet recovered.
func (p TaskPhase) Unfinished() bool {
	return p != TaskSucceeded && p != TaskAborted
}

// CommandPhase is a command's state.
type CommandPhase string

const (
	CommandPending          CommandPhase = "Pending"
	CommandAwaitingApproval CommandPhase = "AwaitingApproval"
	CommandRunning          CommandPhase = "Running"
	CommandSucceeded        CommandPhase = "Succeeded"
	CommandFailed           CommandPhase = "Failed"
	CommandSkipped          CommandPhase = "Skipped"
)

// Done reports whether the command has finished, one way or another.
func (p CommandPhase) Done() bool {
	return p == CommandSucceeded || p == CommandSkipped
}

// Task failure reasons.
const (
	// ReasonInterrupted: a non-idempotent command was interrupted and cannot safely run again.
	ReasonInterrupted = "Interrupted"
	// ReasonCommandFailed: a command exited with an error.
	ReasonCommandFailed = "CommandFailed"
)

// CommandStatus is what happened to one command.
type CommandStatus struct {
	Name  string       `json:"name"`
	Phase CommandPhase `json:"phase"`
	// Attempt counts runs of this command, from 1.
	// +optional
	Attempt int32 `json:"attempt,omitempty"`
	// +optional
	StartTime *metav1.MicroTime `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.MicroTime `json:"completionTime,omitempty"`
	// +optional
	ExitCode *int32 `json:"exitCode,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// OutputTail is the last 4 KiB of the command's output.
	// +optional
	OutputTail string `json:"outputTail,omitempty"`
}

// CertificateExpiry is one certificate's expiry as kubeadm reports it.
type CertificateExpiry struct {
	Name     string      `json:"name"`
	NotAfter metav1.Time `json:"notAfter"`
}

// NodeTaskStatus is written by the node's agent alone; a person's retry, skip or abort goes in the spec.
type NodeTaskStatus struct {
	// +optional
	Phase TaskPhase `json:"phase,omitempty"`
	// CurrentCommand is the index of the command running or next to run.
	// +optional
	CurrentCommand int32 `json:"currentCommand"`
	// Progress is "done/total" commands.
	// +optional
	Progress string `json:"progress,omitempty"`
	// Reason and Message explain a failure.
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	Commands []CommandStatus `json:"commands,omitempty"`
	// Attempt counts recoveries of the task, from 1.
	// +optional
	Attempt int32 `json:"attempt,omitempty"`
	// AgentHeartbeat is renewed by the agent while a command runs.
	// +optional
	AgentHeartbeat *metav1.MicroTime `json:"agentHeartbeat,omitempty"`
	// RecoveredGeneration is the generation whose recoveryMode the agent last acted on.
	// +optional
	RecoveredGeneration int64 `json:"recoveredGeneration,omitempty"`
	// Certificates reports certificate expiry after a renewal.
	// +optional
	Certificates []CertificateExpiry `json:"certificates,omitempty"`
	// +optional
	StartTime *metav1.MicroTime `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.MicroTime `json:"completionTime,omitempty"`
}

// NodeTask is one node's part of one group of a NodeOperation (or a NodeProfile's install or uninstall).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=ntask;ntasks,categories=nodeops
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Operation",type=string,JSONPath=`.spec.operation`
// +kubebuilder:printcolumn:name="Group",type=string,JSONPath=`.spec.group`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Progress",type=string,JSONPath=`.status.progress`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeTask struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeTaskSpec   `json:"spec"`
	Status NodeTaskStatus `json:"status,omitempty"`
}

// EffectivePhase is the task's phase, Pending before anything was reported.
func (t *NodeTask) EffectivePhase() TaskPhase {
	if t.Status.Phase == "" {
		return TaskPending
	}
	return t.Status.Phase
}

// NodeTaskList lists NodeTasks.
// +kubebuilder:object:root=true
type NodeTaskList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeTask `json:"items"`
}
