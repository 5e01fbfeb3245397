package v1alpha1

import (
	"fmt"
	"strings"
	"time"

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
// +kubebuilder:validation:XValidation:rule="has(self.operation) == has(oldSelf.operation) && (!has(self.operation) || self.operation == oldSelf.operation)",message="operation is immutable",fieldPath=".operation"
// +kubebuilder:validation:XValidation:rule="has(self.group) == has(oldSelf.group) && (!has(self.group) || self.group == oldSelf.group)",message="group is immutable",fieldPath=".group"
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
	Commands CommandList `json:"commands"`
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
// (a lost agent fails its task in bounded time, rule 9), as Kubernetes' node lifecycle controller marks the pods of a
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

// ConditionDrained is the manager's outcome of a drain that a command's agent asked for (its
// status.commands[i].drain; drain honours PodDisruptionBudgets and agents confined to their own node, rules 6 and 10): the manager evicts, since no
// agent may, and the agent ends the command with this outcome. True with reason Drained, False with
// reason DrainFailed. Its message begins with the key of the run it answers (DrainKey), so a retried
// or rerun command never takes an earlier run's outcome; then the outcome, and on the lines after it
// what the drain did with each pod.
const ConditionDrained = "Drained"

// Reasons of the Drained condition.
const (
	ReasonDrained     = "Drained"
	ReasonDrainFailed = "DrainFailed"
)

// DrainRequest is the agent's request, on a running command that drains (Command.Drains), that the
// manager drain the node now.
type DrainRequest struct {
	// AgentPod is the requesting agent's own pod, as namespace/name, which the drain spares; empty
	// when the agent runs outside a pod.
	// +optional
	// +kubebuilder:validation:MaxLength=317
	AgentPod string `json:"agentPod,omitempty"`
}

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
	// Drain is set by the agent while this run of the command waits for the manager to drain the
	// node (ConditionDrained).
	// +optional
	Drain *DrainRequest `json:"drain,omitempty"`
	// Waits is the time this run of the command spent waiting for something outside its own work
	// (a mirror pod to go or come back, the control plane to answer, the manager's drain), by what it
	// waited for; the rest of startTime to completionTime is the time the work ran.
	// +optional
	// +listType=map
	// +listMapKey=for
	// +kubebuilder:validation:MaxItems=16
	Waits []CommandWait `json:"waits,omitempty"`
}

// WaitFor names what a command waited for.
// +kubebuilder:validation:Enum=MirrorPodGone;MirrorPodBack;NodeReady;ControlPlaneHealthy;Drain;SecretMount;Wait
type WaitFor string

// What a command may wait for.
const (
	// WaitMirrorPodGone: a static pod whose manifest was moved out, until the kubelet stopped it.
	WaitMirrorPodGone WaitFor = "MirrorPodGone"
	// WaitMirrorPodBack: a static pod whose manifest was put back, until it is Ready again.
	WaitMirrorPodBack WaitFor = "MirrorPodBack"
	// WaitNodeReady: the node, until it is Ready.
	WaitNodeReady WaitFor = "NodeReady"
	// WaitControlPlaneHealthy: the node's control plane, until every component is Ready at its
	// version and the API server answers /readyz and an authorized read.
	WaitControlPlaneHealthy WaitFor = "ControlPlaneHealthy"
	// WaitDrain: the manager, until it drained the node.
	WaitDrain WaitFor = "Drain"
	// WaitSecretMount: the kubelet, until it mounted a script's Secrets.
	WaitSecretMount WaitFor = "SecretMount"
	// WaitWait: the wait command itself.
	WaitWait WaitFor = "Wait"
)

// CommandWait is the time a run of a command spent waiting for one thing.
type CommandWait struct {
	For WaitFor `json:"for"`
	// Duration is the time waited, summed over the run.
	Duration metav1.Duration `json:"duration"`
}

// Waited is the command run's total wait.
func (c *CommandStatus) Waited() time.Duration {
	var d time.Duration
	for _, w := range c.Waits {
		d += w.Duration.Duration
	}
	return d
}

// CertificateExpiry is one certificate's expiry as kubeadm reports it.
type CertificateExpiry struct {
	Name     string      `json:"name"`
	NotAfter metav1.Time `json:"notAfter"`
}

