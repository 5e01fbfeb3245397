package plan

import (
	"errors"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// LabelControlPlane marks control-plane nodes, as kubeadm sets it.
const LabelControlPlane = "node-role.kubernetes.io/control-plane"

// Names of the groups built-in operations expand into.
const (
	GroupFirstControlPlane  = "control-plane-first"
	GroupOtherControlPlanes = "control-plane-rest"
	GroupWorkers            = "workers"
	GroupControlPlanes      = "control-planes"
)

// ErrNoOperation is returned for a spec with none of upgrade, renewCertificates, reconfigure,
// rotateCertificateAuthorities or custom set.
var ErrNoOperation = errors.New("exactly one of upgrade, renewCertificates, reconfigure, rotateCertificateAuthorities or custom must be set")

// Expand turns an operation spec into its ordered groups. Built-in operations are expanded as
// docs/design.md says; custom groups pass through (copied, with nodeFilter defaulted to All). The
// preflight group comes first when the operation runs one (withPreflight).
// A group's nil MaxUnavailable means the operation's.
func Expand(spec *v1alpha1.NodeOperationSpec) ([]v1alpha1.Group, error) {
	set := 0
	for _, b := range []bool{spec.Upgrade != nil, spec.RenewCertificates != nil, spec.Reconfigure != nil, spec.RotateCertificateAuthorities != nil, spec.Custom != nil} {
		if b {
			set++
		}
	}
	if set != 1 {
		return nil, ErrNoOperation
	}
	groups, err := expand(spec)
	if err != nil {
		return nil, err
	}
	return withPreflight(spec, groups)
}

// expand is Expand without the preflight group.
func expand(spec *v1alpha1.NodeOperationSpec) ([]v1alpha1.Group, error) {
	switch {
	case spec.Upgrade != nil:
		return expandUpgrade(spec.Upgrade)
	case spec.RenewCertificates != nil:
		return expandRenewCertificates(spec.RenewCertificates), nil
	case spec.Reconfigure != nil:
		return expandReconfigure(spec.Reconfigure)
	case spec.RotateCertificateAuthorities != nil:
		return expandRotation(spec.RotateCertificateAuthorities), nil
	}
	groups := make([]v1alpha1.Group, 0, len(spec.Custom.Groups))
	for i := range spec.Custom.Groups {
		g := *spec.Custom.Groups[i].DeepCopy()
		if g.NodeFilter == "" {
			g.NodeFilter = v1alpha1.NodeFilterAll
		}
		groups = append(groups, g)
	}
	return groups, nil
}

func controlPlanes() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: LabelControlPlane, Operator: metav1.LabelSelectorOpExists},
	}}
}

func workers() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: LabelControlPlane, Operator: metav1.LabelSelectorOpDoesNotExist},
	}}
}

func one() *intstr.IntOrString { v := intstr.FromInt32(1); return &v }

