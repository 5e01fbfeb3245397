package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ClusterTargetName is the name of the one ClusterTarget.
const ClusterTargetName = "cluster"

// ClusterCertificates says when the control planes' kubeadm certificates are renewed.
type ClusterCertificates struct {
	// AutoRenew renews the certificates when any of them expires within renewBefore.
	// +optional
	AutoRenew bool `json:"autoRenew,omitempty"`
	// RenewBefore is how long before the first expiry an automatic renewal starts.
	// +optional
	// +kubebuilder:default="720h"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1h') && duration(self) <= duration('87600h')",message="renewBefore must be from 1h to 87600h (ten years, a kubeadm CA's life)"
	RenewBefore *metav1.Duration `json:"renewBefore,omitempty"`
	// RotationCount renews the certificates once each time it is raised; it can only go up.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="rotationCount can only go up: raise it to renew the certificates once more"
	RotationCount int32 `json:"rotationCount,omitempty"`
}

// +kubebuilder:validation:XValidation:rule="!has(self.ignorePreflightErrors) || !self.ignorePreflightErrors.exists(e, e.lowerAscii() == 'all') || (has(self.allowIgnoreAllPreflightErrors) && self.allowIgnoreAllPreflightErrors && self.ignorePreflightErrors.size() == 1)",message="ignorePreflightErrors may hold all only alone and with allowIgnoreAllPreflightErrors: true",fieldPath=".ignorePreflightErrors"
// +kubebuilder:validation:XValidation:rule="!has(self.binarySource) || !has(self.binarySource.sha256)",message="binarySource.sha256 pins one version's binaries, and a ClusterTarget upgrades through several: pin them on a NodeOperation's upgrade instead",fieldPath=".binarySource.sha256"
// +kubebuilder:validation:XValidation:rule="!has(self.binarySource) || !has(self.packageSource) || self.packageSource == 'binaries'",message="binarySource serves packageSource binaries only: the package manager installs from packageRepository or the node's own sources",fieldPath=".binarySource"
// +kubebuilder:validation:XValidation:rule="!has(self.packageRepository) || (has(self.packageSource) && self.packageSource != 'binaries')",message="packageRepository needs packageSource apt, dnf, yum, zypper or auto",fieldPath=".packageRepository"
// ClusterUpgrade is how the upgrades a ClusterTarget generates run; the fields are those of a
// NodeOperation's upgrade, plus the versions of intermediate minor steps.
type ClusterUpgrade struct {
	// MaxUnavailable is passed to the generated operations: how many workers may be busy at once.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^([1-9][0-9]?|100)%$')",message="must be an integer >= 1 or a percentage from 1% to 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// Drain settings for workers.
	// +optional
	Drain *DrainCommand `json:"drain,omitempty"`
	// BinarySource serves kubeadm, kubelet and kubectl of every version the upgrade goes through.
	// +optional
	BinarySource *BinarySource `json:"binarySource,omitempty"`
	// PackageSource is passed to the generated upgrades: binaries (the default) swaps the binaries
	// from binarySource; apt, dnf, yum, zypper or auto (by each node's OS family) installs and holds
	// the packages of each version the upgrade goes through with the node's package manager.
	// +optional
	// +kubebuilder:validation:Enum=binaries;apt;dnf;yum;zypper;auto
	PackageSource string `json:"packageSource,omitempty"`
	// PackageRepository is passed to the generated upgrades: added on each node before its packages
	// are installed. It must hold every version the upgrade goes through (pkgs.k8s.io has one
	// repository per minor version: a target more than one minor ahead needs a mirror of them all,
	// or the nodes' own sources).
	// +optional
	PackageRepository *PackageRepository `json:"packageRepository,omitempty"`
	// UpgradeKubeletAndKubectl replaces the kubelet and kubectl binaries and restarts the kubelet.
	// +optional
	// +kubebuilder:default=true
	UpgradeKubeletAndKubectl *bool `json:"upgradeKubeletAndKubectl,omitempty"`
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
	// Path names the version of each intermediate minor step, for a target more than one minor
	// version ahead (kubeadm upgrades one minor at a time): from v1.35.3 to v1.37.2, path
	// [v1.36.4]. nodeops cannot know a minor's latest patch without asking the internet, and
	// vX.Y.0 is rarely what anyone wants, so a step that is not named is refused, not guessed.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:Pattern=`^v[0-9]+\.[0-9]+\.[0-9]+$`
	// +kubebuilder:validation:items:MaxLength=32
	Path []string `json:"path,omitempty"`
}