// NodeTaskStatus has one writer per field; a person's retry, skip or abort goes in the spec.
//
//   - The node's agent: every field but conditions (phase, currentCommand, progress, reason,
//     message, commands with their drain requests, attempt, agentHeartbeat, observedGeneration,
//     recoveredGeneration, certificates, startTime, completionTime), in merge patches that never
//     hold conditions.
//   - The manager: conditions (AgentLost, a lost agent fails its task in bounded time, rule 9;
//     Drained, the answer to a drain request, rule 6), in merge patches of conditions alone.
//
// The API enforces the split for the agent: the admission policy nodeops-agent-confinement refuses
// an agent's write that changes conditions (config/admission/agent-confinement.yaml).
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
	// ObservedGeneration is the generation of the spec the agent's last write was decided on; of a
	// task not yet started, also of one it decided to leave alone (paused).
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// RecoveredGeneration is the generation whose recoveryMode the agent last acted on.
	// +optional
	RecoveredGeneration int64 `json:"recoveredGeneration,omitempty"`
	// Certificates reports certificate expiry after a renewal.
	// +optional
	Certificates []CertificateExpiry `json:"certificates,omitempty"`
	// CertificateAuthorityServer is where this task's agent serves the certificate authorities its
	// generateCertificateAuthorities made, to the agents of the operation's other control planes
	// (copyCertificateAuthorities). It holds no key: only an address and the fingerprint of the
	// server's certificate, by which the receiving agent knows it speaks to this agent (rule 15).
	// +optional
	CertificateAuthorityServer *CertificateAuthorityServer `json:"certificateAuthorityServer,omitempty"`
	// +optional
	StartTime *metav1.MicroTime `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.MicroTime `json:"completionTime,omitempty"`
	// Conditions are written by the manager alone (an agent's write that changes them is refused):
	// AgentLost (a lost agent fails its task in bounded time, rule 9), Drained (drain honours PodDisruptionBudgets and agents confined to their own node, rules 6 and 10).
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
// manager marked AgentLost that its agent had not finished is Failed (a lost agent fails its task in bounded time, rule 9), or
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

// DrainKey names one run of a command in the Drained condition's message.
func DrainKey(command string, attempt int32) string {
	return fmt.Sprintf("command %s, attempt %d", command, attempt)
}

// DrainOutcome is the manager's answer to one drain request.
type DrainOutcome struct {
	Succeeded bool
	// Message is the drain's result or error, naming the pods refused or held up and the budgets.
	Message string
	// Log is a line for each pod left, evicted or held up.
	Log string
}

// Bounds on the parts of the Drained condition's message (a condition message holds 32768 bytes).
const (
	maxDrainMessage = 8 << 10
	maxDrainLog     = 16 << 10
)

// DrainedCondition is the Drained condition answering the run key of a command with o.
func DrainedCondition(key string, o DrainOutcome, generation int64) metav1.Condition {
	c := metav1.Condition{Type: ConditionDrained, Status: metav1.ConditionTrue, Reason: ReasonDrained, ObservedGeneration: generation}
	if !o.Succeeded {
		c.Status, c.Reason = metav1.ConditionFalse, ReasonDrainFailed
	}
	msg := strings.ReplaceAll(o.Message, "\n", " ")
	if len(msg) > maxDrainMessage {
		msg = msg[:maxDrainMessage] + "..."
	}
	log := strings.TrimRight(o.Log, "\n")
	if len(log) > maxDrainLog {
		log = "...\n" + log[len(log)-maxDrainLog:]
	}
	c.Message = key + ": " + msg
	if log != "" {
		c.Message += "\n" + log
	}
	return c
}

// DrainAnswer is the manager's outcome for the current run of command i, if the Drained
// condition answers that run: an outcome recorded for an earlier attempt is no answer.
func (t *NodeTask) DrainAnswer(i int) (DrainOutcome, bool) {
	if i < 0 || i >= len(t.Status.Commands) {
		return DrainOutcome{}, false
	}
	return t.DrainAnswerFor(DrainKey(t.Status.Commands[i].Name, t.Status.Commands[i].Attempt))
}

// DrainAnswerFor is the manager's outcome for the run named key (DrainKey), if the Drained
// condition answers that run.
func (t *NodeTask) DrainAnswerFor(key string) (DrainOutcome, bool) {
	c := meta.FindStatusCondition(t.Status.Conditions, ConditionDrained)
	if c == nil {
		return DrainOutcome{}, false
	}
	first, log, _ := strings.Cut(c.Message, "\n")
	msg, ok := strings.CutPrefix(first, key+": ")
	if !ok {
		return DrainOutcome{}, false
	}
	return DrainOutcome{Succeeded: c.Status == metav1.ConditionTrue, Message: msg, Log: log}, true
}

// DrainPending is the command whose run waits for the manager's drain: the task's current command,
// running, carrying its agent's request, draining by its spec (so an agent cannot ask a drain its
// task does not have), and not yet answered. ok is false when there is none, or the task is lost.
func (t *NodeTask) DrainPending() (i int, d *DrainCommand, ok bool) {
	i = int(t.Status.CurrentCommand)
	if t.Status.Phase != TaskRunning || i < 0 || i >= len(t.Spec.Commands) || i >= len(t.Status.Commands) || t.Lost() != nil {
		return 0, nil, false
	}
	cs := t.Status.Commands[i]
	if cs.Phase != CommandRunning || cs.Drain == nil {
		return 0, nil, false
	}
	if d = t.Spec.Commands[i].Drains(); d == nil {
		return 0, nil, false
	}
	if _, answered := t.DrainAnswer(i); answered {
		return 0, nil, false
	}
	return i, d, true
}

// CertificateAuthorityServer is an agent's TLS server for a rotation's new certificate authorities.
type CertificateAuthorityServer struct {
	// Address is host:port, on the node's network.
	// +kubebuilder:validation:MaxLength=261
	Address string `json:"address"`
	// CertificateSHA256 is the SHA-256 of the server certificate's DER, lowercase hex: the one
	// certificate the receiving agent accepts.
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	CertificateSHA256 string `json:"certificateSHA256"`
}
