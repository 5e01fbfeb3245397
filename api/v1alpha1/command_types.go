package v1alpha1

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The CEL rules that name every kind (exactly one set; names unique) are generated from Command's fields.
//go:generate go run ../../hack/commandkinds

// The immutability rules of fields holding durations are generated from the spec types.
//go:generate go run ../../hack/immutablerules

// Command is one step a NodeTask runs on its node. Exactly one kind is set.
type Command struct {
	// commandKindRule holds the rule that exactly one kind is set, generated from the fields below.
	commandKindRule `json:",inline"`

	// Name labels the command in status and logs; defaults to the command kind.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name,omitempty"`

	// Retries is how many times a failed command is run again before the task fails. Nothing retries unless asked.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10
	Retries int32 `json:"retries,omitempty"`

	// Timeout bounds the command; the command fails when it passes. Unset, the kind's default
	// applies (kubeadmUpgradeApply 30m, drain 10m or its own timeout and 1m, script 1h, wait its duration and 1m, ...).
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="timeout must be from 1s to 24h"
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	KubeadmUpgradeApply      *KubeadmUpgradeApplyCommand      `json:"kubeadmUpgradeApply,omitempty"`
	KubeadmUpgradeNode       *KubeadmUpgradeNodeCommand       `json:"kubeadmUpgradeNode,omitempty"`
	KubeadmUpgradePlan       *KubeadmUpgradePlanCommand       `json:"kubeadmUpgradePlan,omitempty"`
	KubeadmRenewCertificates *KubeadmRenewCertificatesCommand `json:"kubeadmRenewCertificates,omitempty"`
	RestartStaticPods        *RestartStaticPodsCommand        `json:"restartStaticPods,omitempty"`
	InstallBinaries          *InstallBinariesCommand          `json:"installBinaries,omitempty"`
	InstallPackages          *InstallPackagesCommand          `json:"installPackages,omitempty"`
	RestartService           *RestartServiceCommand           `json:"restartService,omitempty"`
	Cordon                   *CordonCommand                   `json:"cordon,omitempty"`
	Drain                    *DrainCommand                    `json:"drain,omitempty"`
	Uncordon                 *UncordonCommand                 `json:"uncordon,omitempty"`
	WaitNodeReady            *WaitNodeReadyCommand            `json:"waitNodeReady,omitempty"`
	Preflight                *PreflightCommand                `json:"preflight,omitempty"`
	InstallFile              *InstallFileCommand              `json:"installFile,omitempty"`
	ContainerdRuntime        *ContainerdRuntimeCommand        `json:"containerdRuntime,omitempty"`
	Script                   *ScriptCommand                   `json:"script,omitempty"`
	Wait                     *WaitCommand                     `json:"wait,omitempty"`
	Pod                      *PodCommand                      `json:"pod,omitempty"`
	// The reconfigure operation's kinds (reconfigure_types.go).
	KubeadmUpdateConfig                *KubeadmUpdateConfigCommand                `json:"kubeadmUpdateConfig,omitempty"`
	KubeadmReconfigureNode             *KubeadmReconfigureNodeCommand             `json:"kubeadmReconfigureNode,omitempty"`
	KubeadmReissueAPIServerCertificate *KubeadmReissueAPIServerCertificateCommand `json:"kubeadmReissueAPIServerCertificate,omitempty"`
	// The certificate authority rotation's kinds (rotation_types.go).
	GenerateCertificateAuthorities *GenerateCertificateAuthoritiesCommand `json:"generateCertificateAuthorities,omitempty"`
	CopyCertificateAuthorities     *CopyCertificateAuthoritiesCommand     `json:"copyCertificateAuthorities,omitempty"`
	TrustCertificateAuthorities    *TrustCertificateAuthoritiesCommand    `json:"trustCertificateAuthorities,omitempty"`
	PublishCertificateAuthorities  *PublishCertificateAuthoritiesCommand  `json:"publishCertificateAuthorities,omitempty"`
	ReissueCertificates            *ReissueCertificatesCommand            `json:"reissueCertificates,omitempty"`
}

// KubeadmUpgradeApplyCommand runs `kubeadm upgrade apply VERSION --yes` on the first control-plane node.
// +kubebuilder:validation:XValidation:rule="!has(self.ignorePreflightErrors) || !self.ignorePreflightErrors.exists(e, e.lowerAscii() == 'all') || (has(self.allowIgnoreAllPreflightErrors) && self.allowIgnoreAllPreflightErrors && self.ignorePreflightErrors.size() == 1)",message="ignorePreflightErrors may hold all only alone and with allowIgnoreAllPreflightErrors: true",fieldPath=".ignorePreflightErrors"
type KubeadmUpgradeApplyCommand struct {
	// KubernetesVersion is the version to upgrade to, vMAJOR.MINOR.PATCH.
	// +kubebuilder:validation:Pattern=`^v[0-9]+\.[0-9]+\.[0-9]+$`
	// +kubebuilder:validation:MaxLength=32
	KubernetesVersion string `json:"kubernetesVersion"`
	// IgnorePreflightErrors is passed to kubeadm's --ignore-preflight-errors.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`(?i)^(all|CRI|ContainerRuntimeVersion|ControlPlaneNodesReady|CoreDNSMigration|CoreDNSUnsupportedPlugins|CreateJob|ExternalEtcdClientCertificates|ExternalEtcdVersion|Firewalld|HTTPProxy|HTTPProxyCIDR|Hostname|ImagePull|IsPrivilegedUser|KubeletVersion|KubernetesVersion|Mem|NumCPU|StaticPodManifest|Swap|SystemVerification|Port-[0-9]{1,5}|Service-[A-Za-z0-9@._-]+|(DirAvailable|FileAvailable|FileExisting|FileContent)-[A-Za-z0-9@._-]+)$`
	// +listType=set
	IgnorePreflightErrors []string `json:"ignorePreflightErrors,omitempty"`
	// AllowIgnoreAllPreflightErrors must be true for ignorePreflightErrors to hold "all".
	// +optional
	AllowIgnoreAllPreflightErrors bool `json:"allowIgnoreAllPreflightErrors,omitempty"`
}

func (*KubeadmUpgradeApplyCommand) KindName() string { return "kubeadmUpgradeApply" }

func (*KubeadmUpgradeApplyCommand) IsIdempotent() bool { return true }

func (c *KubeadmUpgradeApplyCommand) Description() string {
	return "kubeadm upgrade apply " + c.KubernetesVersion + ignoring(c.IgnorePreflightErrors)
}

// kubeadm waits up to 5 minutes for each control-plane static pod it replaces, etcd included.
func (*KubeadmUpgradeApplyCommand) DefaultTimeout() time.Duration { return 30 * time.Minute }

func (*KubeadmUpgradeApplyCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive}
}

