package v1alpha1

import (
	"strings"
	"time"
)

// The certificate authorities a rotation replaces, by the names kubeadm gives them; their files
// under /etc/kubernetes/pki are ca.crt and ca.key, etcd/ca.crt and etcd/ca.key, front-proxy-ca.crt
// and front-proxy-ca.key.
const (
	AuthorityCluster    = "cluster"
	AuthorityEtcd       = "etcd"
	AuthorityFrontProxy = "front-proxy"
)

// Authorities are every authority a rotation may replace, in the order kubeadm makes them.
var Authorities = []string{AuthorityCluster, AuthorityEtcd, AuthorityFrontProxy}

// OrAllAuthorities is the authorities listed, or all of them when none is.
func OrAllAuthorities(authorities []string) []string {
	if len(authorities) == 0 {
		return append([]string(nil), Authorities...)
	}
	return append([]string(nil), authorities...)
}

// RotationCompletion says who decides that a rotation drops the old authorities.
// +kubebuilder:validation:Enum=Auto;Manual
type RotationCompletion string

const (
	// CompletionManual waits before phase complete until a person approves it.
	CompletionManual RotationCompletion = "Manual"
	// CompletionAuto drops the old authorities as soon as every certificate is re-issued.
	CompletionAuto RotationCompletion = "Auto"
)

// RotateCertificateAuthoritiesOperation replaces the cluster's certificate authorities (and, with
// serviceAccountKey, the service-account signing key) in four phases, each a set of groups that run
// control planes one at a time and workers under maxUnavailable: prepare (the new authorities made on
// the first control plane and copied to the others by their agents: the keys never travel through
// the API), trust-both (old and new trusted everywhere), re-issue (every certificate and kubeconfig
// from the new authorities) and complete (the old authorities dropped), after a person's approval
// (completion Manual) or at once (Auto). See docs/how-to/rotate-cas.md.
type RotateCertificateAuthoritiesOperation struct {
	// Authorities to replace: cluster, etcd, front-proxy; all three when empty.
	// +optional
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:Enum=cluster;etcd;front-proxy
	// +listType=set
	Authorities []string `json:"authorities,omitempty"`
	// ServiceAccountKey also replaces the service-account signing key (sa.key, sa.pub): the API server
	// verifies tokens signed by either key until phase complete, and signs with the new one from
	// re-issue on.
	// +optional
	ServiceAccountKey bool `json:"serviceAccountKey,omitempty"`
	// Completion: Manual (the default) holds phase complete at an approval gate until a person has
	// checked the cluster; Auto completes at once.
	// +optional
	// +kubebuilder:default=Manual
	Completion RotationCompletion `json:"completion,omitempty"`
}

// ClusterCertificateAuthorities says when the ClusterTarget rotates the cluster's certificate
// authorities, and how each rotation it generates runs: the inlined fields are a NodeOperation's
// rotateCertificateAuthorities, passed to every rotation generated.
type ClusterCertificateAuthorities struct {
	// RotationCount rotates the certificate authorities once each time it is raised (a raise by more
	// than one at once rotates once); it can only go up. The rotation generated is a
	// rotateCertificateAuthorities NodeOperation; status.lastCertificateAuthorityRotationCount is the
	// count acted on. While a rotation is unfinished nothing else is generated, and a rotation waits
	// for any upgrade, reconfigure or renewal running (docs/how-to/rotate-cas.md).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="rotationCount can only go up: raise it to rotate the certificate authorities once more"
	RotationCount int32 `json:"rotationCount,omitempty"`
	// How each generated rotation runs: which authorities, whether the service-account key too,
	// and completion Manual (the default: phase complete waits for `kubectl nodeops approve OP
	// --gate complete-rotation`) or Auto.
	RotateCertificateAuthoritiesOperation `json:",inline"`
}

// StagingDirectory is where a rotation keeps the new authorities on each control plane until they
// replace the old ones: beside /etc/kubernetes/pki, with the same layout (ca.crt, ca.key, etcd/ca.crt,
// ..., sa.key, sa.pub), the directories 0700 and the keys 0600.
const StagingDirectory = "/etc/kubernetes/pki-rotation"

// GenerateCertificateAuthoritiesCommand makes the rotation's new authorities on this control plane,
// in StagingDirectory, keys and all, and serves them to the other control planes' agents of the same
// operation (copyCertificateAuthorities); no key ever goes through the API (rule 15). A staging
// directory already holding this operation's complete set is kept, so a re-run makes nothing twice.
type GenerateCertificateAuthoritiesCommand struct {
	// Authorities to make: cluster, etcd, front-proxy; all three when empty.
	// +optional
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:Enum=cluster;etcd;front-proxy
	// +listType=set
	Authorities []string `json:"authorities,omitempty"`
	// ServiceAccountKey also makes a new service-account signing key pair.
	// +optional
	ServiceAccountKey bool `json:"serviceAccountKey,omitempty"`
}

