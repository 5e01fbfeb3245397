package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/meta"
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
// +kubebuilder:validation:XValidation:rule="!has(self.approvedCommands) || self.approvedCommands <= self.commands.size()",message="approvedCommands is at most the number of commands",fieldPath=".approvedCommands"
type NodeTaskSpec struct {
	// NodeName is the node the task runs on.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	NodeName string `json:"nodeName"`
	// Operation or profile that owns the task, passed to scripts as NODEOPS_OPERATION.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Operation string `json:"operation,omitempty"`
	// Group the task belongs to.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Group string `json:"group,omitempty"`
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// Names are what status and the CLI show beside each index; nameless commands of one kind may repeat.
	// +kubebuilder:validation:XValidation:rule="self.all(c, !has(c.name) || self.filter(d, (has(d.name) ? d.name : has(d.kubeadmUpgradeApply) ? 'kubeadmUpgradeApply' : has(d.kubeadmUpgradeNode) ? 'kubeadmUpgradeNode' : has(d.kubeadmUpgradePlan) ? 'kubeadmUpgradePlan' : has(d.kubeadmRenewCertificates) ? 'kubeadmRenewCertificates' : has(d.restartStaticPods) ? 'restartStaticPods' : has(d.installBinaries) ? 'installBinaries' : has(d.restartService) ? 'restartService' : has(d.cordon) ? 'cordon' : has(d.drain) ? 'drain' : has(d.uncordon) ? 'uncordon' : has(d.waitNodeReady) ? 'waitNodeReady' : has(d.preflight) ? 'preflight' : has(d.installFile) ? 'installFile' : has(d.containerdRuntime) ? 'containerdRuntime' : has(d.script) ? 'script' : has(d.wait) ? 'wait' : has(d.pod) ? 'pod' : '') == c.name).size() == 1)",message="command names must be unique, and differ from the kind of each command without a name (which status shows by its kind)"
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
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed;Aborted
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
// +kubebuilder:validation:Enum=Pending;AwaitingApproval;Running;Succeeded;Failed;Skipped
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

// ConditionAgentLost is the manager's own mark on a task whose agent stopped renewing its hold
// (docs/design.md, safety rule 9), as Kubernetes' node lifecycle controller marks the pods of a
// lost node. Only the manager writes status.conditions; the agent carries them over in every
// status write. True with reason AgentLost (no heartbeat for --agent-lost-after), NodeDeleted
// (the task's node is gone), or Skipped (a person skipped the task of a deleted node, which no
// agent can act on).
const ConditionAgentLost = "AgentLost"

// Reasons of the AgentLost condition.
const (
	ReasonAgentLost   = "AgentLost"
	ReasonNodeDeleted = "NodeDeleted"
	ReasonLostSkipped = "Skipped"
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

// NodeTaskStatus is written by the node's agent, except conditions, which the manager alone writes
// (AgentLost, safety rule 9); a person's retry, skip or abort goes in the spec.
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
	// Conditions are written by the manager alone (the agent keeps them in its writes):
	// AgentLost (safety rule 9).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
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

// EffectivePhase is the task's phase, Pending before anything was reported. A task the
// manager marked AgentLost that its agent had not finished is Failed (safety rule 9), or
// Succeeded once a person skipped it on a deleted node (reason Skipped).
func (t *NodeTask) EffectivePhase() TaskPhase {
	p := t.Status.Phase
	if p == "" {
		p = TaskPending
	}
	if p == TaskSucceeded || p == TaskAborted {
		return p
	}
	if c := t.Lost(); c != nil {
		if c.Reason == ReasonLostSkipped {
			return TaskSucceeded
		}
		return TaskFailed
	}
	return p
}

// Lost is the task's AgentLost condition when it is True, else nil.
func (t *NodeTask) Lost() *metav1.Condition {
	c := meta.FindStatusCondition(t.Status.Conditions, ConditionAgentLost)
	if c == nil || c.Status != metav1.ConditionTrue {
		return nil
	}
	return c
}

// NodeTaskList lists NodeTasks.
// +kubebuilder:object:root=true
type NodeTaskList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeTask `json:"items"`
}