// KubeadmUpgradeNodeCommand runs `kubeadm upgrade node` on a control-plane or worker node.
// +kubebuilder:validation:XValidation:rule="!has(self.ignorePreflightErrors) || !self.ignorePreflightErrors.exists(e, e.lowerAscii() == 'all') || (has(self.allowIgnoreAllPreflightErrors) && self.allowIgnoreAllPreflightErrors && self.ignorePreflightErrors.size() == 1)",message="ignorePreflightErrors may hold all only alone and with allowIgnoreAllPreflightErrors: true",fieldPath=".ignorePreflightErrors"
type KubeadmUpgradeNodeCommand struct {
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`(?i)^(all|CRI|ContainerRuntimeVersion|ControlPlaneNodesReady|CoreDNSMigration|CoreDNSUnsupportedPlugins|CreateJob|ExternalEtcdClientCertificates|ExternalEtcdVersion|Firewalld|HTTPProxy|HTTPProxyCIDR|Hostname|ImagePull|IsPrivilegedUser|KubeletVersion|KubernetesVersion|Mem|NumCPU|StaticPodManifest|Swap|SystemVerification|Port-[0-9]{1,5}|Service-[A-Za-z0-9@._-]+|(DirAvailable|FileAvailable|FileExisting|FileContent)-[A-Za-z0-9@._-]+)$`
	// +listType=set
	IgnorePreflightErrors []string `json:"ignorePreflightErrors,omitempty"`
	// AllowIgnoreAllPreflightErrors must be true for ignorePreflightErrors to hold "all".
	// +optional
	AllowIgnoreAllPreflightErrors bool `json:"allowIgnoreAllPreflightErrors,omitempty"`
}

func (*KubeadmUpgradeNodeCommand) KindName() string { return "kubeadmUpgradeNode" }

func (*KubeadmUpgradeNodeCommand) IsIdempotent() bool { return true }

func (c *KubeadmUpgradeNodeCommand) Description() string {
	return "kubeadm upgrade node" + ignoring(c.IgnorePreflightErrors)
}

func (*KubeadmUpgradeNodeCommand) DefaultTimeout() time.Duration { return 15 * time.Minute }

func (*KubeadmUpgradeNodeCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive}
}

// KubeadmUpgradePlanCommand runs `kubeadm upgrade plan VERSION` as a preflight check.
// +kubebuilder:validation:XValidation:rule="!has(self.ignorePreflightErrors) || !self.ignorePreflightErrors.exists(e, e.lowerAscii() == 'all') || (has(self.allowIgnoreAllPreflightErrors) && self.allowIgnoreAllPreflightErrors && self.ignorePreflightErrors.size() == 1)",message="ignorePreflightErrors may hold all only alone and with allowIgnoreAllPreflightErrors: true",fieldPath=".ignorePreflightErrors"
type KubeadmUpgradePlanCommand struct {
	// +kubebuilder:validation:Pattern=`^v[0-9]+\.[0-9]+\.[0-9]+$`
	// +kubebuilder:validation:MaxLength=32
	KubernetesVersion string `json:"kubernetesVersion"`
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`(?i)^(all|CRI|ContainerRuntimeVersion|ControlPlaneNodesReady|CoreDNSMigration|CoreDNSUnsupportedPlugins|CreateJob|ExternalEtcdClientCertificates|ExternalEtcdVersion|Firewalld|HTTPProxy|HTTPProxyCIDR|Hostname|ImagePull|IsPrivilegedUser|KubeletVersion|KubernetesVersion|Mem|NumCPU|StaticPodManifest|Swap|SystemVerification|Port-[0-9]{1,5}|Service-[A-Za-z0-9@._-]+|(DirAvailable|FileAvailable|FileExisting|FileContent)-[A-Za-z0-9@._-]+)$`
	// +listType=set
	IgnorePreflightErrors []string `json:"ignorePreflightErrors,omitempty"`
	// AllowIgnoreAllPreflightErrors must be true for ignorePreflightErrors to hold "all".
	// +optional
	AllowIgnoreAllPreflightErrors bool `json:"allowIgnoreAllPreflightErrors,omitempty"`
}

func (*KubeadmUpgradePlanCommand) KindName() string { return "kubeadmUpgradePlan" }

func (*KubeadmUpgradePlanCommand) IsIdempotent() bool { return true }

func (c *KubeadmUpgradePlanCommand) Description() string {
	return "kubeadm upgrade plan " + c.KubernetesVersion + ignoring(c.IgnorePreflightErrors)
}

func (*KubeadmUpgradePlanCommand) DefaultTimeout() time.Duration { return 5 * time.Minute }

// Effects: it changes nothing, but it has always counted as disruptive, so no group of it starts on a
// node someone cordoned; calling it NonDisruptive would change which nodes a group starts on.
func (*KubeadmUpgradePlanCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive}
}

// KubeadmRenewCertificatesCommand runs `kubeadm certs renew` for the listed certificates (all when empty)
// and reports each certificate's expiry afterwards.
type KubeadmRenewCertificatesCommand struct {
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Enum=all;admin.conf;apiserver;apiserver-etcd-client;apiserver-kubelet-client;controller-manager.conf;etcd-healthcheck-client;etcd-peer;etcd-server;front-proxy-client;scheduler.conf;super-admin.conf
	// +kubebuilder:validation:XValidation:rule="!self.exists(c, c == 'all') || self.size() == 1",message="all already names every certificate: list it alone"
	// +listType=set
	Certificates []string `json:"certificates,omitempty"`
}

func (*KubeadmRenewCertificatesCommand) KindName() string { return "kubeadmRenewCertificates" }

func (*KubeadmRenewCertificatesCommand) IsIdempotent() bool { return true }

func (c *KubeadmRenewCertificatesCommand) Description() string {
	return "kubeadm certs renew " + strings.Join(orAll(c.Certificates), " ")
}

func (*KubeadmRenewCertificatesCommand) DefaultTimeout() time.Duration { return 5 * time.Minute }

func (*KubeadmRenewCertificatesCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive}
}

// RestartStaticPodsCommand restarts control-plane static pods by moving each manifest out of
// /etc/kubernetes/manifests and back, then waiting for its mirror pod where a kubelet runs: etcd,
// then the API server, each alone and serving again before the next; the controller-manager and the
// scheduler together (both are only clients of the API server), so their restart waits for the slower.
type RestartStaticPodsCommand struct {
	// Components to restart; all manifests present when empty.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:Enum=etcd;kube-apiserver;kube-controller-manager;kube-scheduler
	// +listType=set
	Components []string `json:"components,omitempty"`
}

func (*RestartStaticPodsCommand) KindName() string { return "restartStaticPods" }

func (*RestartStaticPodsCommand) IsIdempotent() bool { return true }

func (c *RestartStaticPodsCommand) Description() string {
	return "restart static pods: " + strings.Join(orAll(c.Components), ", ")
}

// Up to 7 minutes for each of four components (gone, then back).
func (*RestartStaticPodsCommand) DefaultTimeout() time.Duration { return 30 * time.Minute }

func (*RestartStaticPodsCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive}
}