func (*GenerateCertificateAuthoritiesCommand) KindName() string {
	return "generateCertificateAuthorities"
}

func (*GenerateCertificateAuthoritiesCommand) IsIdempotent() bool { return true }

func (c *GenerateCertificateAuthoritiesCommand) Description() string {
	return "generate new " + authorityText(c.Authorities, c.ServiceAccountKey) + " in " + StagingDirectory +
		" and serve them to the other control planes' agents"
}

func (*GenerateCertificateAuthoritiesCommand) DefaultTimeout() time.Duration { return 2 * time.Minute }

// Effects: it writes only the staging directory, which nothing on the node reads yet; it counts as
// disruptive as every command that writes the host does.
func (*GenerateCertificateAuthoritiesCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive}
}

// CopyCertificateAuthoritiesCommand fetches the rotation's new authorities from the agent of the
// control plane that generated them (its task in the same operation publishes the address and
// certificate fingerprint of the agent's server in status.certificateAuthorityServer) into this
// control plane's StagingDirectory. The receiving agent proves itself with its ServiceAccount token,
// which the serving agent reviews (TokenReview) and checks against the operation's tasks.
type CopyCertificateAuthoritiesCommand struct {
	// Authorities to copy: cluster, etcd, front-proxy; all three when empty.
	// +optional
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:Enum=cluster;etcd;front-proxy
	// +listType=set
	Authorities []string `json:"authorities,omitempty"`
	// ServiceAccountKey also copies the new service-account signing key pair.
	// +optional
	ServiceAccountKey bool `json:"serviceAccountKey,omitempty"`
}

func (*CopyCertificateAuthoritiesCommand) KindName() string { return "copyCertificateAuthorities" }

func (*CopyCertificateAuthoritiesCommand) IsIdempotent() bool { return true }

func (c *CopyCertificateAuthoritiesCommand) Description() string {
	return "copy the new " + authorityText(c.Authorities, c.ServiceAccountKey) +
		" from the generating control plane's agent into " + StagingDirectory
}

func (*CopyCertificateAuthoritiesCommand) DefaultTimeout() time.Duration { return 2 * time.Minute }

func (*CopyCertificateAuthoritiesCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive}
}

// CATrust is which authorities a node trusts during a rotation.
// +kubebuilder:validation:Enum=OldAndNew;NewOnly
type CATrust string

const (
	// TrustOldAndNew: every bundle holds the old and the new authority (phase trust-both).
	TrustOldAndNew CATrust = "OldAndNew"
	// TrustNewOnly: every bundle holds the new authority alone (phase complete).
	TrustNewOnly CATrust = "NewOnly"
)

// TrustCertificateAuthoritiesCommand rewrites what the node trusts. With trust OldAndNew (phase
// trust-both), on a control plane (which holds the operation's staged authorities): a bundle of the old
// and the new beside each old file in /etc/kubernetes/pki (ca-bundle.crt, etcd/ca-bundle.crt,
// front-proxy-ca-bundle.crt, and with serviceAccountKey sa-bundle.pub), the flags that accept a bundle
// pointed at it (the API server's --client-ca-file, --kubelet-certificate-authority,
// --requestheader-client-ca-file, --etcd-cafile and --service-account-key-file, the controller-manager's
// --root-ca-file and --requestheader-client-ca-file, etcd's --trusted-ca-file and
// --peer-trusted-ca-file), every kubeconfig's certificate-authority-data and the kubelet's clientCAFile;
// the old files and the flags that cannot take a bundle (the controller-manager's --client-ca-file and
// --cluster-signing-cert-file, kubeadm issue 1350, and the signing keys) are left alone. On a worker
// the kubelet's clientCAFile and kubelet.conf, with the new cluster CA the controller-managers publish
// in kube-root-ca.crt. With trust NewOnly (phase complete, once phase re-issue put the new authorities in
// /etc/kubernetes/pki) the reverse: every flag and the kubelet name the single (now new) files again,
// every kubeconfig trusts the new cluster authority alone, the bundles and the staging directory are
// removed; on a worker ca.crt, kubelet.conf and the kubelet's clientCAFile trust the new cluster
// authority alone once kube-root-ca.crt publishes it alone. NewOnly refuses a node where a certificate
// it needs (a leaf, a kubeconfig's or the kubelet's client certificate) is not the new authority's. In
// a DryRun it lists every file it would change with what it trusts before and after.
type TrustCertificateAuthoritiesCommand struct {
	// +optional
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:Enum=cluster;etcd;front-proxy
	// +listType=set
	Authorities []string `json:"authorities,omitempty"`
	// +optional
	ServiceAccountKey bool `json:"serviceAccountKey,omitempty"`
	// Trust is OldAndNew (phase trust-both) or NewOnly (phase complete).
	Trust CATrust `json:"trust"`
}

func (*TrustCertificateAuthoritiesCommand) KindName() string { return "trustCertificateAuthorities" }

