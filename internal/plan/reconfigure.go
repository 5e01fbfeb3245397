package plan

import (
	"fmt"
	"net"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// expandReconfigure follows kubeadm's "Reconfiguring a kubeadm cluster": the first control plane
// patches kubeadm-config and kubelet-config once (the command's Succeeded record is what a resumed
// operation reads instead of patching again, rule 16), then regenerates its own files; the other
// control planes follow one at a time, each healthy at its new flags before the next starts (rule
// 13); workers only rewrite their kubelet's configuration, so they have a group only when the
// kubelet's configuration changes, and are drained only when the operation asks.
func expandReconfigure(r *v1alpha1.ReconfigureOperation) ([]v1alpha1.Group, error) {
	kubelet := r.KubeletConfiguration != ""
	if kubelet {
		if _, err := v1alpha1.KubeletPatch(r.KubeletConfiguration); err != nil {
			return nil, fmt.Errorf("reconfigure.%w", err)
		}
	}
	sans, err := certSANs(r.ClusterConfiguration)
	if err != nil {
		return nil, err
	}
	// certSANs change no manifest: a patch of them alone regenerates none.
	manifests := r.ClusterConfiguration != nil && changesManifests(r.ClusterConfiguration)
	node := func(controlPlane bool) v1alpha1.Command {
		return v1alpha1.Command{KubeadmReconfigureNode: &v1alpha1.KubeadmReconfigureNodeCommand{
			ControlPlane: controlPlane && manifests, Kubelet: kubelet,
			ClusterConfiguration: r.ClusterConfiguration.DeepCopy(), KubeletConfiguration: r.KubeletConfiguration}}
	}
	restart := func() []v1alpha1.Command {
		if !kubelet {
			return nil
		}
		return []v1alpha1.Command{{RestartService: &v1alpha1.RestartServiceCommand{Name: "kubelet"}}}
	}
	controlPlane := func(first bool) []v1alpha1.Command {
		var cmds []v1alpha1.Command
		if first {
			cmds = append(cmds, v1alpha1.Command{KubeadmUpdateConfig: &v1alpha1.KubeadmUpdateConfigCommand{
				ClusterConfiguration: r.ClusterConfiguration.DeepCopy(), KubeletConfiguration: r.KubeletConfiguration}})
		}
		if manifests || kubelet {
			cmds = append(cmds, node(true))
		}
		if len(sans) > 0 {
			// The API server serves the re-issued certificate once restarted, as after a renewal.
			cmds = append(cmds,
				v1alpha1.Command{KubeadmReissueAPIServerCertificate: &v1alpha1.KubeadmReissueAPIServerCertificateCommand{CertSANs: slices.Clone(sans)}},
				v1alpha1.Command{RestartStaticPods: &v1alpha1.RestartStaticPodsCommand{Components: []string{"kube-apiserver"}}})
		}
		cmds = append(cmds, restart()...)
		// Its components answer again, at their new flags, before the next control plane starts.
		return append(cmds, v1alpha1.Command{WaitNodeReady: &v1alpha1.WaitNodeReadyCommand{ControlPlane: &v1alpha1.ControlPlaneHealth{}}})
	}
	groups := []v1alpha1.Group{
		{Name: GroupFirstControlPlane, NodeSelector: controlPlanes(), NodeFilter: v1alpha1.NodeFilterHead, MaxUnavailable: one(), Commands: controlPlane(true)},
		{Name: GroupOtherControlPlanes, NodeSelector: controlPlanes(), NodeFilter: v1alpha1.NodeFilterTail, MaxUnavailable: one(), Commands: controlPlane(false)},
	}
	if !kubelet {
		return groups, nil
	}
	var work []v1alpha1.Command
	if r.Drain != nil {
		work = append(work, v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}}, v1alpha1.Command{Drain: r.Drain.DeepCopy()})
	}
	work = append(work, node(false))
	work = append(work, restart()...)
	work = append(work, v1alpha1.Command{WaitNodeReady: &v1alpha1.WaitNodeReadyCommand{}})
	if r.Drain != nil {
		work = append(work, v1alpha1.Command{Uncordon: &v1alpha1.UncordonCommand{}})
	}
	return append(groups, v1alpha1.Group{Name: GroupWorkers, NodeSelector: workers(), NodeFilter: v1alpha1.NodeFilterAll, Commands: work}), nil
}

// changesManifests says whether a patch changes what kubeadm writes into a static pod manifest:
// everything but certSANs does.
func changesManifests(p *v1alpha1.ClusterConfigurationPatch) bool {
	if p.APIServer != nil {
		c := p.APIServer.ControlPlaneComponentPatch
		if len(c.ExtraArgs) > 0 || len(c.RemoveExtraArgs) > 0 || len(c.ExtraVolumes) > 0 {
			return true
		}
	}
	return p.ControllerManager != nil || p.Scheduler != nil || p.Etcd != nil || len(p.FeatureGates) > 0
}

// certSANs are the patch's API server certificate names, each one kubeadm accepts (an IP address, a
// DNS name or a "*." wildcard; kubeadm's ValidateCertSANs): a name kubeadm refuses would be written to
// kubeadm-config first and then fail every later kubeadm run, upgrades included.
func certSANs(p *v1alpha1.ClusterConfigurationPatch) ([]string, error) {
	if p == nil || p.APIServer == nil {
		return nil, nil
	}
	for _, s := range p.APIServer.CertSANs {
		if net.ParseIP(s) != nil {
			continue
		}
		if len(validation.IsDNS1123Subdomain(s)) > 0 && len(validation.IsWildcardDNS1123Subdomain(s)) > 0 {
			return nil, fmt.Errorf("reconfigure.clusterConfiguration.apiServer.certSANs: %q is no IP address, DNS name or wildcard DNS name kubeadm accepts", s)
		}
	}
	return p.APIServer.CertSANs, nil
}