// BinarySource is where Kubernetes binaries come from: {baseURL}/{version}/bin/linux/{arch}/{name},
// each with {name}.sha256 beside it unless its digest is pinned in sha256.
// +kubebuilder:validation:XValidation:rule="self.baseURL.startsWith('https://') || (has(self.insecureHTTP) && self.insecureHTTP)",message="baseURL is plain http: use https, or set insecureHTTP: true to allow it",fieldPath=".baseURL"
type BinarySource struct {
	// BaseURL is an https URL (http only with insecureHTTP).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://`
	BaseURL string `json:"baseURL"`
	// InsecureHTTP must be true for baseURL to be plain http: anyone on the path can then change
	// the binaries and, unless sha256 pins them, their digests too.
	// +optional
	InsecureHTTP bool `json:"insecureHTTP,omitempty"`
	// SHA256 pins binaries' digests, used instead of the server's .sha256 files; a pin holds for
	// one architecture.
	// +optional
	SHA256 *BinaryDigests `json:"sha256,omitempty"`
	// CABundle is PEM certificates trusted for these downloads besides the system's.
	// +optional
	// +kubebuilder:validation:MaxLength=32768
	// +kubebuilder:validation:Pattern=`^\s*-----BEGIN CERTIFICATE-----`
	CABundle string `json:"caBundle,omitempty"`
}

// BinaryDigests are the sha256 digests (lowercase hex) of Kubernetes binaries.
type BinaryDigests struct {
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	Kubeadm string `json:"kubeadm,omitempty"`
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	Kubelet string `json:"kubelet,omitempty"`
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	Kubectl string `json:"kubectl,omitempty"`
}

// For is the pinned digest of binary name, "" when it is not pinned.
func (d *BinaryDigests) For(name string) string {
	if d == nil {
		return ""
	}
	return map[string]string{"kubeadm": d.Kubeadm, "kubelet": d.Kubelet, "kubectl": d.Kubectl}[name]
}

// InstallBinariesCommand replaces Kubernetes binaries on the node atomically, keeping the previous ones.
type InstallBinariesCommand struct {
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:Enum=kubeadm;kubelet;kubectl
	// +listType=set
	Components []string `json:"components"`
	// +kubebuilder:validation:Pattern=`^v[0-9]+\.[0-9]+\.[0-9]+$`
	// +kubebuilder:validation:MaxLength=32
	Version string       `json:"version"`
	Source  BinarySource `json:"source"`
}

func (*InstallBinariesCommand) KindName() string { return "installBinaries" }

func (*InstallBinariesCommand) IsIdempotent() bool { return true }

func (c *InstallBinariesCommand) Description() string {
	return fmt.Sprintf("install %s %s from %s", strings.Join(c.Components, ", "), c.Version, c.Source.BaseURL)
}

func (*InstallBinariesCommand) DefaultTimeout() time.Duration { return 15 * time.Minute }

func (c *InstallBinariesCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive, PlainHTTP: c.Source.InsecureHTTP && strings.HasPrefix(c.Source.BaseURL, "http://")}
}

// InstallPackagesCommand installs packages with the host's own package manager, inside the host
// root, optionally from a repository it adds and holding them at the installed version.
type InstallPackagesCommand struct {
	// Packages to install, such as kubeadm.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=128
	// Starts with a letter or digit: a leading '-' would reach the package manager as an option.
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9][A-Za-z0-9+._-]*$`
	// +listType=set
	Packages []string `json:"packages"`
	// Version every package is installed at. A Kubernetes version such as v1.37.2 (the leading v is
	// dropped) matches any packaging revision of it (apt kubeadm=1.37.2-*, dnf kubeadm-1.37.2); a
	// version with a revision (1.37.2-1.1) matches exactly. Empty: the newest the repositories hold.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^v?[0-9][A-Za-z0-9.+~:_-]*$`
	Version string `json:"version,omitempty"`
	// Manager is the package manager; auto picks it by the OS family found in the host root's
	// os-release (Debian: apt, RedHat: dnf, else yum, SUSE: zypper) and fails on any other family.
	// +optional
	// +kubebuilder:default=auto
	// +kubebuilder:validation:Enum=auto;apt;dnf;yum;zypper
	Manager string `json:"manager,omitempty"`
	// Hold keeps the packages at the installed version: apt-mark hold, the exclude list of dnf's or
	// yum's configuration, zypper addlock. A later installPackages of them lifts the hold for its own install.
	// +optional
	Hold bool `json:"hold,omitempty"`
	// Repository is a package source added for this install and left in place for later ones.
	// +optional
	Repository *PackageRepository `json:"repository,omitempty"`
}

// PackageRepository is one package source: an APT source (deb URL SUITE COMPONENTS), or a dnf, yum or zypper repository (baseurl URL).
// +kubebuilder:validation:XValidation:rule="has(self.signingKey) != (has(self.trusted) && self.trusted)",message="set signingKey, or trusted: true to install packages no signature checks (not both)"
type PackageRepository struct {
	// Name names the source's file: /etc/apt/sources.list.d/NAME.list, /etc/yum.repos.d/NAME.repo or
	// /etc/zypp/repos.d/NAME.repo.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`
	Name string `json:"name"`
	// URL of the repository: APT's URI, or the baseurl of an rpm-md repository.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[^\s\[\]]+$`
	URL string `json:"url"`
	// Suite is APT's suite or, for a flat repository such as pkgs.k8s.io, "/"; defaults to "/".
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9/][A-Za-z0-9._/-]*$`
	Suite string `json:"suite,omitempty"`
	// Components are APT's components (main, ...); none for a flat repository.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9][A-Za-z0-9._-]*$`
	// +kubebuilder:validation:items:MaxLength=63
	Components []string `json:"components,omitempty"`
	// SigningKey is the repository's ASCII-armoured OpenPGP public key: APT's signed-by, dnf's gpgkey.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	// +kubebuilder:validation:Pattern=`^\s*-----BEGIN PGP PUBLIC KEY BLOCK-----`
	SigningKey string `json:"signingKey,omitempty"`
	// Trusted installs from the repository without checking signatures (APT [trusted=yes], gpgcheck=0):
	// anyone who can change the repository, or the path to it, then chooses what runs as root on the node.
	// +optional
	Trusted bool `json:"trusted,omitempty"`
}

func (*InstallPackagesCommand) KindName() string { return "installPackages" }

// Installing packages at a version already installed changes nothing, so a re-run is safe.
func (*InstallPackagesCommand) IsIdempotent() bool { return true }

func (c *InstallPackagesCommand) Description() string {
	manager := c.Manager
	if manager == "" {
		manager = "auto"
	}
	s := fmt.Sprintf("install packages %s", strings.Join(c.Packages, ", "))
	if c.Version != "" {
		s += " " + c.Version
	}
	s += " with " + manager
	if c.Repository != nil {
		s += " from " + c.Repository.URL
		if c.Repository.Trusted {
			s += " (trusted, unsigned)"
		}
	}
	if c.Hold {
		s += ", held"
	}
	return s
}

func (*InstallPackagesCommand) DefaultTimeout() time.Duration { return 15 * time.Minute }

func (c *InstallPackagesCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive, PlainHTTP: c.Repository != nil && strings.HasPrefix(c.Repository.URL, "http://")}
}