// Writing the same bundles again leaves them as they are.
func (*TrustCertificateAuthoritiesCommand) IsIdempotent() bool { return true }

func (c *TrustCertificateAuthoritiesCommand) Description() string {
	what := "the old and the new"
	if c.Trust == TrustNewOnly {
		what = "only the new"
	}
	return "trust " + what + " " + authorityText(c.Authorities, c.ServiceAccountKey) +
		" in every bundle, kubeconfig and kubelet configuration on the node"
}

func (*TrustCertificateAuthoritiesCommand) DefaultTimeout() time.Duration { return 5 * time.Minute }

func (*TrustCertificateAuthoritiesCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive}
}

// PublishCertificateAuthoritiesCommand makes the cluster-wide changes of a rotation, each once and
// recorded (rule 16), on a control plane with the host's /etc/kubernetes/admin.conf (as kubeadm would
// from it; the agent's own ServiceAccount stays confined to its node, rule 10): the cluster-info
// ConfigMap's certificate-authority-data in kube-public becomes the old and the new cluster CA
// (OldAndNew) or the new alone (NewOnly); it waits until every namespace's kube-root-ca.crt and every
// legacy service-account token Secret's ca.crt hold exactly that (the controller-managers write both
// from their --root-ca-file); then it restarts the in-cluster clients that read the CA once (kube-proxy
// and CoreDNS in kube-system, when present), each restart carrying its record so a resumed run restarts
// none twice, and waits for their rollouts. In a DryRun it shows what would change and changes nothing.
type PublishCertificateAuthoritiesCommand struct {
	// +optional
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:Enum=cluster;etcd;front-proxy
	// +listType=set
	Authorities []string `json:"authorities,omitempty"`
	// Trust is OldAndNew (phase trust-both) or NewOnly (phase complete).
	Trust CATrust `json:"trust"`
}

func (*PublishCertificateAuthoritiesCommand) KindName() string {
	return "publishCertificateAuthorities"
}

func (*PublishCertificateAuthoritiesCommand) IsIdempotent() bool { return true }

func (c *PublishCertificateAuthoritiesCommand) Description() string {
	what := "the old and the new"
	if c.Trust == TrustNewOnly {
		what = "only the new"
	}
	return "publish " + what + " cluster CA in cluster-info, wait for every kube-root-ca.crt and token Secret to hold it, then restart kube-proxy and CoreDNS"
}

func (*PublishCertificateAuthoritiesCommand) DefaultTimeout() time.Duration { return 10 * time.Minute }

func (*PublishCertificateAuthoritiesCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive}
}

// ReissueCertificatesCommand (phase re-issue) issues the node's certificates again from the new
// authorities. On a control plane (which holds the operation's staged authorities, and must trust
// them already: phase trust-both) the staged CA certificates and keys (and with serviceAccountKey
// sa.key and sa.pub) replace the old in /etc/kubernetes/pki, then every certificate kubeadm made
// (apiserver, apiserver-kubelet-client, front-proxy-client, the etcd ones, apiserver-etcd-client),
// the client certificates of admin.conf, super-admin.conf, controller-manager.conf and scheduler.conf
// and the kubelet's client certificate are issued again as `kubeadm certs renew` would (same subject,
// SANs and usages, a new key); the kubeconfigs keep trusting the old and the new CA. On a worker the
// kubelet's client certificate is asked of the cluster with the kubelet's own credentials (a
// CertificateSigningRequest the controller-manager signs with the new ca.crt). Each certificate is
// recorded on the node before it is put in place, so a resumed run issues none twice; a certificate
// the new authority issued already is kept. In a DryRun it lists every file it would change with its
// old and new issuer.
type ReissueCertificatesCommand struct {
	// +optional
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:Enum=cluster;etcd;front-proxy
	// +listType=set
	Authorities []string `json:"authorities,omitempty"`
	// +optional
	ServiceAccountKey bool `json:"serviceAccountKey,omitempty"`
}

func (*ReissueCertificatesCommand) KindName() string { return "reissueCertificates" }

// A re-run keeps what the new authorities issued and installs what an interrupted run recorded, so
// it issues no certificate twice.
func (*ReissueCertificatesCommand) IsIdempotent() bool { return true }

func (c *ReissueCertificatesCommand) Description() string {
	return "re-issue the node's certificates and kubeconfigs from the new " + authorityText(c.Authorities, c.ServiceAccountKey)
}

func (*ReissueCertificatesCommand) DefaultTimeout() time.Duration { return 10 * time.Minute }

func (*ReissueCertificatesCommand) Effects() CommandEffects {
	return CommandEffects{Disruption: Disruptive}
}

// authorityText names the authorities (all when none) and the service-account key, for descriptions.
func authorityText(authorities []string, serviceAccountKey bool) string {
	s := strings.Join(OrAllAuthorities(authorities), ", ") + " CAs"
	if serviceAccountKey {
		s += " and service-account key"
	}
	return s
}
