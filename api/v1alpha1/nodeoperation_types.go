package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ExecutionMode says how commands are allowed to run.
// +kubebuilder:validation:Enum=Auto;Controlled;DryRun
type ExecutionMode string

const (
	// ExecutionAuto runs every command as soon as its turn comes.
	ExecutionAuto ExecutionMode = "Auto"
	// ExecutionControlled runs a command only once it is approved.
	ExecutionControlled ExecutionMode = "Controlled"
	// ExecutionDryRun runs the whole plan with every side effect replaced by its dry-run form.
	ExecutionDryRun ExecutionMode = "DryRun"
)

// NodeFilter narrows a group's nodes, sorted by name.
// +kubebuilder:validation:Enum=All;Head;Tail
type NodeFilter string

const (
	NodeFilterAll  NodeFilter = "All"
	NodeFilterHead NodeFilter = "Head"
	NodeFilterTail NodeFilter = "Tail"
)

// PackageSourceBinaries is upgrade.packageSource's default: the binaries in /usr/bin are swapped.
const PackageSourceBinaries = "binaries"

// UpgradeOperation upgrades a kubeadm cluster, one minor version at a time.
// +kubebuilder:validation:XValidation:rule="!has(self.ignorePreflightErrors) || !self.ignorePreflightErrors.exists(e, e.lowerAscii() == 'all') || (has(self.allowIgnoreAllPreflightErrors) && self.allowIgnoreAllPreflightErrors && self.ignorePreflightErrors.size() == 1)",message="ignorePreflightErrors may hold all only alone and with allowIgnoreAllPreflightErrors: true",fieldPath=".ignorePreflightErrors"
// +kubebuilder:validation:XValidation:rule="(has(self.upgradeKubeletAndKubectl) && !self.upgradeKubeletAndKubectl) || (has(self.packageSource) && self.packageSource != 'binaries') || has(self.binarySource)",message="binarySource is required when upgradeKubeletAndKubectl is true and packageSource is binaries",fieldPath=".binarySource"
// +kubebuilder:validation:XValidation:rule="!has(self.binarySource) || !has(self.packageSource) || self.packageSource == 'binaries'",message="binarySource serves packageSource binaries only: the package manager installs from packageRepository or the node's own sources",fieldPath=".binarySource"
// +kubebuilder:validation:XValidation:rule="!has(self.packageRepository) || (has(self.packageSource) && self.packageSource != 'binaries')",message="packageRepository needs packageSource apt, dnf, yum, zypper or auto",fieldPath=".packageRepository"
type UpgradeOperation struct {
	// KubernetesVersion to upgrade to.
	// +kubebuilder:validation:Pattern=`^v[0-9]+\.[0-9]+\.[0-9]+$`
	// +kubebuilder:validation:MaxLength=32
	KubernetesVersion string `json:"kubernetesVersion"`
	// UpgradeKubeletAndKubectl replaces the kubelet and kubectl binaries and restarts the kubelet.
	// +optional
	// +kubebuilder:default=true
	UpgradeKubeletAndKubectl *bool `json:"upgradeKubeletAndKubectl,omitempty"`
	// BinarySource serves the new binaries: kubeadm, installed on each node before kubeadm upgrades it,
	// then kubelet and kubectl. Required when upgradeKubeletAndKubectl is true; without it the nodes'
	// kubeadm must already be the new version.
	// +optional
	BinarySource *BinarySource `json:"binarySource,omitempty"`
	// PackageSource is how kubeadm, kubelet and kubectl reach the nodes: binaries swaps the binaries
	// in /usr/bin (from binarySource); apt, dnf, yum, zypper or auto (by each node's OS family)
	// installs their packages at kubernetesVersion with that package manager and holds them there.
	// +optional
	// +kubebuilder:default=binaries
	// +kubebuilder:validation:Enum=binaries;apt;dnf;yum;zypper;auto
	PackageSource string `json:"packageSource,omitempty"`
	// PackageRepository is added on each node before its packages are installed; without it the
	// node's own sources must hold the packages.
	// +optional
	PackageRepository *PackageRepository `json:"packageRepository,omitempty"`
	// IgnorePreflightErrors is passed to kubeadm.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`(?i)^(all|CRI|ContainerRuntimeVersion|ControlPlaneNodesReady|CoreDNSMigration|CoreDNSUnsupportedPlugins|CreateJob|ExternalEtcdClientCertificates|ExternalEtcdVersion|Firewalld|HTTPProxy|HTTPProxyCIDR|Hostname|ImagePull|IsPrivilegedUser|KubeletVersion|KubernetesVersion|Mem|NumCPU|StaticPodManifest|Swap|SystemVerification|Port-[0-9]{1,5}|Service-[A-Za-z0-9@._-]+|(DirAvailable|FileAvailable|FileExisting|FileContent)-[A-Za-z0-9@._-]+)$`
	// +listType=set
	IgnorePreflightErrors []string `json:"ignorePreflightErrors,omitempty"`
	// AllowIgnoreAllPreflightErrors must be true for ignorePreflightErrors to hold "all".
	// +optional
	AllowIgnoreAllPreflightErrors bool `json:"allowIgnoreAllPreflightErrors,omitempty"`
	// Drain settings for workers.
	// +optional
	Drain *DrainCommand `json:"drain,omitempty"`
}