// RestartServiceCommand restarts a service with the host's service manager. Restarting the kubelet
// on a control plane onto a binary of a new minor version, which names every static pod anew, it
// stops the static pods' old runs once the new kubelet serves its Pods API (SIGTERM, SIGKILL after
// 1 s), as the kubelet's housekeeping would seconds later, so that the new etcd and API server find
// their ports free.
type RestartServiceCommand struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// Starts with a letter, digit or underscore: a leading '-' would reach systemctl as an option.
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_][a-zA-Z0-9@._-]*$`
	Name string `json:"name"`
}

func (*RestartServiceCommand) KindName() string { return "restartService" }

func (*RestartServiceCommand) IsIdempotent() bool { return true }

func (c *RestartServiceCommand) Description() string {
	return "restart service " + c.Name
}

func (*RestartServiceCommand) DefaultTimeout() time.Duration { return 5 * time.Minute }

func (*RestartServiceCommand) Effects() CommandEffects { return CommandEffects{Disruption: Disruptive} }

// CordonCommand marks the node unschedulable, remembering whether it already was.
type CordonCommand struct{}

func (*CordonCommand) KindName() string { return "cordon" }

func (*CordonCommand) IsIdempotent() bool { return true }

func (*CordonCommand) Description() string {
	return "cordon the node"
}

func (*CordonCommand) DefaultTimeout() time.Duration { return time.Minute }

func (*CordonCommand) Effects() CommandEffects { return CommandEffects{Disruption: Disruptive} }

// UncordonCommand restores the schedulability the node had before cordon.
type UncordonCommand struct{}

func (*UncordonCommand) KindName() string { return "uncordon" }

func (*UncordonCommand) IsIdempotent() bool { return true }

func (*UncordonCommand) Description() string {
	return "uncordon the node (if cordon found it schedulable)"
}

func (*UncordonCommand) DefaultTimeout() time.Duration { return time.Minute }

func (*UncordonCommand) Effects() CommandEffects { return CommandEffects{Disruption: Restoring} }

// DrainCommand evicts the node's pods through the Eviction API, honouring PodDisruptionBudgets.
type DrainCommand struct {
	// Timeout for the whole drain; defaults to 5m.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="drain timeout must be from 1s to 24h"
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	GracePeriodSeconds *int64 `json:"gracePeriodSeconds,omitempty"`
	// +optional
	// +kubebuilder:default=true
	IgnoreDaemonSets *bool `json:"ignoreDaemonSets,omitempty"`
	// DeleteEmptyDirData evicts pods with emptyDir volumes, whose data is lost; without it the drain refuses them.
	// +optional
	DeleteEmptyDirData bool `json:"deleteEmptyDirData,omitempty"`
	// Force evicts pods that no controller owns, which will not come back; without it the drain refuses them.
	// +optional
	Force bool `json:"force,omitempty"`
	// PodSelector limits the drain to matching pods.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn'] ? (has(e.values) && size(e.values) > 0) : (e.operator in ['Exists', 'DoesNotExist'] && (!has(e.values) || size(e.values) == 0)))",message="matchExpressions: the operator must be In, NotIn, Exists or DoesNotExist; In and NotIn need values, Exists and DoesNotExist take none"
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
}

func (*DrainCommand) KindName() string { return "drain" }

func (*DrainCommand) IsIdempotent() bool { return true }

func (c *DrainCommand) Description() string {
	return "drain the node" + drainText(c)
}

// DefaultTimeout leaves the drain its own timeout and a minute more, and at least 10 minutes.
func (c *DrainCommand) DefaultTimeout() time.Duration { return atLeast(10*time.Minute, c.Timeout) }

// Effects: the drain is the command itself, which the manager performs.
func (c *DrainCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive, Drain: c}
}

// WaitNodeReadyCommand waits until the node reports Ready and, with controlPlane, until the node's
// control plane is healthy again (succeeded means served, rule 13).
type WaitNodeReadyCommand struct {
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="waitNodeReady timeout must be from 1s to 24h"
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// ControlPlane also waits for the node's static pods (those with a manifest on the host) to be
	// Ready, running Version where set, and for the API server to answer /readyz and authorize the agent.
	// +optional
	ControlPlane *ControlPlaneHealth `json:"controlPlane,omitempty"`
}

// ControlPlaneHealth is what a healthy control plane runs.
type ControlPlaneHealth struct {
	// Version the kube-* static pods' images are tagged with, such as v1.37.2; empty for any.
	// +optional
	// +kubebuilder:validation:Pattern=`^v[0-9]+\.[0-9]+\.[0-9]+$`
	// +kubebuilder:validation:MaxLength=64
	Version string `json:"version,omitempty"`
}

func (*WaitNodeReadyCommand) KindName() string { return "waitNodeReady" }

func (*WaitNodeReadyCommand) IsIdempotent() bool { return true }

func (c *WaitNodeReadyCommand) Description() string {
	what := "the node to be Ready"
	if c.ControlPlane != nil {
		what = "the node and its control plane to be healthy"
		if c.ControlPlane.Version != "" {
			what += " at " + c.ControlPlane.Version
		}
	}
	return "wait for " + what + durationText(" within ", c.Timeout)
}

func (c *WaitNodeReadyCommand) DefaultTimeout() time.Duration {
	return atLeast(10*time.Minute, c.Timeout)
}

func (*WaitNodeReadyCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: NonDisruptive}
}

// PreflightCommand checks the node before work starts.
type PreflightCommand struct {
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Checks []PreflightCheck `json:"checks,omitempty"`
}

func (*PreflightCommand) KindName() string { return "preflight" }

func (*PreflightCommand) IsIdempotent() bool { return true }

func (c *PreflightCommand) Description() string {
	return "preflight checks" + preflightText(c.Checks)
}

func (*PreflightCommand) DefaultTimeout() time.Duration { return 2 * time.Minute }

func (*PreflightCommand) Effects() CommandEffects { return CommandEffects{Disruption: NonDisruptive} }

// PreflightCheck is one check; exactly one field is set.
// +kubebuilder:validation:XValidation:rule="[has(self.binary), has(self.minFreeDiskMiB), has(self.osFamily), has(self.kubeadm), has(self.runtimeSocket), has(self.binarySource), has(self.kubeletSkew), has(self.initSystem), has(self.packageManager)].filter(x, x).size() == 1",message="exactly one of binary, minFreeDiskMiB, osFamily, kubeadm, runtimeSocket, binarySource, kubeletSkew, initSystem or packageManager must be set"
type PreflightCheck struct {
	// Binary must exist under the host root, as an absolute path.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/`
	// +kubebuilder:validation:XValidation:rule="!self.contains('/../') && !self.endsWith('/..')",message="must not contain '..'"
	Binary string `json:"binary,omitempty"`
	// MinFreeDiskMiB is the free disk the host root must have.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1073741824
	MinFreeDiskMiB int64 `json:"minFreeDiskMiB,omitempty"`
	// OSFamily lists the OS families the node may have.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:Enum=debian;rhel;suse;alpine;arch;unknown
	// +listType=set
	OSFamily []string `json:"osFamily,omitempty"`
	// Kubeadm: /usr/bin/kubeadm runs under the host root and, when version is set, is that version.
	// +optional
	Kubeadm *KubeadmCheck `json:"kubeadm,omitempty"`
	// RuntimeSocket is the container runtime's socket under the host root, which must accept a connection.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/`
	// +kubebuilder:validation:XValidation:rule="!self.contains('/../') && !self.endsWith('/..')",message="must not contain '..'"
	RuntimeSocket string `json:"runtimeSocket,omitempty"`
	// BinarySource: the node reaches the source of the binaries it will download (a HEAD of each).
	// +optional
	BinarySource *BinarySourceCheck `json:"binarySource,omitempty"`
	// KubeletSkew: the node's kubelet (as its Node reports it) is within Kubernetes' version skew
	// policy of this control-plane version: not newer, at most three minor versions older.
	// +optional
	KubeletSkew *KubeletSkewCheck `json:"kubeletSkew,omitempty"`
	// InitSystem: the host's init system is one the agent restarts services through (systemd,
	// OpenRC, sysvinit).
	// +optional
	InitSystem *EmptyCheck `json:"initSystem,omitempty"`
	// PackageManager: installPackages with this manager can run on the host: for auto, its OS
	// family is Debian, RedHat or SUSE; and the manager's program is there.
	// +optional
	PackageManager *PackageManagerCheck `json:"packageManager,omitempty"`
}

