package v1alpha1

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// ReconfigureOperation changes a kubeadm cluster's configuration as kubeadm's "Reconfiguring a
// kubeadm cluster" does it by hand: the kubeadm-config and kubelet-config ConfigMaps in kube-system
// are patched once, on the first control plane; then each control plane in turn regenerates its
// static pod manifests with the real kubeadm and waits until its components serve again, and every
// node (workers under maxUnavailable, drained only with drain) rewrites its kubelet configuration
// with kubeadm and restarts its kubelet. The changes live in the ConfigMaps, which kubeadm upgrade
// keeps, so a later upgrade does not undo them.
// +kubebuilder:validation:XValidation:rule="has(self.clusterConfiguration) || has(self.kubeletConfiguration)",message="set clusterConfiguration, kubeletConfiguration or both: there is nothing to reconfigure"
type ReconfigureOperation struct {
	// ClusterConfiguration patches the ClusterConfiguration in kube-system/kubeadm-config.
	// +optional
	ClusterConfiguration *ClusterConfigurationPatch `json:"clusterConfiguration,omitempty"`
	// KubeletConfiguration is a merge patch (RFC 7386, in YAML or JSON) over the KubeletConfiguration
	// in kube-system/kubelet-config, for example "maxPods: 150"; every node's kubelet gets it. Text
	// rather than an object: the API server's CEL cannot see into an object of unknown fields, so the
	// rules that keep the spec immutable could not compare it (the planner checks it is a mapping).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=16384
	// +kubebuilder:validation:XValidation:rule="!self.matches('(?m)^[^a-zA-Z0-9]*(apiVersion|kind)[^a-zA-Z0-9]*:')",message="kubeletConfiguration patches the kubelet's fields: apiVersion and kind are kubeadm's"
	KubeletConfiguration string `json:"kubeletConfiguration,omitempty"`
	// Drain drains each worker before its kubelet restarts; workers are not drained without it.
	// Control planes are never drained: their kubelet restart leaves their static pods running.
	// +optional
	Drain *DrainCommand `json:"drain,omitempty"`
}

// ClusterConfigurationPatch is the part of kubeadm's ClusterConfiguration (kubeadm.k8s.io/v1beta4)
// a reconfigure changes.
// +kubebuilder:validation:XValidation:rule="has(self.apiServer) || has(self.controllerManager) || has(self.scheduler) || has(self.etcd) || has(self.featureGates)",message="clusterConfiguration changes nothing: set apiServer, controllerManager, scheduler, etcd or featureGates"
type ClusterConfigurationPatch struct {
	// +optional
	APIServer *APIServerPatch `json:"apiServer,omitempty"`
	// +optional
	ControllerManager *ControlPlaneComponentPatch `json:"controllerManager,omitempty"`
	// +optional
	Scheduler *ControlPlaneComponentPatch `json:"scheduler,omitempty"`
	// Etcd patches the local (stacked) etcd's extraArgs in etcd.local; each control plane's etcd
	// manifest is regenerated in turn. A cluster whose etcd is external is refused when the
	// operation runs, before anything changes.
	// +optional
	Etcd *EtcdPatch `json:"etcd,omitempty"`
	// FeatureGates sets kubeadm's feature gates by name (kubeadm's own, not the components').
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	FeatureGates map[string]bool `json:"featureGates,omitempty"`
}

// ControlPlaneComponentPatch changes one control-plane component's flags and host-path volumes.
// +kubebuilder:validation:XValidation:rule="!has(self.extraArgs) || !has(self.removeExtraArgs) || !self.extraArgs.exists(a, a.name in self.removeExtraArgs)",message="a flag is either set in extraArgs or removed in removeExtraArgs, not both"
type ControlPlaneComponentPatch struct {
	// ExtraArgs sets flags by name (replacing a flag of that name already there).
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	ExtraArgs []ExtraArg `json:"extraArgs,omitempty"`
	// RemoveExtraArgs removes flags by name from the component's extraArgs.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9][a-z0-9-]*$`
	// +listType=set
	RemoveExtraArgs []string `json:"removeExtraArgs,omitempty"`
	// ExtraVolumes adds host-path volumes by name (replacing a volume of that name already there).
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	ExtraVolumes []HostPathMount `json:"extraVolumes,omitempty"`
}

// APIServerPatch is a ControlPlaneComponentPatch for the API server, which also has certSANs.
type APIServerPatch struct {
	ControlPlaneComponentPatch `json:",inline"`
	// CertSANs are extra names (DNS names, "*." wildcards, IP addresses) for the API server's serving certificate,
	// added to those kube-system/kubeadm-config already has; each control plane's certificate is
	// re-issued in turn with kubeadm (kubeadmReissueAPIServerCertificate). Names are only added:
	// a reconfigure removes none.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^((\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*|[0-9a-fA-F:.]*:[0-9a-fA-F:.]*)$`
	// +listType=set
	CertSANs []string `json:"certSANs,omitempty"`
}