// RenewCertificatesOperation renews kubeadm certificates on control-plane nodes, one at a time.
type RenewCertificatesOperation struct {
	// Certificates to renew; all when empty.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Enum=all;admin.conf;apiserver;apiserver-etcd-client;apiserver-kubelet-client;controller-manager.conf;etcd-healthcheck-client;etcd-peer;etcd-server;front-proxy-client;scheduler.conf;super-admin.conf
	// +kubebuilder:validation:XValidation:rule="!self.exists(c, c == 'all') || self.size() == 1",message="all already names every certificate: list it alone"
	// +listType=set
	Certificates []string `json:"certificates,omitempty"`
}

// CustomOperation is an ordered list of groups.
type CustomOperation struct {
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	Groups []Group `json:"groups"`
}

// Group is a set of nodes that run the same commands; groups run strictly in order.
// +kubebuilder:validation:XValidation:rule="!has(self.hooks) || (!has(self.hooks.preOperation) && !has(self.hooks.postOperation))",message="preOperation and postOperation hooks belong on the operation, not on a group",fieldPath=".hooks"
type Group struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// NodeSelector narrows the operation's nodes for this group.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn'] ? (has(e.values) && size(e.values) > 0) : (e.operator in ['Exists', 'DoesNotExist'] && (!has(e.values) || size(e.values) == 0)))",message="matchExpressions: the operator must be In, NotIn, Exists or DoesNotExist; In and NotIn need values, Exists and DoesNotExist take none"
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// NodeFilter keeps all nodes, or only the first (Head) or all but the first (Tail), sorted by name.
	// +optional
	// +kubebuilder:default=All
	NodeFilter NodeFilter `json:"nodeFilter,omitempty"`
	// MaxUnavailable overrides the operation's for this group.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=4
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^([1-9][0-9]?|100)%$')",message="must be an integer >= 1 or a percentage from 1% to 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// Scheduling overrides the operation's windows and delays for this group, field by field.
	Scheduling `json:",inline"`
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// Names are what status and the CLI show beside each index; nameless commands of one kind may repeat.
	Commands CommandList `json:"commands"`
}