// PackageManagerCheck checks that installPackages with Manager would find its package manager.
type PackageManagerCheck struct {
	// Manager as installPackages takes it; empty is auto.
	// +optional
	// +kubebuilder:validation:Enum=auto;apt;dnf;yum;zypper
	Manager string `json:"manager,omitempty"`
}

// EmptyCheck is a check with no parameters.
type EmptyCheck struct{}

// KubeadmCheck checks the host's kubeadm.
type KubeadmCheck struct {
	// Version kubeadm must report (`kubeadm version -o short`); any when empty.
	// +optional
	// +kubebuilder:validation:Pattern=`^v[0-9]+\.[0-9]+\.[0-9]+$`
	// +kubebuilder:validation:MaxLength=32
	Version string `json:"version,omitempty"`
}

// BinarySourceCheck checks that the node reaches a binary source.
type BinarySourceCheck struct {
	Source BinarySource `json:"source"`
	// +kubebuilder:validation:Pattern=`^v[0-9]+\.[0-9]+\.[0-9]+$`
	// +kubebuilder:validation:MaxLength=32
	Version string `json:"version"`
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:Enum=kubeadm;kubelet;kubectl
	// +listType=set
	Components []string `json:"components"`
}

// KubeletSkewCheck checks the kubelet's version against a control-plane version.
type KubeletSkewCheck struct {
	// +kubebuilder:validation:Pattern=`^v[0-9]+\.[0-9]+\.[0-9]+$`
	// +kubebuilder:validation:MaxLength=32
	KubernetesVersion string `json:"kubernetesVersion"`
}

// InstallFileCommand downloads a file, verifies its sha256 and moves it into place atomically.
// +kubebuilder:validation:XValidation:rule="!has(self.mode) || (has(self.allowUnsafeMode) && self.allowUnsafeMode) || !self.mode.matches('[1-7][0-7]{3}$')",message="mode sets the setuid, setgid or sticky bit: set allowUnsafeMode: true to allow it",fieldPath=".mode"
// +kubebuilder:validation:XValidation:rule="!has(self.mode) || (has(self.allowUnsafeMode) && self.allowUnsafeMode) || !self.mode.matches('[2367]$')",message="mode makes the file world-writable: set allowUnsafeMode: true to allow it",fieldPath=".mode"
// +kubebuilder:validation:XValidation:rule="(has(self.remove) && self.remove) || !has(self.url) || self.url.startsWith('https://') || (has(self.insecureHTTP) && self.insecureHTTP)",message="url is plain http: use https, or set insecureHTTP: true to allow it",fieldPath=".url"
// +kubebuilder:validation:XValidation:rule="(has(self.remove) && self.remove) || !has(self.platforms) || self.platforms.all(p, p.url.startsWith('https://')) || (has(self.insecureHTTP) && self.insecureHTTP)",message="a platform's url is plain http: use https, or set insecureHTTP: true to allow it",fieldPath=".platforms"
// +kubebuilder:validation:XValidation:rule="(has(self.remove) && self.remove) || has(self.url) != has(self.platforms)",message="set either url and sha256 (one artifact for every node) or platforms (one per os and arch), not both or neither"
// +kubebuilder:validation:XValidation:rule="has(self.url) == has(self.sha256)",message="url and sha256 go together: the file is verified against sha256",fieldPath=".sha256"
type InstallFileCommand struct {
	// URL is an https URL (http only with insecureHTTP) of the one artifact every node gets;
	// platforms instead gives one per node platform.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://`
	URL string `json:"url,omitempty"`
	// Platforms are per-platform artifacts (as krew and runtime-class-manager list them): the agent
	// takes the one matching its Node's kubernetes.io/os and kubernetes.io/arch labels, and a node
	// with no match fails before anything is downloaded.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(p, self.exists_one(q, q.arch == p.arch && (has(q.os) ? q.os : 'linux') == (has(p.os) ? p.os : 'linux')))",message="each os and arch may appear once"
	Platforms []InstallFilePlatform `json:"platforms,omitempty"`
	// InsecureHTTP must be true for url to be plain http (sha256 still protects the file's content).
	// +optional
	InsecureHTTP bool `json:"insecureHTTP,omitempty"`
	// CABundle is PEM certificates trusted for this download besides the system's.
	// +optional
	// +kubebuilder:validation:MaxLength=32768
	// +kubebuilder:validation:Pattern=`^\s*-----BEGIN CERTIFICATE-----`
	CABundle string `json:"caBundle,omitempty"`
	// SHA256 of the file at url.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	SHA256 string `json:"sha256,omitempty"`
	// Path on the host, absolute.
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/`
	// +kubebuilder:validation:XValidation:rule="!self.contains('/../') && !self.endsWith('/..')",message="must not contain '..'"
	// +kubebuilder:validation:XValidation:rule="!self.endsWith('/') && !self.endsWith('/.')",message="must name a file: not /, and not ending in / or /."
	Path string `json:"path"`
	// Mode as an octal string such as "0755"; defaults to 0644.
	// +optional
	// +kubebuilder:validation:Pattern=`^0?[0-7]{3,4}$`
	// +kubebuilder:validation:MaxLength=5
	Mode string `json:"mode,omitempty"`
	// AllowUnsafeMode must be true for mode to set the setuid, setgid or sticky bit or make the file world-writable.
	// +optional
	AllowUnsafeMode bool `json:"allowUnsafeMode,omitempty"`
	// Remove deletes the file instead (for uninstall); url and sha256 are then ignored.
	// +optional
	Remove bool `json:"remove,omitempty"`
}

// InstallFilePlatform is one platform's artifact of an installFile.
type InstallFilePlatform struct {
	// OS is a node's kubernetes.io/os; linux when empty.
	// +optional
	// +kubebuilder:validation:Enum=linux
	OS string `json:"os,omitempty"`
	// Arch is a node's kubernetes.io/arch.
	// +kubebuilder:validation:Enum=amd64;arm64;arm;ppc64le;s390x;riscv64
	Arch string `json:"arch"`
	// URL is an https URL (http only with the command's insecureHTTP).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://`
	URL string `json:"url"`
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	SHA256 string `json:"sha256"`
}

// Platform is "os/arch", linux when os is empty.
func (p InstallFilePlatform) Platform() string {
	os := p.OS
	if os == "" {
		os = "linux"
	}
	return os + "/" + p.Arch
}

func (*InstallFileCommand) KindName() string { return "installFile" }

func (*InstallFileCommand) IsIdempotent() bool { return true }

