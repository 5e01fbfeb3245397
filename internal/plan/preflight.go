package plan

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// GroupPreflight is the group every selected node passes before an operation's first task.
const GroupPreflight = "preflight"

// Free disk the preflight asks of a node that downloads binaries: three Kubernetes binaries, each
// kept beside its previous copy while replaced.
const preflightBinariesMiB = 512

// DefaultRuntimeSocket is containerd's socket, the runtime kubeadm uses by default.
const DefaultRuntimeSocket = "/run/containerd/containerd.sock"

// withPreflight puts the preflight group first when the operation asks for one (spec.preflight)
// or its commands need one; otherwise the groups are returned as they are, so an operation whose
// commands change nothing a preflight could foresee (a wait, a script) costs no extra task per node.
func withPreflight(spec *v1alpha1.NodeOperationSpec, groups []v1alpha1.Group) ([]v1alpha1.Group, error) {
	checks := PreflightChecks(spec, groups)
	if len(checks) == 0 {
		return groups, nil
	}
	for _, g := range groups {
		if g.Name == GroupPreflight {
			return nil, fmt.Errorf("group name %q is the preflight's, which this operation runs: rename the group", GroupPreflight)
		}
	}
	all := intstr.FromString("100%")
	pre := v1alpha1.Group{
		Name: GroupPreflight, NodeFilter: v1alpha1.NodeFilterAll, MaxUnavailable: &all,
		Commands: []v1alpha1.Command{{Name: GroupPreflight, Preflight: &v1alpha1.PreflightCommand{Checks: checks}}},
	}
	return append([]v1alpha1.Group{pre}, groups...), nil
}

// PreflightChecks are the checks the operation's preflight runs: those its commands imply, then
// spec.preflight's. Empty when the operation runs no preflight.
func PreflightChecks(spec *v1alpha1.NodeOperationSpec, groups []v1alpha1.Group) []v1alpha1.PreflightCheck {
	var out []v1alpha1.PreflightCheck
	add := func(c v1alpha1.PreflightCheck) {
		if !slices.ContainsFunc(out, func(o v1alpha1.PreflightCheck) bool { return equalCheck(&o, &c) }) {
			out = append(out, c)
		}
	}
	kubeadm, disk := false, false
	for _, g := range groups {
		for i := range g.Commands {
			c := &g.Commands[i]
			switch {
			case c.KubeadmUpgradeApply != nil, c.KubeadmUpgradePlan != nil, c.KubeadmUpgradeNode != nil, c.KubeadmRenewCertificates != nil,
				c.KubeadmUpdateConfig != nil, c.KubeadmReconfigureNode != nil, c.KubeadmReissueAPIServerCertificate != nil:
				kubeadm = true
			case c.InstallBinaries != nil:
				disk = true
				b := c.InstallBinaries
				// One check per source and version, asking for every component the operation downloads.
				if j := slices.IndexFunc(out, func(o v1alpha1.PreflightCheck) bool {
					return o.BinarySource != nil && o.BinarySource.Source.BaseURL == b.Source.BaseURL && o.BinarySource.Version == b.Version
				}); j >= 0 {
					for _, name := range b.Components {
						if !slices.Contains(out[j].BinarySource.Components, name) {
							out[j].BinarySource.Components = append(out[j].BinarySource.Components, name)
						}
					}
					continue
				}
				add(v1alpha1.PreflightCheck{BinarySource: &v1alpha1.BinarySourceCheck{
					Source: *b.Source.DeepCopy(), Version: b.Version, Components: append([]string(nil), b.Components...)}})
			case c.InstallPackages != nil:
				// Packages need room, and a package manager the node's OS family is known to use:
				// an unknown family fails here, before anything changes, never by a guess later.
				disk = true
				add(v1alpha1.PreflightCheck{PackageManager: &v1alpha1.PackageManagerCheck{Manager: c.InstallPackages.Manager}})
			case c.RestartService != nil:
				add(v1alpha1.PreflightCheck{InitSystem: &v1alpha1.EmptyCheck{}})
			}
		}
	}
	if kubeadm {
		// Without a binary source or packages the nodes' kubeadm is taken to be the target's already,
		// so it must be.
		check := &v1alpha1.KubeadmCheck{}
		if u := spec.Upgrade; u != nil && u.BinarySource == nil && (u.PackageSource == "" || u.PackageSource == v1alpha1.PackageSourceBinaries) {
			check.Version = u.KubernetesVersion
		}
		out = append([]v1alpha1.PreflightCheck{{Kubeadm: check}}, out...)
	}
	if disk {
		add(v1alpha1.PreflightCheck{MinFreeDiskMiB: preflightBinariesMiB})
	}
	if u := spec.Upgrade; u != nil {
		add(v1alpha1.PreflightCheck{RuntimeSocket: DefaultRuntimeSocket})
		add(v1alpha1.PreflightCheck{KubeletSkew: &v1alpha1.KubeletSkewCheck{KubernetesVersion: u.KubernetesVersion}})
	}
	if spec.Preflight != nil {
		for i := range spec.Preflight.Checks {
			add(*spec.Preflight.Checks[i].DeepCopy())
		}
		if len(out) == 0 {
			// An explicit preflight with no checks still proves every node's agent answers.
			out = append(out, v1alpha1.PreflightCheck{MinFreeDiskMiB: 1})
		}
	}
	return out
}

func equalCheck(a, b *v1alpha1.PreflightCheck) bool {
	return fmt.Sprintf("%+v", describeCheck(a)) == fmt.Sprintf("%+v", describeCheck(b))
}

// describeCheck flattens a check's pointers, for comparing two.
func describeCheck(c *v1alpha1.PreflightCheck) []any {
	out := []any{c.Binary, c.MinFreeDiskMiB, c.OSFamily, c.RuntimeSocket, c.InitSystem != nil, c.PackageManager != nil}
	if c.PackageManager != nil {
		out = append(out, "packages", c.PackageManager.Manager)
	}
	if c.Kubeadm != nil {
		out = append(out, "kubeadm", *c.Kubeadm)
	}
	if c.BinarySource != nil {
		out = append(out, "source", c.BinarySource.Source.BaseURL, c.BinarySource.Version, c.BinarySource.Components)
	}
	if c.KubeletSkew != nil {
		out = append(out, "skew", *c.KubeletSkew)
	}
	return out
}