// NodeOperationSpec is one run of a workflow across nodes.
// +kubebuilder:validation:XValidation:rule="[has(self.upgrade), has(self.renewCertificates), has(self.reconfigure), has(self.rotateCertificateAuthorities), has(self.custom)].filter(x, x).size() == 1",message="exactly one of upgrade, renewCertificates, reconfigure, rotateCertificateAuthorities or custom must be set"
// +kubebuilder:validation:XValidation:rule="has(self.renewCertificates) == has(oldSelf.renewCertificates) && (!has(self.renewCertificates) || self.renewCertificates == oldSelf.renewCertificates)",message="renewCertificates is immutable",fieldPath=".renewCertificates"
// +kubebuilder:validation:XValidation:rule="has(self.rotateCertificateAuthorities) == has(oldSelf.rotateCertificateAuthorities) && (!has(self.rotateCertificateAuthorities) || self.rotateCertificateAuthorities == oldSelf.rotateCertificateAuthorities)",message="rotateCertificateAuthorities is immutable",fieldPath=".rotateCertificateAuthorities"
// +kubebuilder:validation:XValidation:rule="has(self.nodeSelector) == has(oldSelf.nodeSelector) && (!has(self.nodeSelector) || self.nodeSelector == oldSelf.nodeSelector)",message="nodeSelector is immutable",fieldPath=".nodeSelector"
// +kubebuilder:validation:XValidation:rule="has(self.maxUnavailable) == has(oldSelf.maxUnavailable) && (!has(self.maxUnavailable) || self.maxUnavailable == oldSelf.maxUnavailable)",message="maxUnavailable is immutable",fieldPath=".maxUnavailable"
// +kubebuilder:validation:XValidation:rule="has(self.ttlSecondsAfterFinished) == has(oldSelf.ttlSecondsAfterFinished) && (!has(self.ttlSecondsAfterFinished) || self.ttlSecondsAfterFinished == oldSelf.ttlSecondsAfterFinished)",message="ttlSecondsAfterFinished is immutable",fieldPath=".ttlSecondsAfterFinished"
// +kubebuilder:validation:XValidation:rule="has(self.pauseBefore) == has(oldSelf.pauseBefore) && (!has(self.pauseBefore) || self.pauseBefore == oldSelf.pauseBefore)",message="pauseBefore is immutable",fieldPath=".pauseBefore"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.resumedBefore) || (has(self.resumedBefore) && oldSelf.resumedBefore.all(n, n in self.resumedBefore))",message="resumedBefore only grows: a resumed pause is never taken back",fieldPath=".resumedBefore"
// +kubebuilder:validation:XValidation:rule="self.executionMode == oldSelf.executionMode || (oldSelf.executionMode == 'Controlled' && self.executionMode == 'Auto')",message="executionMode may only change from Controlled to Auto",fieldPath=".executionMode"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.abort) || !oldSelf.abort || (has(self.abort) && self.abort)",message="abort cannot be undone",fieldPath=".abort"
type NodeOperationSpec struct {
	// operationImmutableRules holds the rules that the fields holding durations (upgrade, custom,
	// windows, gates, the delays) do not change, generated by hack/immutablerules.
	operationImmutableRules `json:",inline"`

	// +optional
	Upgrade *UpgradeOperation `json:"upgrade,omitempty"`
	// +optional
	RenewCertificates *RenewCertificatesOperation `json:"renewCertificates,omitempty"`
	// Reconfigure changes the cluster's kubeadm ClusterConfiguration and kubelet configuration and
	// rolls the change out node by node (docs/how-to/reconfigure.md).
	// +optional
	Reconfigure *ReconfigureOperation `json:"reconfigure,omitempty"`
	// RotateCertificateAuthorities replaces the cluster's certificate authorities in four phases
	// (docs/how-to/rotate-cas.md).
	// +optional
	RotateCertificateAuthorities *RotateCertificateAuthoritiesOperation `json:"rotateCertificateAuthorities,omitempty"`
	// +optional
	Custom *CustomOperation `json:"custom,omitempty"`

	// NodeSelector narrows the nodes the operation touches; all nodes when empty.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn'] ? (has(e.values) && size(e.values) > 0) : (e.operator in ['Exists', 'DoesNotExist'] && (!has(e.values) || size(e.values) == 0)))",message="matchExpressions: the operator must be In, NotIn, Exists or DoesNotExist; In and NotIn need values, Exists and DoesNotExist take none"
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`

	// ExecutionMode: Auto, Controlled (each command waits for approval) or DryRun.
	// +optional
	// +kubebuilder:default=Auto
	ExecutionMode ExecutionMode `json:"executionMode,omitempty"`

	// Paused stops new commands from starting; running ones finish.
	// +optional
	Paused bool `json:"paused,omitempty"`

	// ResumedBefore names the pauseBefore nodes a person has let the operation start (kubectl
	// nodeops resume adds the node it is paused before): each pauses the operation once.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=253
	ResumedBefore []string `json:"resumedBefore,omitempty"`

	// Abort stops the operation for good: running commands finish, nothing new starts.
	// +optional
	Abort bool `json:"abort,omitempty"`

	// MaxUnavailable is the default for groups: how many nodes may be busy or failed at once.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^([1-9][0-9]?|100)%$')",message="must be an integer >= 1 or a percentage from 1% to 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// TTLSecondsAfterFinished deletes the operation and its tasks this long after it finished. Nothing is deleted when unset.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`

	// Scheduling is every group's default: maintenance windows and soak delays.
	Scheduling `json:",inline"`

	// Preflight adds checks to the preflight every selected node passes before the operation's
	// first task. Without it a preflight runs only when the commands need one (kubeadm, binaries,
	// service restarts: docs/how-to/preflight.md); with it, always.
	// +optional
	Preflight *OperationPreflight `json:"preflight,omitempty"`
}