// EtcdPatch changes the local etcd's flags.
// +kubebuilder:validation:XValidation:rule="has(self.extraArgs) || has(self.removeExtraArgs)",message="etcd changes nothing: set extraArgs or removeExtraArgs"
// +kubebuilder:validation:XValidation:rule="!has(self.extraArgs) || !has(self.removeExtraArgs) || !self.extraArgs.exists(a, a.name in self.removeExtraArgs)",message="a flag is either set in extraArgs or removed in removeExtraArgs, not both"
type EtcdPatch struct {
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	ExtraArgs []ExtraArg `json:"extraArgs,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9][a-z0-9-]*$`
	// +listType=set
	RemoveExtraArgs []string `json:"removeExtraArgs,omitempty"`
}

// ExtraArg is one flag, as kubeadm v1beta4 writes it: its name without the leading dashes.
type ExtraArg struct {
	// Name is the flag's name without leading dashes, for example audit-log-maxage.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9][a-z0-9-]*$`
	Name string `json:"name"`
	// +kubebuilder:validation:MaxLength=1024
	Value string `json:"value"`
}

// HostPathMount is a host path mounted into a control-plane component, kubeadm's HostPathMount.
type HostPathMount struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:Pattern=`^/`
	HostPath string `json:"hostPath"`
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:Pattern=`^/`
	MountPath string `json:"mountPath"`
	// +optional
	ReadOnly bool `json:"readOnly,omitempty"`
	// +optional
	// +kubebuilder:validation:Enum="";DirectoryOrCreate;Directory;FileOrCreate;File;Socket;CharDevice;BlockDevice
	PathType corev1.HostPathType `json:"pathType,omitempty"`
}