func (c *InstallFileCommand) Description() string {
	if c.Remove {
		return "remove " + c.Path
	}
	if len(c.Platforms) > 0 {
		var ps []string
		for _, p := range c.Platforms {
			ps = append(ps, p.Platform())
		}
		return fmt.Sprintf("install %s for %s", c.Path, strings.Join(ps, ", "))
	}
	return fmt.Sprintf("install %s from %s", c.Path, c.URL)
}

func (*InstallFileCommand) DefaultTimeout() time.Duration { return 15 * time.Minute }

// Effects: a removal downloads nothing; otherwise the one url or any platform's may be plain http.
func (c *InstallFileCommand) Effects() CommandEffects {
	insecure := false
	if !c.Remove && c.InsecureHTTP {
		insecure = strings.HasPrefix(c.URL, "http://")
		for _, p := range c.Platforms {
			insecure = insecure || strings.HasPrefix(p.URL, "http://")
		}
	}
	return CommandEffects{Disruption: Disruptive, PlainHTTP: insecure}
}

// ContainerdRuntimeCommand adds or removes a runtime handler in containerd's config (version 2 or 3), then restarts
// containerd. Where the config lives and which unit runs containerd come from the distro preset (docs/design.md,
// "containerd presets").
// +kubebuilder:validation:XValidation:rule="(has(self.remove) && self.remove) || has(self.runtimeType)",message="runtimeType is required to add a runtime handler",fieldPath=".runtimeType"
// +kubebuilder:validation:XValidation:rule="!(has(self.skipRestart) && self.skipRestart && has(self.restart) && has(self.restart.drain) && self.restart.drain)",message="restart.drain needs a restart: drop skipRestart",fieldPath=".restart"
type ContainerdRuntimeCommand struct {
	// Name of the runtime handler, as RuntimeClasses name it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// RuntimeType such as io.containerd.wasmedge.v1; required unless removing.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_-]+([.][A-Za-z0-9_-]+)*$`
	RuntimeType string `json:"runtimeType,omitempty"`
	// BinaryPath of the shim on the host, absolute.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/`
	// +kubebuilder:validation:XValidation:rule="!self.contains('/../') && !self.endsWith('/..')",message="must not contain '..'"
	BinaryPath string `json:"binaryPath,omitempty"`
	// Distro says whose containerd this is: containerd (/etc/containerd/config.toml), k3s, rke2, k0s or
	// microk8s; auto, the default, tells them apart by the files in the host root.
	// +optional
	// +kubebuilder:validation:Enum=auto;containerd;k3s;rke2;k0s;microk8s
	// +kubebuilder:default=auto
	Distro ContainerdDistro `json:"distro,omitempty"`
	// ConfigPath of containerd's config, overriding the distro's; a path ending in .tmpl is edited as a
	// k3s/rke2 template. The distro still names the unit restarted.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/`
	// +kubebuilder:validation:XValidation:rule="!self.contains('/../') && !self.endsWith('/..')",message="must not contain '..'"
	ConfigPath string `json:"configPath,omitempty"`
	// Options are written in the handler's options table (runc's BinaryName, SystemdCgroup, ...).
	// "true" and "false" are written as booleans and decimal numbers as numbers, anything else as a string.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) > 0 && size(k) <= 128 && k.matches('^[A-Za-z0-9_.-]+$'))",message="option names are 1 to 128 letters, digits, '_', '.' or '-'"
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(self[k]) <= 1024)",message="option values are at most 1024 characters"
	Options map[string]string `json:"options,omitempty"`
	// PodAnnotations are the annotation keys (or prefixes ending in *) containerd passes to the runtime.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9]([A-Za-z0-9./_-]*[A-Za-z0-9*])?$`
	// +listType=set
	PodAnnotations []string `json:"podAnnotations,omitempty"`
	// Remove takes the handler out instead of adding it.
	// +optional
	Remove bool `json:"remove,omitempty"`
	// SkipRestart leaves containerd running with the old config.
	// +optional
	SkipRestart bool `json:"skipRestart,omitempty"`
	// Restart says how containerd is restarted.
	// +optional
	Restart *ContainerdRestart `json:"restart,omitempty"`
}

// ContainerdDistro names a distro preset of the containerdRuntime command.
type ContainerdDistro string

// The distro presets; docs/design.md lists each one's config and unit.
const (
	ContainerdDistroAuto       ContainerdDistro = "auto"
	ContainerdDistroContainerd ContainerdDistro = "containerd"
	ContainerdDistroK3s        ContainerdDistro = "k3s"
	ContainerdDistroRKE2       ContainerdDistro = "rke2"
	ContainerdDistroK0s        ContainerdDistro = "k0s"
	ContainerdDistroMicroK8s   ContainerdDistro = "microk8s"
)

// ContainerdRestart is how the containerdRuntime command restarts containerd.
type ContainerdRestart struct {
	// Drain cordons and drains the node (as the drain command with its defaults) before the restart,
	// and uncordons it after; a node someone else had cordoned stays cordoned.
	// +optional
	Drain bool `json:"drain,omitempty"`
}

func (*ContainerdRuntimeCommand) KindName() string { return "containerdRuntime" }

func (*ContainerdRuntimeCommand) IsIdempotent() bool { return true }

// Effects: with restart.drain, the drain (with the drain command's defaults) before the restart.
func (c *ContainerdRuntimeCommand) Effects() CommandEffects {
	e := CommandEffects{Disruption: Disruptive}
	if !c.SkipRestart && c.Restart != nil && c.Restart.Drain {
		e.Drain = &DrainCommand{}
	}
	return e
}

func (c *ContainerdRuntimeCommand) Description() string {
	s := fmt.Sprintf("add containerd runtime %s (%s)", c.Name, c.RuntimeType)
	if c.Remove {
		s = "remove containerd runtime " + c.Name
	}
	if c.Distro != "" && c.Distro != ContainerdDistroAuto {
		s += " in " + string(c.Distro) + "'s config"
	}
	switch {
	case c.SkipRestart:
	case c.Restart != nil && c.Restart.Drain:
		s += ", drain, restart containerd, uncordon"
	default:
		s += ", restart containerd"
	}
	return s
}

// DefaultTimeout leaves room for the drain (its own default is 5 minutes) when the restart drains.
func (c *ContainerdRuntimeCommand) DefaultTimeout() time.Duration {
	if c.Restart != nil && c.Restart.Drain {
		return 15 * time.Minute
	}
	return 5 * time.Minute
}

// ScriptCommand runs a shell script inside the host root.
type ScriptCommand struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=16384
	Inline string `json:"inline"`
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	Env []EnvVar `json:"env,omitempty"`
	// EnvFrom takes every key of each Secret in nodeops-system as a variable; env wins over it.
	// The agent reads the Secret when the script starts, from the volume the node's kubelet mounted for
	// the task's secret holder pod, and redacts its values from status.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	EnvFrom []EnvFromSource `json:"envFrom,omitempty"`
	// Idempotent says the script is safe to run again after an interruption.
	// +optional
	Idempotent bool `json:"idempotent,omitempty"`
}

func (*ScriptCommand) KindName() string { return "script" }

func (c *ScriptCommand) IsIdempotent() bool { return c.Idempotent }

func (c *ScriptCommand) Description() string {
	s := "script: " + firstLine(c.Inline)
	if c.Idempotent {
		s += " (idempotent)"
	}
	return s
}