// OperationPreflight is the checks an operation asks of every node besides those its commands imply.
type OperationPreflight struct {
	// +optional
	// +kubebuilder:validation:MaxItems=8
	Checks []PreflightCheck `json:"checks,omitempty"`
}

// PreflightStatus is the preflight's outcome: the nodes that failed it and why.
type PreflightStatus struct {
	// Failed are the nodes that failed the preflight, sorted by name: the operation starts no
	// task until each passes (fix the node, then retry its preflight task).
	// +optional
	Failed []PreflightFailure `json:"failed,omitempty"`
}

// PreflightFailure is one node's failed preflight.
type PreflightFailure struct {
	Node string `json:"node"`
	// Task is the preflight task to retry once the node is fixed.
	// +optional
	Task   string `json:"task,omitempty"`
	Reason string `json:"reason"`
}

// OperationPhase summarises an operation.
// Deleted is only a ClusterTarget's record of a generated operation gone (OperationPhaseDeleted).
// +kubebuilder:validation:Enum=Pending;Running;Paused;Blocked;Succeeded;Failed;Aborted;Deleted
type OperationPhase string

const (
	OperationPending   OperationPhase = "Pending"
	OperationRunning   OperationPhase = "Running"
	OperationPaused    OperationPhase = "Paused"
	OperationBlocked   OperationPhase = "Blocked"
	OperationSucceeded OperationPhase = "Succeeded"
	OperationFailed    OperationPhase = "Failed"
	OperationAborted   OperationPhase = "Aborted"
)

// Finished reports whether the phase is final.
func (p OperationPhase) Finished() bool {
	return p == OperationSucceeded || p == OperationFailed || p == OperationAborted
}

// Condition types of a NodeOperation.
const (
	ConditionProgressing = "Progressing"
	ConditionSucceeded   = "Succeeded"
	ConditionFailed      = "Failed"
	ConditionBlocked     = "Blocked"
	// ConditionPreflightFailed is true while a node has failed the preflight, which every selected
	// node passes before the operation's first task; set only on operations that run a preflight.
	ConditionPreflightFailed = "PreflightFailed"
)

// ReasonNodeHeldByFailedTask is the Blocked reason of an operation that can make no progress on
// its own: every node it still has to do waits for a node that another owner's failed task holds
// (a failure blocks until a person decides and budgets are cluster-wide, rules 3 and 11), so only a person's retry, skip or abort changes anything.
const ReasonNodeHeldByFailedTask = "NodeHeldByFailedTask"

// NodeCounts counts a group's nodes by state.
type NodeCounts struct {
	Total     int32 `json:"total"`
	Pending   int32 `json:"pending"`
	Running   int32 `json:"running"`
	Succeeded int32 `json:"succeeded"`
	Failed    int32 `json:"failed"`
	Skipped   int32 `json:"skipped"`
	// Aborted counts tasks that ended Aborted.
	// +optional
	Aborted int32 `json:"aborted,omitempty"`
}