// ClusterKubelet is the kubelet configuration a ClusterTarget keeps the cluster at.
type ClusterKubelet struct {
	// Configuration is a merge patch (YAML or JSON) over kube-system/kubelet-config's
	// KubeletConfiguration, as a reconfigure's kubeletConfiguration.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=16384
	// +kubebuilder:validation:XValidation:rule="!self.matches('(?m)^[^a-zA-Z0-9]*(apiVersion|kind)[^a-zA-Z0-9]*:')",message="kubelet.configuration patches the kubelet's fields: apiVersion and kind are kubeadm's"
	Configuration string `json:"configuration"`
	// Drain drains each worker before its kubelet restarts; workers are not drained without it.
	// +optional
	Drain *DrainCommand `json:"drain,omitempty"`
}

// +kubebuilder:validation:XValidation:rule="!has(oldSelf.certificateAuthorities) || !has(oldSelf.certificateAuthorities.rotationCount) || (has(self.certificateAuthorities) && has(self.certificateAuthorities.rotationCount))",message="rotationCount can only go up: it cannot be removed once set",fieldPath=".certificateAuthorities.rotationCount"
// ClusterTargetSpec is what the cluster should be.
type ClusterTargetSpec struct {
	// KubernetesVersion the cluster should run.
	// +kubebuilder:validation:Pattern=`^v[0-9]+\.[0-9]+\.[0-9]+$`
	// +kubebuilder:validation:MaxLength=32
	KubernetesVersion string `json:"kubernetesVersion"`
	// +optional
	Certificates ClusterCertificates `json:"certificates,omitempty"`
	// CertificateAuthorities: when the cluster's certificate authorities are rotated (once per raise
	// of rotationCount) and how (docs/how-to/rotate-cas.md).
	// +optional
	CertificateAuthorities ClusterCertificateAuthorities `json:"certificateAuthorities,omitempty"`
	// +optional
	Upgrade ClusterUpgrade `json:"upgrade,omitempty"`
	// ControlPlane is what kube-system/kubeadm-config's ClusterConfiguration must hold (flags,
	// volumes, etcd's flags, the API server certificate's names and feature gates, as a reconfigure's
	// clusterConfiguration): while it does not, the ClusterTarget generates a reconfigure operation.
	// +optional
	ControlPlane *ClusterConfigurationPatch `json:"controlPlane,omitempty"`
	// Kubelet is what kube-system/kubelet-config must hold: while it does not, the ClusterTarget
	// generates a reconfigure operation.
	// +optional
	Kubelet *ClusterKubelet `json:"kubelet,omitempty"`
	// ExecutionMode of the NodeOperations it generates: Auto, Controlled or DryRun.
	// +optional
	// +kubebuilder:default=Auto
	ExecutionMode ExecutionMode `json:"executionMode,omitempty"`
	// Paused: no new NodeOperation is generated; one already running goes on.
	// +optional
	Paused bool `json:"paused,omitempty"`
	// Scheduling: operations are generated only inside these windows, and carry the windows and
	// delays, so a run the window's close interrupts resumes at its next opening.
	Scheduling `json:",inline"`
}

// ClusterTargetPhase summarises a ClusterTarget.
// +kubebuilder:validation:Enum=UpToDate;Progressing;Blocked;Paused;Waiting
type ClusterTargetPhase string

const (
	ClusterUpToDate    ClusterTargetPhase = "UpToDate"
	ClusterProgressing ClusterTargetPhase = "Progressing"
	ClusterBlocked     ClusterTargetPhase = "Blocked"
	ClusterPaused      ClusterTargetPhase = "Paused"
	// ClusterWaiting: not up to date, nothing running, nothing it can start (a refused target,
	// a policy no renewal satisfies, a dry run done).
	ClusterWaiting ClusterTargetPhase = "Waiting"
)

