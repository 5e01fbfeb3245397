package plan

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// The groups of a certificate authority rotation, phase by phase (docs/how-to/rotate-cas.md).
const (
	// Phase prepare: the new authorities made on the first control plane, then copied to the others
	// agent to agent (private keys never travel through the API, rule 15).
	GroupCAPrepareGenerate = "ca-prepare-generate"
	GroupCAPrepareCopy     = "ca-prepare-copy"
	// Phase trust-both: the old and the new authorities trusted wherever a bundle is accepted.
	GroupCATrustBothControlPlanes = "ca-trust-both-control-planes"
	GroupCATrustBothCluster       = "ca-trust-both-cluster"
	GroupCATrustBothWorkers       = "ca-trust-both-workers"
	// Phase re-issue: every certificate and kubeconfig issued again by the new authorities.
	GroupCAReissueControlPlanes = "ca-reissue-control-planes"
	GroupCAReissueWorkers       = "ca-reissue-workers"
	// Phase complete: the old authorities dropped everywhere.
	GroupCACompleteControlPlanes = "ca-complete-control-planes"
	GroupCACompleteWorkers       = "ca-complete-workers"
	GroupCACompleteCluster       = "ca-complete-cluster"
)

// The phases of a rotation, as docs/how-to/rotate-cas.md and a ClusterTarget's
// status.operations[].rotationPhase name them.
const (
	RotationPrepare   = "prepare"
	RotationTrustBoth = "trust-both"
	RotationReissue   = "re-issue"
	RotationComplete  = "complete"
)

// RotationPhaseOf is the phase a rotation's group belongs to, or "" for a group of no rotation.
func RotationPhaseOf(group string) string {
	switch group {
	case GroupCAPrepareGenerate, GroupCAPrepareCopy:
		return RotationPrepare
	case GroupCATrustBothControlPlanes, GroupCATrustBothCluster, GroupCATrustBothWorkers:
		return RotationTrustBoth
	case GroupCAReissueControlPlanes, GroupCAReissueWorkers:
		return RotationReissue
	case GroupCACompleteControlPlanes, GroupCACompleteWorkers, GroupCACompleteCluster:
		return RotationComplete
	}
	return ""
}

// GateCompleteRotation is the approval gate before phase complete of a rotation with completion
// Manual: `kubectl nodeops approve OP --gate complete-rotation` once the cluster has been checked.
const GateCompleteRotation = "complete-rotation"

// completionWait is how long the approval gate waits before the operation shows Blocked: a week, the
// longest a gate may wait, so a person has time to check the cluster on the new authorities.
const completionWait = 168 * time.Hour

// expandRotation is the rotation's four phases as groups. Control planes go one at a time in every
// group; workers go under the operation's maxUnavailable. Each control plane waits until its control
// plane serves again (succeeded means served, rule 13) and each worker until it is Ready.
func expandRotation(r *v1alpha1.RotateCertificateAuthoritiesOperation) []v1alpha1.Group {
	auth := append([]string(nil), r.Authorities...)
	sa := r.ServiceAccountKey
	trust := func(t v1alpha1.CATrust) v1alpha1.Command {
		return v1alpha1.Command{TrustCertificateAuthorities: &v1alpha1.TrustCertificateAuthoritiesCommand{
			Authorities: auth, ServiceAccountKey: sa, Trust: t}}
	}
	publish := func(t v1alpha1.CATrust) v1alpha1.Command {
		return v1alpha1.Command{PublishCertificateAuthorities: &v1alpha1.PublishCertificateAuthoritiesCommand{Authorities: auth, Trust: t}}
	}
	reissue := v1alpha1.Command{ReissueCertificates: &v1alpha1.ReissueCertificatesCommand{Authorities: auth, ServiceAccountKey: sa}}
	staticPods := v1alpha1.Command{RestartStaticPods: &v1alpha1.RestartStaticPodsCommand{}}
	kubelet := v1alpha1.Command{RestartService: &v1alpha1.RestartServiceCommand{Name: "kubelet"}}
	served := v1alpha1.Command{WaitNodeReady: &v1alpha1.WaitNodeReadyCommand{ControlPlane: &v1alpha1.ControlPlaneHealth{}}}
	ready := v1alpha1.Command{WaitNodeReady: &v1alpha1.WaitNodeReadyCommand{}}
	// Every group gets its own copies, so that no two groups share a pointer.
	cmds := func(cs ...v1alpha1.Command) v1alpha1.CommandList {
		out := make(v1alpha1.CommandList, len(cs))
		for i := range cs {
			out[i] = *cs[i].DeepCopy()
		}
		return out
	}
	cp := func(name string, filter v1alpha1.NodeFilter, cs ...v1alpha1.Command) v1alpha1.Group {
		return v1alpha1.Group{Name: name, NodeSelector: controlPlanes(), NodeFilter: filter, MaxUnavailable: one(), Commands: cmds(cs...)}
	}
	work := func(name string, cs ...v1alpha1.Command) v1alpha1.Group {
		return v1alpha1.Group{Name: name, NodeSelector: workers(), NodeFilter: v1alpha1.NodeFilterAll, Commands: cmds(cs...)}
	}

	completeCP := cp(GroupCACompleteControlPlanes, v1alpha1.NodeFilterAll, trust(v1alpha1.TrustNewOnly), staticPods, kubelet, served)
	if r.Completion != v1alpha1.CompletionAuto {
		completeCP.Gates = []v1alpha1.Gate{{Name: GateCompleteRotation, Timeout: &metav1.Duration{Duration: completionWait}, Approval: &v1alpha1.ApprovalGate{}}}
	}
	return []v1alpha1.Group{
		cp(GroupCAPrepareGenerate, v1alpha1.NodeFilterHead, v1alpha1.Command{GenerateCertificateAuthorities: &v1alpha1.GenerateCertificateAuthoritiesCommand{
			Authorities: auth, ServiceAccountKey: sa}}),
		cp(GroupCAPrepareCopy, v1alpha1.NodeFilterTail, v1alpha1.Command{CopyCertificateAuthorities: &v1alpha1.CopyCertificateAuthoritiesCommand{
			Authorities: auth, ServiceAccountKey: sa}}),
		// The controller-manager's --root-ca-file bundle updates every namespace's kube-root-ca.crt,
		// so pods (nodeops' own agents and manager among them) trust the new CA before anything
		// presents a certificate it issued.
		cp(GroupCATrustBothControlPlanes, v1alpha1.NodeFilterAll, trust(v1alpha1.TrustOldAndNew), staticPods, kubelet, served),
		cp(GroupCATrustBothCluster, v1alpha1.NodeFilterHead, publish(v1alpha1.TrustOldAndNew)),
		work(GroupCATrustBothWorkers, trust(v1alpha1.TrustOldAndNew), kubelet, ready),
		cp(GroupCAReissueControlPlanes, v1alpha1.NodeFilterAll, reissue, staticPods, kubelet, served),
		work(GroupCAReissueWorkers, reissue, kubelet, ready),
		completeCP,
		work(GroupCACompleteWorkers, trust(v1alpha1.TrustNewOnly), kubelet, ready),
		cp(GroupCACompleteCluster, v1alpha1.NodeFilterHead, publish(v1alpha1.TrustNewOnly)),
	}
}