func expandUpgrade(u *v1alpha1.UpgradeOperation) ([]v1alpha1.Group, error) {
	binaries := u.UpgradeKubeletAndKubectl == nil || *u.UpgradeKubeletAndKubectl
	packages := u.PackageSource != "" && u.PackageSource != v1alpha1.PackageSourceBinaries
	if binaries && !packages && u.BinarySource == nil {
		return nil, fmt.Errorf("upgrade.binarySource is required when upgrade.upgradeKubeletAndKubectl is true and upgrade.packageSource is binaries")
	}
	// The commands carry the operation's consent to "all", or their tasks would be refused at admission.
	ignore, allowAll := append([]string(nil), u.IgnorePreflightErrors...), u.AllowIgnoreAllPreflightErrors
	// Named, as a task holds two of them: "install-kubeadm", "install-kubelet-kubectl".
	install := func(components ...string) v1alpha1.Command {
		name := "install-" + strings.Join(components, "-")
		if packages {
			// Held, so the node's own unattended upgrades cannot move it past the cluster's version.
			return v1alpha1.Command{Name: name, InstallPackages: &v1alpha1.InstallPackagesCommand{
				Packages: components, Version: u.KubernetesVersion, Manager: u.PackageSource, Hold: true, // apt, dnf and auto mean the same to both
				Repository: u.PackageRepository.DeepCopy()}}
		}
		return v1alpha1.Command{Name: name, InstallBinaries: &v1alpha1.InstallBinariesCommand{
			Components: components, Version: u.KubernetesVersion, Source: *u.BinarySource.DeepCopy()}}
	}
	// kubeadm upgrades a node with the new release's kubeadm, so it is replaced first on every node;
	// without a binary source (or packages) the nodes' kubeadm is taken to be the new one already.
	kubeadm := func() []v1alpha1.Command {
		if u.BinarySource == nil && !packages {
			return nil
		}
		return []v1alpha1.Command{install("kubeadm")}
	}
	// kubelet and kubectl are replaced only after kubeadm has upgraded the node's configuration,
	// then the kubelet restarts onto the new binary.
	kubelet := func() []v1alpha1.Command {
		if !binaries {
			return nil
		}
		return []v1alpha1.Command{install("kubelet", "kubectl"), {RestartService: &v1alpha1.RestartServiceCommand{Name: "kubelet"}}}
	}
	drain := &v1alpha1.DrainCommand{IgnoreDaemonSets: ptr.To(true)}
	if u.Drain != nil {
		drain = u.Drain.DeepCopy()
	}

	first := append(kubeadm(),
		v1alpha1.Command{KubeadmUpgradePlan: &v1alpha1.KubeadmUpgradePlanCommand{KubernetesVersion: u.KubernetesVersion, IgnorePreflightErrors: ignore, AllowIgnoreAllPreflightErrors: allowAll}},
		v1alpha1.Command{KubeadmUpgradeApply: &v1alpha1.KubeadmUpgradeApplyCommand{KubernetesVersion: u.KubernetesVersion, IgnorePreflightErrors: ignore, AllowIgnoreAllPreflightErrors: allowAll}})
	// A control plane is done only when it is healthy again at the new version (docs/design.md,
	// succeeded means served, rule 13): the next control plane, and the operation's success, wait for it.
	healthy := v1alpha1.Command{WaitNodeReady: &v1alpha1.WaitNodeReadyCommand{ControlPlane: &v1alpha1.ControlPlaneHealth{Version: u.KubernetesVersion}}}
	first = append(first, kubelet()...)
	first = append(first, healthy)
	rest := append(kubeadm(), v1alpha1.Command{KubeadmUpgradeNode: &v1alpha1.KubeadmUpgradeNodeCommand{IgnorePreflightErrors: ignore, AllowIgnoreAllPreflightErrors: allowAll}})
	rest = append(rest, kubelet()...)
	rest = append(rest, *healthy.DeepCopy())
	work := append(kubeadm(), v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}}, v1alpha1.Command{Drain: drain},
		v1alpha1.Command{KubeadmUpgradeNode: &v1alpha1.KubeadmUpgradeNodeCommand{IgnorePreflightErrors: ignore, AllowIgnoreAllPreflightErrors: allowAll}})
	work = append(work, kubelet()...)
	work = append(work, v1alpha1.Command{WaitNodeReady: &v1alpha1.WaitNodeReadyCommand{}}, v1alpha1.Command{Uncordon: &v1alpha1.UncordonCommand{}})

	return []v1alpha1.Group{
		{Name: GroupFirstControlPlane, NodeSelector: controlPlanes(), NodeFilter: v1alpha1.NodeFilterHead, MaxUnavailable: one(), Commands: first},
		{Name: GroupOtherControlPlanes, NodeSelector: controlPlanes(), NodeFilter: v1alpha1.NodeFilterTail, MaxUnavailable: one(), Commands: rest},
		{Name: GroupWorkers, NodeSelector: workers(), NodeFilter: v1alpha1.NodeFilterAll, Commands: work},
	}, nil
}

func expandRenewCertificates(r *v1alpha1.RenewCertificatesOperation) []v1alpha1.Group {
	return []v1alpha1.Group{{
		Name: GroupControlPlanes, NodeSelector: controlPlanes(), NodeFilter: v1alpha1.NodeFilterAll, MaxUnavailable: one(),
		Commands: []v1alpha1.Command{
			{KubeadmRenewCertificates: &v1alpha1.KubeadmRenewCertificatesCommand{Certificates: append([]string(nil), r.Certificates...)}},
			{RestartStaticPods: &v1alpha1.RestartStaticPodsCommand{}},
			// The restarted static pods Ready and the API server authorizing again (succeeded means served, rule 13).
			{WaitNodeReady: &v1alpha1.WaitNodeReadyCommand{ControlPlane: &v1alpha1.ControlPlaneHealth{}}},
		},
	}}
}