// Condition types of a ClusterTarget. Ready, Reconciling and Stalled follow kstatus
// (sigs.k8s.io/cli-utils/pkg/kstatus), which Flux and Argo CD read (Ready is NodeProfile's constant): Reconciling and Stalled are
// abnormal-true, present only while true is possible.
const (
	ConditionUpToDate    = "UpToDate"
	ConditionReconciling = "Reconciling"
	ConditionStalled     = "Stalled"
	// ConditionProgressing and ConditionBlocked are NodeOperation's, with the same meaning.
)

// GeneratedOperationKind is what a generated NodeOperation does.
// +kubebuilder:validation:Enum=Upgrade;RenewCertificates;Reconfigure;RotateCertificateAuthorities
type GeneratedOperationKind string

const (
	GeneratedUpgrade                      GeneratedOperationKind = "Upgrade"
	GeneratedRenewCertificates            GeneratedOperationKind = "RenewCertificates"
	GeneratedReconfigure                  GeneratedOperationKind = "Reconfigure"
	GeneratedRotateCertificateAuthorities GeneratedOperationKind = "RotateCertificateAuthorities"
)

// GeneratedOperation is a NodeOperation the ClusterTarget generated. Entries are history: one whose
// operation was deleted by hand stays, with phase Deleted, so that deleting it runs nothing again.
type GeneratedOperation struct {
	Name string                 `json:"name"`
	Kind GeneratedOperationKind `json:"kind"`
	// Phase is the operation's: empty while it is only recorded (intent before action), then its
	// phase once seen to exist, Deleted once gone after that.
	// +optional
	Phase OperationPhase `json:"phase,omitempty"`
	// Reason is why it was generated, or the reason of its Blocked or Failed condition.
	// +optional
	Reason string `json:"reason,omitempty"`
	// KubernetesVersion an upgrade goes to.
	// +optional
	KubernetesVersion string `json:"kubernetesVersion,omitempty"`
	// Generation of the ClusterTarget that generated it: a failed attempt is tried again only after
	// the spec changed.
	// +optional
	Generation int64 `json:"generation,omitempty"`
	// ExecutionMode it was generated with.
	// +optional
	ExecutionMode ExecutionMode `json:"executionMode,omitempty"`
	// CompletionTime is when it finished.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// RotationPhase is, for a certificate authority rotation not yet finished, the phase its current
	// group belongs to: prepare, trust-both, re-issue or complete (docs/how-to/rotate-cas.md).
	// +optional
	// +kubebuilder:validation:Enum=prepare;trust-both;re-issue;complete
	RotationPhase string `json:"rotationPhase,omitempty"`
}

// OperationPhaseDeleted is the phase of a generated operation that no longer exists.
const OperationPhaseDeleted OperationPhase = "Deleted"

// ObservedNode is one node's versions.
type ObservedNode struct {
	Name string `json:"name"`
	// KubeletVersion from the node's status.nodeInfo.
	// +optional
	KubeletVersion string `json:"kubeletVersion,omitempty"`
	// +optional
	ControlPlane bool `json:"controlPlane,omitempty"`
	// StaticPods maps a control plane's static pod component (kube-apiserver, etcd, ...) to the
	// tag of its mirror pod's image in kube-system.
	// +optional
	StaticPods map[string]string `json:"staticPods,omitempty"`
}