func (*ScriptCommand) DefaultTimeout() time.Duration { return time.Hour }

// Effects: the Secrets its env and envFrom name (internal/secretholder keeps only those admission allows).
func (c *ScriptCommand) Effects() CommandEffects {
	e := CommandEffects{Disruption: Disruptive}
	for _, v := range c.Env {
		if v.ValueFrom != nil {
			e.Secrets = append(e.Secrets, v.ValueFrom.SecretKeyRef.Name)
		}
	}
	for _, f := range c.EnvFrom {
		e.Secrets = append(e.Secrets, f.SecretRef.Name)
	}
	return e
}

// EnvVar is one environment variable for a script: a value, or one taken from a Secret.
// +kubebuilder:validation:XValidation:rule="!has(self.valueFrom) || !has(self.value) || size(self.value) == 0",message="value and valueFrom are exclusive: set one",fieldPath=".valueFrom"
type EnvVar struct {
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name"`
	// Value is stored plainly in the operation and its tasks, which viewers read: use valueFrom for a secret.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Value string `json:"value,omitempty"`
	// ValueFrom takes the value from a key of a Secret in nodeops-system.
	// +optional
	ValueFrom *EnvVarSource `json:"valueFrom,omitempty"`
}

// EnvVarSource is where a variable's value comes from, as in core/v1 (Secrets only).
type EnvVarSource struct {
	SecretKeyRef SecretKeySelector `json:"secretKeyRef"`
}

// ScriptSecretPrefix starts the name of every Secret a script may take its environment from
// (admission refuses any other name, and so do the manager and the agent for a task that predates the
// rule), so that an operation cannot hand a script the namespace's other Secrets, such as Helm's
// release Secrets (sh.helm.release.v1.*). The manager cannot read Secrets to check anything else.
const ScriptSecretPrefix = "nodeops-script-"

// SecretKeySelector names one key of a Secret in nodeops-system.
type SecretKeySelector struct {
	// Name of the Secret, in nodeops-system; it must start with nodeops-script-.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self.startsWith('nodeops-script-')",message="secretKeyRef.name must start with nodeops-script-: scripts take env only from Secrets in nodeops-system named so"
	Name string `json:"name"`
	// Key in the Secret's data.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key"`
}

// EnvFromSource takes every key of a Secret as a variable, as in core/v1 (Secrets only).
type EnvFromSource struct {
	SecretRef SecretEnvSource `json:"secretRef"`
}

// SecretEnvSource names a Secret in nodeops-system.
type SecretEnvSource struct {
	// Name of the Secret, in nodeops-system; it must start with nodeops-script-.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self.startsWith('nodeops-script-')",message="secretRef.name must start with nodeops-script-: scripts take env only from Secrets in nodeops-system named so"
	Name string `json:"name"`
}

// WaitCommand waits for a duration.
type WaitCommand struct {
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="wait duration must be from 0s to 24h"
	Duration metav1.Duration `json:"duration"`
}

func (*WaitCommand) KindName() string { return "wait" }

func (*WaitCommand) IsIdempotent() bool { return true }

func (c *WaitCommand) Description() string {
	return "wait " + c.Duration.Duration.String()
}

func (c *WaitCommand) DefaultTimeout() time.Duration { return c.Duration.Duration + time.Minute }

func (*WaitCommand) Effects() CommandEffects { return CommandEffects{Disruption: NonDisruptive} }

// PodCommand runs one pod on the task's node (an installer image such as KWasm's kwasm-node-installer or
// runtime-class-manager's node-installer), waits for it to end, and records its exit code and log tail.
// The pod runs in the agent's namespace as the ServiceAccount nodeops-installer, which has no RBAC and no
// token; it tolerates every taint. It is not idempotent: an installer may not be safe to run twice.
type PodCommand struct {
	// Image to run.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// An image reference as the container runtime reads it: [registry[:port]/]path[:tag][@digest].
	// +kubebuilder:validation:Pattern=`^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$`
	Image string `json:"image"`
	// ImagePullPolicy as in a Pod: Always, IfNotPresent or Never; unset, the API server's default for the image.
	// +optional
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// Command replaces the image's entrypoint.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	Command []string `json:"command,omitempty"`
	// Args replace the image's cmd.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	Args []string `json:"args,omitempty"`
	// Env are plain variables: stored in the operation and its tasks, which viewers read, so no secrets.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	Env []PodEnvVar `json:"env,omitempty"`
	// Privileged runs the container privileged, as installers that restart containerd need.
	// +optional
	Privileged bool `json:"privileged,omitempty"`
	// HostPID puts the pod in the host's PID namespace (nsenter into PID 1, as some installers do).
	// +optional
	HostPID bool `json:"hostPID,omitempty"`
	// MountHostRoot mounts the host's / at /host, as KWasm's installer expects (NODE_ROOT=/host).
	// +optional
	MountHostRoot bool `json:"mountHostRoot,omitempty"`
	// Timeout is how long the pod may take, image pull included; 10m when unset. On timeout the pod is
	// deleted and the command fails.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="pod timeout must be from 1s to 24h"
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// PodEnvVar is one plain environment variable of a pod command.
type PodEnvVar struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	Name string `json:"name"`
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Value string `json:"value,omitempty"`
}

// DefaultPodTimeout bounds a pod command's pod when it sets no timeout.
const DefaultPodTimeout = 10 * time.Minute

func (*PodCommand) KindName() string { return "pod" }

func (*PodCommand) IsIdempotent() bool { return false }

func (c *PodCommand) Description() string {
	s := "run pod " + c.Image
	if c.Image == "" {
		s = "run a pod"
	}
	if len(c.Command) > 0 || len(c.Args) > 0 {
		s += ": " + firstLine(strings.Join(append(append([]string{}, c.Command...), c.Args...), " "))
	}
	var opts []string
	if c.Privileged {
		opts = append(opts, "privileged")
	}
	if c.HostPID {
		opts = append(opts, "host PID")
	}
	if c.MountHostRoot {
		opts = append(opts, "host / at /host")
	}
	if c.Timeout != nil {
		opts = append(opts, "timeout "+c.Timeout.Duration.String())
	}
	if len(opts) > 0 {
		s += " (" + strings.Join(opts, ", ") + ")"
	}
	return s
}

// PodTimeout is how long the pod may take: its timeout, or DefaultPodTimeout.
func (c *PodCommand) PodTimeout() time.Duration {
	if c.Timeout != nil && c.Timeout.Duration > 0 {
		return c.Timeout.Duration
	}
	return DefaultPodTimeout
}

// DefaultTimeout leaves the pod its own timeout and a minute more to delete it and record the result.
func (c *PodCommand) DefaultTimeout() time.Duration { return c.PodTimeout() + time.Minute }

func (*PodCommand) Effects() CommandEffects { return CommandEffects{Disruption: Disruptive} }

// CommandKind is what each command type declares about itself, so that a kind is defined once, on its
// type: Command's Kind, Idempotent and Spec are derived from its fields, and the agent and CLI ask the kind.
// +kubebuilder:object:generate=false
type CommandKind interface {
	// KindName is the kind's field name in Command, as JSON spells it, such as "script".
	KindName() string
	// IsIdempotent reports whether the command is safe to run again after an interruption.
	IsIdempotent() bool
	// Description says in one line what the command does on the node, with its arguments.
	Description() string
	// DefaultTimeout bounds a command of this kind that sets no timeout of its own: every command
	// has one (every command has a timeout, rule 12).
	DefaultTimeout() time.Duration
	// Effects say what the command does that the manager, the agent and the CLI judge it by.
	Effects() CommandEffects
}