// KubeadmUpdateConfigCommand patches kube-system's kubeadm-config (ClusterConfiguration) and
// kubelet-config ConfigMaps with the credentials kubeadm itself uses on a control plane
// (/etc/kubernetes/admin.conf), writing each only when the patch changes it, and prints the
// difference. Applying it twice is applying it once.
type KubeadmUpdateConfigCommand struct {
	// +optional
	ClusterConfiguration *ClusterConfigurationPatch `json:"clusterConfiguration,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=16384
	KubeletConfiguration string `json:"kubeletConfiguration,omitempty"`
}

func (*KubeadmUpdateConfigCommand) KindName() string { return "kubeadmUpdateConfig" }

func (*KubeadmUpdateConfigCommand) IsIdempotent() bool { return true }

func (c *KubeadmUpdateConfigCommand) Description() string {
	return "patch kube-system's " + strings.Join(reconfigured(c.ClusterConfiguration, c.KubeletConfiguration), " and ")
}

func (*KubeadmUpdateConfigCommand) DefaultTimeout() time.Duration { return 2 * time.Minute }

// Effects: it changes the cluster's configuration, not the node; it counts as disruptive so that
// it never starts on a node someone cordoned, as kubeadmUpgradeApply does not.
func (*KubeadmUpdateConfigCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive}
}

// KubeadmReconfigureNodeCommand regenerates this node's files from the cluster's kubeadm-config and
// kubelet-config with kubeadm (passing /etc/kubernetes/patches when the node has it): on a control
// plane its static pod manifests (`kubeadm upgrade node phase control-plane`, which waits for the
// changed components to restart), then on every node its kubelet configuration (`kubeadm upgrade
// node phase kubelet-config`); the kubelet restarts in the next command. In a DryRun it writes
// nothing and prints, per file, what the node would get with the patches below applied to the
// ConfigMaps (which the DryRun did not write).
type KubeadmReconfigureNodeCommand struct {
	// ControlPlane regenerates the static pod manifests too.
	// +optional
	ControlPlane bool `json:"controlPlane,omitempty"`
	// Kubelet regenerates the kubelet's configuration.
	// +optional
	Kubelet bool `json:"kubelet,omitempty"`
	// ClusterConfiguration and KubeletConfiguration are the operation's patches, which a DryRun
	// applies to what it renders.
	// +optional
	ClusterConfiguration *ClusterConfigurationPatch `json:"clusterConfiguration,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=16384
	KubeletConfiguration string `json:"kubeletConfiguration,omitempty"`
}

func (*KubeadmReconfigureNodeCommand) KindName() string { return "kubeadmReconfigureNode" }

func (*KubeadmReconfigureNodeCommand) IsIdempotent() bool { return true }

func (c *KubeadmReconfigureNodeCommand) Description() string {
	var phases []string
	if c.ControlPlane {
		phases = append(phases, "control-plane")
	}
	if c.Kubelet {
		phases = append(phases, "kubelet-config")
	}
	if len(phases) == 0 {
		return "kubeadm upgrade node phase: none"
	}
	return "kubeadm upgrade node phase " + strings.Join(phases, ", ")
}

// kubeadm waits up to 5 minutes for each control-plane static pod it replaces.
func (*KubeadmReconfigureNodeCommand) DefaultTimeout() time.Duration { return 20 * time.Minute }

func (*KubeadmReconfigureNodeCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive}
}

// KubeadmReissueAPIServerCertificateCommand re-issues this control plane's API server serving
// certificate with kubeadm, as kubeadm's "Reconfiguring a kubeadm cluster" does by hand: the old
// apiserver.crt and apiserver.key are saved to /etc/kubernetes/tmp/nodeops-apiserver-certificate
// (the record, written before anything moves), taken out of /etc/kubernetes/pki, and `kubeadm init
// phase certs apiserver --config` issues a new pair from the cluster's kubeadm-config (which must
// already hold certSANs). A certificate that already has every name is kept: run again after an
// interruption it neither issues twice nor loses the old pair. The API server picks the new pair up
// when it restarts (restartStaticPods). In a DryRun it prints the names before and after.
type KubeadmReissueAPIServerCertificateCommand struct {
	// CertSANs are the names the certificate must have; it is re-issued only when one is missing.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^((\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*|[0-9a-fA-F:.]*:[0-9a-fA-F:.]*)$`
	// +listType=set
	CertSANs []string `json:"certSANs"`
}

func (*KubeadmReissueAPIServerCertificateCommand) KindName() string {
	return "kubeadmReissueAPIServerCertificate"
}

func (*KubeadmReissueAPIServerCertificateCommand) IsIdempotent() bool { return true }

func (c *KubeadmReissueAPIServerCertificateCommand) Description() string {
	return "re-issue the API server's serving certificate with kubeadm init phase certs apiserver, with names " + strings.Join(c.CertSANs, ", ")
}

func (*KubeadmReissueAPIServerCertificateCommand) DefaultTimeout() time.Duration {
	return 2 * time.Minute
}

// Effects: the running API server keeps serving its old certificate until restartStaticPods; the
// command changes the node's PKI, so it is disruptive and never starts on a node someone cordoned.
func (*KubeadmReissueAPIServerCertificateCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive}
}

// Changes names the ConfigMaps the operation patches and what in them, such as
// "kubelet-config (maxPods)".
func (r *ReconfigureOperation) Changes() []string {
	return reconfigured(r.ClusterConfiguration, r.KubeletConfiguration)
}

// reconfigured names the ConfigMaps a patch changes.
func reconfigured(cluster *ClusterConfigurationPatch, kubelet string) []string {
	var out []string
	if cluster != nil {
		out = append(out, "kubeadm-config ("+strings.Join(cluster.Sections(), ", ")+")")
	}
	if kubelet != "" {
		if patch, err := KubeletPatch(kubelet); err != nil {
			out = append(out, "kubelet-config")
		} else {
			out = append(out, "kubelet-config ("+strings.Join(slices.Sorted(maps.Keys(patch)), ", ")+")")
		}
	}
	if len(out) == 0 {
		return []string{"nothing"}
	}
	return out
}

// Sections names the ClusterConfiguration sections the patch changes, in kubeadm's order.
func (p *ClusterConfigurationPatch) Sections() []string {
	var out []string
	for _, s := range []struct {
		name string
		set  bool
	}{
		{"apiServer", p.APIServer != nil}, {"controllerManager", p.ControllerManager != nil},
		{"scheduler", p.Scheduler != nil}, {"etcd", p.Etcd != nil}, {"featureGates", len(p.FeatureGates) > 0},
	} {
		if s.set {
			out = append(out, s.name)
		}
	}
	return out
}

// String is the flag as a component's command line holds it.
func (a ExtraArg) String() string { return fmt.Sprintf("--%s=%s", a.Name, a.Value) }

// KubeletPatch reads a kubeletConfiguration merge patch: it must be a YAML or JSON mapping.
func KubeletPatch(text string) (map[string]any, error) {
	var patch map[string]any
	if err := yaml.Unmarshal([]byte(text), &patch); err != nil {
		return nil, fmt.Errorf("kubeletConfiguration is no YAML or JSON mapping: %w", err)
	}
	if len(patch) == 0 {
		return nil, fmt.Errorf("kubeletConfiguration changes nothing: it is an empty mapping")
	}
	for _, k := range []string{"apiVersion", "kind"} {
		if _, ok := patch[k]; ok {
			return nil, fmt.Errorf("kubeletConfiguration patches the kubelet's fields: %s is kubeadm's", k)
		}
	}
	return patch, nil
}