// ObservedCertificates is one control plane's certificate expiry; only nodes labelled
// node-role.kubernetes.io/control-plane are read.
type ObservedCertificates struct {
	Node string `json:"node"`
	// Certificates as the node's agent last read them with `kubeadm certs check-expiration`
	// (the node's nodeops.io/certificates annotation, read on a slow jittered interval), or as
	// the node's newest succeeded renewal or upgrade NodeTask reported them, whichever expires later.
	// +optional
	Certificates []CertificateExpiry `json:"certificates,omitempty"`
	// CertificateAuthorities are the node's certificate authorities' expiry (ca, etcd-ca,
	// front-proxy-ca) as its agent last read them: renewing certificates keeps them; rotating the
	// certificate authorities replaces them.
	// +optional
	CertificateAuthorities []CertificateExpiry `json:"certificateAuthorities,omitempty"`
	// Task is the NodeTask the reading comes from; empty when it is the agent's own reading.
	// +optional
	Task string `json:"task,omitempty"`
	// Problem says why the reading cannot be true (a certificate the cluster CA signs expiring
	// outside that CA's validity); such a reading counts for nothing.
	// +optional
	Problem string `json:"problem,omitempty"`
}

// ClusterTargetStatus is what the cluster is, and what the ClusterTarget did about it.
type ClusterTargetStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	Phase ClusterTargetPhase `json:"phase,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// KubernetesVersion is the cluster's, from kube-system/kubeadm-config's ClusterConfiguration.
	// +optional
	KubernetesVersion string `json:"kubernetesVersion,omitempty"`
	// Nodes are every node's versions, sorted by name.
	// +optional
	Nodes []ObservedNode `json:"nodes,omitempty"`
	// Certificates are the control planes' certificate expiry, by node.
	// +optional
	Certificates []ObservedCertificates `json:"certificates,omitempty"`
	// NextCertificateExpiry is the earliest expiry in certificates.
	// +optional
	NextCertificateExpiry *metav1.Time `json:"nextCertificateExpiry,omitempty"`
	// NextCertificateAuthorityExpiry is the earliest expiry of a certificate authority in
	// certificates: a renewal cannot move it, a rotation (certificateAuthorities.rotationCount) does.
	// +optional
	NextCertificateAuthorityExpiry *metav1.Time `json:"nextCertificateAuthorityExpiry,omitempty"`
	// UpgradePath is the versions still to go through, one minor step each, the target last.
	// +optional
	UpgradePath []string `json:"upgradePath,omitempty"`
	// Operations it generated, oldest first.
	// +optional
	Operations []GeneratedOperation `json:"operations,omitempty"`
	// Drift is, per node whose agent has read it, whether its static pod manifests (control planes
	// only) and kubelet configuration match what kubeadm generates from kube-system's kubeadm-config
	// and kubelet-config, and in what they differ; sorted by node.
	// +optional
	Drift []ObservedDrift `json:"drift,omitempty"`
	// DriftedNodes counts the nodes in drift that drift.
	// +optional
	DriftedNodes int32 `json:"driftedNodes,omitempty"`
	// LastRotationCount is the spec.certificates.rotationCount already acted on.
	// +optional
	LastRotationCount int32 `json:"lastRotationCount,omitempty"`
	// LastCertificateAuthorityRotationCount is the spec.certificateAuthorities.rotationCount already
	// acted on: recorded with the rotation it generated, before that NodeOperation is created.
	// +optional
	LastCertificateAuthorityRotationCount int32 `json:"lastCertificateAuthorityRotationCount,omitempty"`
}

// ClusterTarget says what the cluster should be (Kubernetes version, certificate policy); nodeops
// shows what it is and generates the NodeOperations that get it there. There is one, named cluster.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=ct,categories=nodeops
// +kubebuilder:validation:XValidation:rule="self.metadata.name == 'cluster'",message="there is one ClusterTarget and it is named cluster"
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.status.kubernetesVersion`
// +kubebuilder:printcolumn:name="Target",type=string,JSONPath=`.spec.kubernetesVersion`
// +kubebuilder:printcolumn:name="Next-Cert-Expiry",type=string,JSONPath=`.status.nextCertificateExpiry`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Drifted",type=integer,JSONPath=`.status.driftedNodes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ClusterTarget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterTargetSpec   `json:"spec"`
	Status ClusterTargetStatus `json:"status,omitempty"`
}

// ClusterTargetList lists ClusterTargets.
// +kubebuilder:object:root=true
type ClusterTargetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterTarget `json:"items"`
}