// CommandEffects answer, for one command, the questions asked of it away from its handler. Every kind
// answers them on its type (Effects), and TestEveryCommandKindIsComplete fails for a kind that does not,
// so a new kind cannot be added without saying whether it disrupts, downloads, drains or reads Secrets.
// +kubebuilder:object:generate=false
type CommandEffects struct {
	// Disruption is what the command does to its node's availability: a group whose commands restore
	// and otherwise only wait or check may start on a cordoned node (nodeoperation's onlyRestores).
	Disruption Disruption
	// PlainHTTP: the command downloads over plain http, which its insecureHTTP had to allow; the CLI's
	// plan marks it.
	PlainHTTP bool
	// Drain is the drain the command has the manager do for it (agents may not evict: agents confined
	// to their own node, rule 10), nil for none.
	Drain *DrainCommand
	// Secrets are the names of the Secrets (in nodeops-system) the command reads, which the manager has
	// the node's kubelet mount through the task's secret holder pod (internal/secretholder).
	Secrets []string
}

// Disruption is what a command does to its node's availability.
type Disruption string

const (
	// Disruptive: the command may leave its node less available (cordoned, drained, restarted, changed).
	Disruptive Disruption = "Disruptive"
	// NonDisruptive: the command only waits or checks; its node is as available after as before.
	NonDisruptive Disruption = "NonDisruptive"
	// Restoring: the command makes its node available again (uncordon restores what cordon found).
	Restoring Disruption = "Restoring"
)

// Spec is the command kind that is set, nil when none is. It walks Command's pointer fields, so a
// new kind needs no case here.
func (c *Command) Spec() CommandKind {
	v := reflect.ValueOf(c).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Kind() != reflect.Pointer || f.IsNil() {
			continue
		}
		if k, ok := f.Interface().(CommandKind); ok {
			return k
		}
	}
	return nil
}

// Kind names the command kind that is set, such as "script".
func (c *Command) Kind() string {
	if k := c.Spec(); k != nil {
		return k.KindName()
	}
	return "unknown"
}

// DisplayName is the command's name in status: its Name, or its kind.
func (c *Command) DisplayName() string {
	if c.Name != "" {
		return c.Name
	}
	return c.Kind()
}

// EffectiveTimeout bounds the command: its Timeout when set, else its kind's DefaultTimeout.
func (c *Command) EffectiveTimeout() time.Duration {
	if c.Timeout != nil && c.Timeout.Duration > 0 {
		return c.Timeout.Duration
	}
	if k := c.Spec(); k != nil {
		return k.DefaultTimeout()
	}
	return time.Minute
}

// Effects are the effects of the kind that is set; a command with none set counts as Disruptive.
func (c *Command) Effects() CommandEffects {
	if k := c.Spec(); k != nil {
		return k.Effects()
	}
	return CommandEffects{Disruption: Disruptive}
}

// Drains is the drain this command has the manager do for it (agents confined to their own node, rule 10): a
// drain command's own, or the drain with its defaults that containerdRuntime's restart.drain makes;
// nil for a command that drains nothing. Each kind says so in its Effects.
func (c *Command) Drains() *DrainCommand { return c.Effects().Drain }

// Idempotent reports whether the command is safe to run again after an interruption.
// Every built-in command converges on its desired state; a script says so itself.
func (c *Command) Idempotent() bool {
	if k := c.Spec(); k != nil {
		return k.IsIdempotent()
	}
	return true
}

func orAll(names []string) []string {
	if len(names) == 0 {
		return []string{"all"}
	}
	return names
}

func ignoring(errs []string) string {
	if len(errs) == 0 {
		return ""
	}
	return " --ignore-preflight-errors=" + strings.Join(errs, ",")
}

// atLeast is floor, or a command's own wait and a minute more when that is longer.
func atLeast(floor time.Duration, own *metav1.Duration) time.Duration {
	if own != nil && own.Duration+time.Minute > floor {
		return own.Duration + time.Minute
	}
	return floor
}

func durationText(prefix string, d *metav1.Duration) string {
	if d == nil {
		return ""
	}
	return prefix + d.Duration.String()
}

func drainText(d *DrainCommand) string {
	var parts []string
	if d.Timeout != nil {
		parts = append(parts, "timeout "+d.Timeout.Duration.String())
	}
	if d.GracePeriodSeconds != nil {
		parts = append(parts, fmt.Sprintf("grace %ds", *d.GracePeriodSeconds))
	}
	if d.IgnoreDaemonSets == nil || *d.IgnoreDaemonSets {
		parts = append(parts, "ignoring DaemonSets")
	}
	if d.DeleteEmptyDirData {
		parts = append(parts, "deleting emptyDir data")
	}
	if d.Force {
		parts = append(parts, "forcing pods no controller owns")
	}
	if d.PodSelector != nil {
		parts = append(parts, "pods "+metav1.FormatLabelSelector(d.PodSelector))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func preflightText(checks []PreflightCheck) string {
	var parts []string
	for _, c := range checks {
		if t := PreflightCheckText(c); t != "" {
			parts = append(parts, t)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, ", ")
}

// PreflightCheckText says what a check checks, in a few words.
func PreflightCheckText(c PreflightCheck) string {
	var parts []string
	{
		switch {
		case c.Binary != "":
			parts = append(parts, "has "+c.Binary)
		case c.MinFreeDiskMiB > 0:
			parts = append(parts, fmt.Sprintf("%d MiB free", c.MinFreeDiskMiB))
		case len(c.OSFamily) > 0:
			parts = append(parts, "OS "+strings.Join(c.OSFamily, "|"))
		case c.Kubeadm != nil && c.Kubeadm.Version != "":
			parts = append(parts, "kubeadm "+c.Kubeadm.Version)
		case c.Kubeadm != nil:
			parts = append(parts, "kubeadm runs")
		case c.RuntimeSocket != "":
			parts = append(parts, c.RuntimeSocket+" answers")
		case c.BinarySource != nil:
			parts = append(parts, c.BinarySource.Source.BaseURL+" reachable")
		case c.KubeletSkew != nil:
			parts = append(parts, "kubelet within skew of "+c.KubeletSkew.KubernetesVersion)
		case c.InitSystem != nil:
			parts = append(parts, "init system known")
		case c.PackageManager != nil && c.PackageManager.Manager != "" && c.PackageManager.Manager != "auto":
			parts = append(parts, c.PackageManager.Manager+" present")
		case c.PackageManager != nil:
			parts = append(parts, "package manager known")
		}
	}
	return strings.Join(parts, "")
}

// firstLine is a script's first line, shortened to fit a table.
func firstLine(s string) string {
	s = strings.TrimSpace(s)
	line, rest, _ := strings.Cut(s, "\n")
	line = strings.TrimSpace(line)
	if len(line) > 60 {
		line = line[:57] + "..."
	} else if strings.TrimSpace(rest) != "" {
		line += " ..."
	}
	return line
}