// GroupPhase is a group's state.
// +kubebuilder:validation:Enum=Pending;Running;Blocked;Succeeded;Aborted
type GroupPhase string

const (
	GroupPending   GroupPhase = "Pending"
	GroupRunning   GroupPhase = "Running"
	GroupBlocked   GroupPhase = "Blocked"
	GroupSucceeded GroupPhase = "Succeeded"
	GroupAborted   GroupPhase = "Aborted"
)

// GroupStatus is one group's progress.
type GroupStatus struct {
	Name  string     `json:"name"`
	Phase GroupPhase `json:"phase"`
	Nodes NodeCounts `json:"nodes"`
	// Message says why the group is where it is, for example that it matched no node.
	// +optional
	Message string `json:"message,omitempty"`
	// Finished names the nodes whose task in this group ended, so that a task deleted by hand is
	// never created and run again (nothing deleted automatically, rule 7). It goes once the group has
	// succeeded: the group's phase then says it for every node.
	// +optional
	Finished *FinishedNodes `json:"finished,omitempty"`
	// CompletionTime is when the group succeeded, from which its successor's postGroupDelay counts.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// FinishedNodes names, in sorted lists, a group's nodes whose task ended, by how it ended.
type FinishedNodes struct {
	// +optional
	Succeeded []string `json:"succeeded,omitempty"`
	// Skipped: the task succeeded after a person skipped one of its commands.
	// +optional
	Skipped []string `json:"skipped,omitempty"`
	// +optional
	Aborted []string `json:"aborted,omitempty"`
}

// NodeOperationStatus is what the operation has done so far.
type NodeOperationStatus struct {
	// +optional
	Phase OperationPhase `json:"phase,omitempty"`
	// Progress is "done/total nodes" across all groups.
	// +optional
	Progress string `json:"progress,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// +optional
	Groups []GroupStatus `json:"groups,omitempty"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// NextStart is when the current group may start more nodes, while it waits for a maintenance
	// window to open or a soak delay to end (condition Progressing, reason WaitingForWindow or
	// WaitingForDelay); unset otherwise or when no window opens within a year.
	// +optional
	NextStart *metav1.Time `json:"nextStart,omitempty"`
	// Gates are the last results of the gates checked so far, by group and name.
	// +optional
	// +kubebuilder:validation:MaxItems=512
	Gates []GateStatus `json:"gates,omitempty"`
	// Silences are the Alertmanager silences the operation holds over nodes being worked on
	// (alertmanager gates with a silence): recorded when created, gone once expired.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	Silences []SilenceStatus `json:"silences,omitempty"`
	// PausedBefore is the node the operation is paused before (phase Paused, reason
	// PausedBeforeNode): a pauseBefore entry not yet in spec.resumedBefore. Unset otherwise.
	// +optional
	PausedBefore string `json:"pausedBefore,omitempty"`
	// Hooks is the progress of the hooks running, failed, or done but not yet implied by a task
	// or a group's phase (see HookRun).
	// +optional
	Hooks []HookRun `json:"hooks,omitempty"`
	// Preflight lists the nodes that failed the preflight, set only while one has.
	// +optional
	Preflight *PreflightStatus `json:"preflight,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// SilenceStatus is one Alertmanager silence held over a node for a gate of a group.
type SilenceStatus struct {
	Group string `json:"group"`
	Gate  string `json:"gate"`
	Node  string `json:"node"`
	// ID is Alertmanager's id of the silence.
	ID string `json:"id"`
	// StartTime is when the silence was first created: it ends by then plus maxDuration.
	StartTime metav1.Time `json:"startTime"`
}

// NodeOperation is one run of a workflow across nodes.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=nop;nops,categories=nodeops
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Progress",type=string,JSONPath=`.status.progress`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.executionMode`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeOperation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeOperationSpec   `json:"spec"`
	Status NodeOperationStatus `json:"status,omitempty"`
}

// NodeOperationList lists NodeOperations.
// +kubebuilder:object:root=true
type NodeOperationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeOperation `json:"items"`
}
