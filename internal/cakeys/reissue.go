package cakeys

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/big"
	"path"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// Phase re-issue. The new authorities replace the old in /etc/kubernetes/pki and every certificate
// they sign is issued again, the way `kubeadm certs renew` re-signs a certificate with the authority
// on disk (cmd/kubeadm/app/phases/certs/renewal, RenewUsingLocalCA): the same subject, SANs and
// extended key usages as the certificate it replaces (certToConfig), a new key of the same kind,
// NotBefore backdated five minutes, kubeadm's one-year validity. It is done here rather than by
// kubeadm because `certs renew` writes each kubeconfig's certificate-authority-data back to ca.crt
// alone (renewal/readwriter.go, kubeConfigReadWriter.Write), which would drop the old authority
// trust-both added while other control planes still serve certificates of the old; because it writes
// a key and its certificate as two plain writes (pkiutil.WriteCertAndKey), so a cut leaves a pair
// that does not match and a torn file it then cannot read; and because it has no dry run. `kubeadm
// init phase certs` refuses an existing certificate its authority did not sign (phases/certs/certs.go).

// LeafValidity is how long a re-issued certificate is valid: kubeadm's CertificateValidityPeriod
// (ClusterConfiguration certificateValidityPeriod's default), capped at its authority's expiry.
const LeafValidity = 365 * 24 * time.Hour

// backdate is kubeadm's CertificateBackdate: a little clock skew between nodes is tolerated.
const backdate = 5 * time.Minute

// JournalDirectory records, in the staging directory, each certificate re-issue issued (its key and
// certificate, one file 0600) before it is put in place, so a resumed run installs the same one again
// instead of issuing another (rule 16).
const JournalDirectory = v1alpha1.StagingDirectory + "/reissued"

// KubeletPKIDirectory is where the kubelet keeps its client certificate (kubelet-client-current.pem,
// certificate and key in one file, a symlink to the dated file the kubelet wrote last).
const KubeletPKIDirectory = "/var/lib/kubelet/pki"

// KubeletKubeconfig is the kubelet's kubeconfig, which names its client certificate.
const KubeletKubeconfig = "/etc/kubernetes/kubelet.conf"

// targetKind is how a certificate and its key are kept.
type targetKind int

const (
	// pairFiles: NAME.crt and NAME.key in /etc/kubernetes/pki.
	pairFiles targetKind = iota
	// kubeconfigData: client-certificate-data and client-key-data of a kubeconfig's current user.
	kubeconfigData
	// combinedPEM: certificate and key in one PEM file (the kubelet's kubelet-client-current.pem).
	combinedPEM
)

// Target is one certificate phase re-issue issues again.
type Target struct {
	// Name is the certificate's name in kubeadm's words (apiserver, etcd-server, admin.conf,
	// kubelet-client) and its journal entry's.
	Name string
	// Path is the certificate's file (the kubeconfig for kubeconfigData); KeyPath the key's, for pairFiles.
	Path, KeyPath string
	// Authority signs it.
	Authority string
	kind      targetKind
}

// leafPairs are the certificates kubeadm makes in /etc/kubernetes/pki, by the authority that signs
// them (certsphase.GetDefaultCertList).
var leafPairs = map[string][]struct{ name, base string }{
	v1alpha1.AuthorityCluster:    {{"apiserver", "apiserver"}, {"apiserver-kubelet-client", "apiserver-kubelet-client"}},
	v1alpha1.AuthorityFrontProxy: {{"front-proxy-client", "front-proxy-client"}},
	v1alpha1.AuthorityEtcd: {{"etcd-server", "etcd/server"}, {"etcd-peer", "etcd/peer"},
		{"etcd-healthcheck-client", "etcd/healthcheck-client"}, {"apiserver-etcd-client", "apiserver-etcd-client"}},
}

// kubeconfigTargets are the kubeconfigs with an embedded client certificate kubeadm renews
// (kubelet.conf is the kubelet's, handled by KubeletClientTarget).
var kubeconfigTargets = []string{
	"/etc/kubernetes/admin.conf", "/etc/kubernetes/super-admin.conf",
	"/etc/kubernetes/controller-manager.conf", "/etc/kubernetes/scheduler.conf",
}

// ReissueInput says which authorities replace the old on a control plane, and when.
type ReissueInput struct {
	Operation         string
	Authorities       []string
	ServiceAccountKey bool
	Now               time.Time
	// NodeName is the node's, which its kubelet's client certificate must name (system:node:NAME).
	NodeName string
}

// Step is one file phase re-issue changes (or would change), with its issuer before and after.
type Step struct {
	Path string
	// Before and After describe the certificate's issuer (or, for an authority, the authority) in words.
	Before, After string
	// State: "issue" (a new certificate), "install" (the journal's, issued by an interrupted run),
	// "replace" (an authority's file from the staging directory), "kept" (issued by the new
	// authority already).
	State string
	// Serial of the certificate the file holds after the step; empty for a key.
	Serial string
}

func (s Step) String() string {
	switch s.State {
	case "kept":
		return fmt.Sprintf("%s: kept, already issued by %s (serial %s)", s.Path, s.After, s.Serial)
	case "replace":
		return fmt.Sprintf("%s: %s; after: %s", s.Path, s.Before, s.After)
	}
	verb := "issued again"
	if s.State == "install" {
		verb = "installed as recorded by an interrupted run"
	}
	return fmt.Sprintf("%s: issued by %s; after: issued by %s, %s (serial %s)", s.Path, s.Before, s.After, verb, s.Serial)
}

// signer is one new authority: its certificate and key, from the staging directory.
type signer struct {
	name    string
	cert    *x509.Certificate
	certPEM []byte
	key     crypto.Signer
}

// loadSigners reads the new authorities asked for from the staging directory, each key checked
// against its certificate.
func loadSigners(files host.Files, authorities []string) (map[string]*signer, error) {
	want, err := Pairs(authorities, false)
	if err != nil {
		return nil, err
	}
	out := map[string]*signer{}
	for _, p := range want {
		if err := checkPair(files, p); err != nil {
			return nil, fmt.Errorf("the staged %s: %w", p.Name, err)
		}
		certPEM, err := files.ReadFile(staged(p.Cert))
		if err != nil {
			return nil, err
		}
		keyPEM, err := files.ReadFile(staged(p.Key))
		if err != nil {
			return nil, err
		}
		c, err := parseCert(certPEM)
		if err != nil {
			return nil, err
		}
		k, err := parseAnyKey(keyPEM)
		if err != nil {
			return nil, err
		}
		out[p.Name] = &signer{name: p.Name, cert: c, certPEM: certPEM, key: k}
	}
	return out, nil
}

// ControlPlaneTargets are the certificates on a control plane the authorities asked for sign, those
// that exist (a control plane joined later has no super-admin.conf, an external etcd no etcd
// certificates), in kubeadm's order.
func ControlPlaneTargets(files host.Files, authorities []string) ([]Target, error) {
	var out []Target
	for _, a := range v1alpha1.OrAllAuthorities(authorities) {
		for _, l := range leafPairs[a] {
			t := Target{Name: l.name, Path: pki(l.base + ".crt"), KeyPath: pki(l.base + ".key"), Authority: a, kind: pairFiles}
			if files.Exists(t.Path) || files.Exists(t.KeyPath) {
				out = append(out, t)
			}
		}
		if a != v1alpha1.AuthorityCluster {
			continue
		}
		for _, kc := range kubeconfigTargets {
			if files.Exists(kc) {
				out = append(out, Target{Name: path.Base(kc), Path: kc, Authority: a, kind: kubeconfigData})
			}
		}
		t, err := KubeletClientTarget(files)
		if err != nil {
			return nil, err
		}
		if t != nil {
			out = append(out, *t)
		}
	}
	return out, nil
}

// KubeletClientTarget is the kubelet's client certificate as kubelet.conf names it: the file
// kubelet-client-current.pem after kubeadm's kubelet-finalize (certificate and key in one file), or
// the kubeconfig's own data; nil when the node has no kubelet.conf.
func KubeletClientTarget(files host.Files) (*Target, error) {
	data, err := files.ReadFile(KubeletKubeconfig)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KubeletKubeconfig, err)
	}
	ai, err := currentAuthInfo(cfg, KubeletKubeconfig)
	if err != nil {
		return nil, err
	}
	t := &Target{Name: "kubelet-client", Authority: v1alpha1.AuthorityCluster}
	switch {
	case len(ai.ClientCertificateData) > 0:
		t.Path, t.kind = KubeletKubeconfig, kubeconfigData
	case ai.ClientCertificate != "" && (ai.ClientKey == "" || ai.ClientKey == ai.ClientCertificate):
		t.Path, t.kind = ai.ClientCertificate, combinedPEM
	case ai.ClientCertificate != "":
		t.Path, t.KeyPath, t.kind = ai.ClientCertificate, ai.ClientKey, pairFiles
	default:
		return nil, fmt.Errorf("%s names no client certificate", KubeletKubeconfig)
	}
	if !path.IsAbs(t.Path) || (t.KeyPath != "" && !path.IsAbs(t.KeyPath)) {
		return nil, fmt.Errorf("%s: the client certificate's path %q is not absolute", KubeletKubeconfig, t.Path)
	}
	return t, nil
}

func currentAuthInfo(cfg *clientcmdapi.Config, p string) (*clientcmdapi.AuthInfo, error) {
	ctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok {
		return nil, fmt.Errorf("%s: no current context %q", p, cfg.CurrentContext)
	}
	ai, ok := cfg.AuthInfos[ctx.AuthInfo]
	if !ok {
		return nil, fmt.Errorf("%s: no user %q", p, ctx.AuthInfo)
	}
	return ai, nil
}

func currentCluster(cfg *clientcmdapi.Config, p string) (*clientcmdapi.Cluster, error) {
	ctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok {
		return nil, fmt.Errorf("%s: no current context %q", p, cfg.CurrentContext)
	}
	c, ok := cfg.Clusters[ctx.Cluster]
	if !ok {
		return nil, fmt.Errorf("%s: no cluster %q", p, ctx.Cluster)
	}
	return c, nil
}

// ReadTarget is the certificate and key t holds now (the key nil when it is missing or torn).
func ReadTarget(files host.Files, t Target) (*x509.Certificate, crypto.Signer, error) {
	switch t.kind {
	case kubeconfigData:
		data, err := files.ReadFile(t.Path)
		if err != nil {
			return nil, nil, err
		}
		cfg, err := clientcmd.Load(data)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", t.Path, err)
		}
		ai, err := currentAuthInfo(cfg, t.Path)
		if err != nil {
			return nil, nil, err
		}
		c, err := parseCert(ai.ClientCertificateData)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", t.Path, err)
		}
		k, _ := parseAnyKey(ai.ClientKeyData)
		return c, k, nil
	case combinedPEM:
		data, err := files.ReadFile(t.Path)
		if err != nil {
			return nil, nil, err
		}
		c, err := firstCert(data)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", t.Path, err)
		}
		k, _ := parseAnyKey(data)
		return c, k, nil
	default:
		data, err := files.ReadFile(t.Path)
		if err != nil {
			return nil, nil, err
		}
		c, err := parseCert(data)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", t.Path, err)
		}
		var k crypto.Signer
		if kd, err := files.ReadFile(t.KeyPath); err == nil {
			k, _ = parseAnyKey(kd)
		}
		return c, k, nil
	}
}

// IssuedBy says whether c is signed by the authority ca and key is c's key: a certificate re-issue
// keeps.
func IssuedBy(c *x509.Certificate, key crypto.Signer, ca *x509.Certificate) bool {
	return c != nil && key != nil && c.CheckSignatureFrom(ca) == nil && keyOf(key, c.PublicKey)
}

// journalFile is t's journal entry: the issued certificate, then its key.
func journalFile(t Target) string { return path.Join(JournalDirectory, t.Name+".pem") }

// readJournal is the certificate and key recorded for t, signed by ca; ok false when there is none.
func readJournal(files host.Files, t Target, ca *x509.Certificate) (c *x509.Certificate, certPEM, keyPEM []byte, ok bool, err error) {
	data, err := files.ReadFile(journalFile(t))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil, false, nil
	}
	if err != nil {
		return nil, nil, nil, false, err
	}
	c, err = firstCert(data)
	if err != nil {
		return nil, nil, nil, false, fmt.Errorf("the journal's %s: %w", journalFile(t), err)
	}
	k, err := parseAnyKey(data)
	if err != nil || !IssuedBy(c, k, ca) {
		// An entry of another authority (a rotation before this one) or without its key is no record of this one.
		return nil, nil, nil, false, nil
	}
	certPEM, keyPEM = splitPEM(data)
	return c, certPEM, keyPEM, true, nil
}

// Reissue re-issues a control plane's certificates from the operation's new authorities (steps in
// this order): the new authorities' certificates and keys (and with ServiceAccountKey sa.key and
// sa.pub) replace the old in /etc/kubernetes/pki, key first, each old file kept in PreviousDirectory; then each certificate they sign is
// issued again, recorded in the journal before it is put in place, key before certificate. A
// certificate the new authority signed already is kept, and one the journal holds is installed, not
// issued again: a run cut anywhere and run again ends with the same certificates and issues none twice.
// The kubeconfigs keep the certificate-authority-data trust-both wrote (the old and the new cluster
// CA) until phase complete; it refuses a node where trust-both has not run. With dryRun it writes
// nothing and returns the steps it would take.
func Reissue(files host.Files, in ReissueInput, dryRun bool) ([]Step, error) {
	if got := Operation(files); got != in.Operation {
		return nil, fmt.Errorf("%s holds no authorities of operation %q (it holds %q): phase prepare has not run on this control plane", v1alpha1.StagingDirectory, in.Operation, got)
	}
	signers, err := loadSigners(files, in.Authorities)
	if err != nil {
		return nil, err
	}
	if err := trustsNew(files, signers); err != nil {
		return nil, err
	}
	if in.ServiceAccountKey {
		if err := verifiesNewServiceAccountKey(files); err != nil {
			return nil, err
		}
	}
	targets, err := ControlPlaneTargets(files, in.Authorities)
	if err != nil {
		return nil, err
	}
	if err := checkNodeName(files, targets, in.NodeName); err != nil {
		return nil, err
	}
	want, err := Pairs(in.Authorities, in.ServiceAccountKey)
	if err != nil {
		return nil, err
	}
	var steps []Step
	// 1. The authorities: the staged files replace the old, key first.
	for _, p := range want {
		for _, f := range []struct {
			rel  string
			mode fs.FileMode
		}{{p.Key, 0o600}, {p.Cert, 0o644}} {
			s, err := replaceAuthorityFile(files, p, f.rel, f.mode, dryRun)
			if err != nil {
				return nil, err
			}
			if s != nil {
				steps = append(steps, *s)
			}
		}
	}
	// 2. Every certificate they sign.
	for _, t := range targets {
		s, err := reissueOne(files, t, signers[t.Authority], in.Now, dryRun)
		if err != nil {
			return nil, err
		}
		steps = append(steps, s)
	}
	return steps, nil
}

// trustsNew fails unless phase trust-both has run on the node: every bundle it writes holds the new
// authority, and every kubeconfig re-issue touches trusts the new cluster CA, so that nothing on the
// node refuses a certificate the new authority issues.
func trustsNew(files host.Files, signers map[string]*signer) error {
	for name, s := range signers {
		b := trustBundles[name]
		data, err := files.ReadFile(pki(b.bundle))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if !bundleHolds(data, s.cert) {
			return fmt.Errorf("%s does not trust the new %s authority: phase trust-both (trustCertificateAuthorities OldAndNew) has not run on this node, and a certificate of the new authority would be refused", pki(b.bundle), name)
		}
	}
	if s, ok := signers[v1alpha1.AuthorityCluster]; ok {
		for _, kc := range append(slices.Clone(kubeconfigTargets), KubeletKubeconfig) {
			data, err := files.ReadFile(kc)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			cfg, err := clientcmd.Load(data)
			if err != nil {
				return fmt.Errorf("%s: %w", kc, err)
			}
			c, err := currentCluster(cfg, kc)
			if err != nil {
				return err
			}
			if c.CertificateAuthority == pki("ca-bundle.crt") {
				continue
			}
			if !bundleHolds(c.CertificateAuthorityData, s.cert) {
				return fmt.Errorf("%s does not trust the new cluster authority: phase trust-both has not run on this node", kc)
			}
		}
	}
	return nil
}

// verifiesNewServiceAccountKey fails unless the node's API server verifies service-account tokens
// with the new key and the one in use: re-issue replaces sa.key, and the API server restarted on it
// signs every token with the new key, which an API server verifying with the old sa.pub alone
// refuses (its own and every other control plane's). A node without an API server manifest passes.
func verifiesNewServiceAccountKey(files host.Files) error {
	p := host.Manifest(host.ManifestsDir, "kube-apiserver")
	if !files.Exists(p) {
		p = host.Manifest(host.MovedManifestsDir, "kube-apiserver")
	}
	manifest, err := files.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var verifying [][]byte
	var named []string
	for _, l := range strings.Split(string(manifest), "\n") {
		m := flagLine.FindStringSubmatch(l)
		if m == nil || m[2] != serviceAccountBundle.flags["kube-apiserver"][0] {
			continue
		}
		data, err := files.ReadFile(m[3])
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		named = append(named, m[3])
		verifying = append(verifying, data)
	}
	for _, key := range []struct{ what, path string }{
		{"the new key", staged(serviceAccountPair.Cert)}, {"the key in use", pki(serviceAccountPair.Cert)},
	} {
		data, err := files.ReadFile(key.path)
		if err != nil {
			return fmt.Errorf("the service-account key: %w", err)
		}
		blocks, err := pemBlocks(data, key.path)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(verifying, func(v []byte) bool { return holdsBlock(v, blocks[0]) }) {
			return fmt.Errorf("the API server verifies service-account tokens with --service-account-key-file %s, which lacks %s (%s): phase trust-both (trustCertificateAuthorities OldAndNew with serviceAccountKey) has not run on this node, and tokens signed by the new sa.key would be refused",
				listOr(named, "(none)"), key.what, key.path)
		}
	}
	return nil
}

// holdsBlock says whether the PEM data holds block b.
func holdsBlock(data []byte, b *pem.Block) bool {
	for rest := data; ; {
		var got *pem.Block
		got, rest = pem.Decode(rest)
		if got == nil {
			return false
		}
		if got.Type == b.Type && bytes.Equal(got.Bytes, b.Bytes) {
			return true
		}
	}
}

func bundleHolds(bundle []byte, ca *x509.Certificate) bool {
	for rest := bundle; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return false
		}
		if bytes.Equal(b.Bytes, ca.Raw) {
			return true
		}
	}
}

// checkNodeName refuses a kubelet client certificate that names another node: re-issue copies the
// subject, and must not hand this node another's identity.
func checkNodeName(files host.Files, targets []Target, node string) error {
	if node == "" {
		return nil
	}
	for _, t := range targets {
		if t.Name != "kubelet-client" {
			continue
		}
		c, _, err := ReadTarget(files, t)
		if err != nil {
			return nil // reissueOne says what is wrong with it
		}
		if want := "system:node:" + node; c.Subject.CommonName != want {
			return fmt.Errorf("%s: the kubelet's client certificate names %q, not %q", t.Path, c.Subject.CommonName, want)
		}
	}
	return nil
}

// replaceAuthorityFile puts the staged rel in place of /etc/kubernetes/pki's.
func replaceAuthorityFile(files host.Files, p Pair, rel string, mode fs.FileMode, dryRun bool) (*Step, error) {
	want, err := files.ReadFile(staged(rel))
	if err != nil {
		return nil, err
	}
	got, err := files.ReadFile(pki(rel))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if bytes.Equal(got, want) {
		return nil, nil
	}
	s := &Step{Path: pki(rel), State: "replace", Before: "the old " + p.Name + " " + keyOrCert(rel), After: "the new " + p.Name + " " + keyOrCert(rel) + " from " + staged(rel)}
	if rel == p.Cert {
		if olds := Trusted(got); len(olds) > 0 {
			s.Before = strings.Join(olds, ", ")
		}
		s.After = strings.Join(Trusted(want), ", ")
	}
	if dryRun {
		return s, nil
	}
	// The old file is kept first, once, so a person can still back out after re-issue
	// (docs/how-to/rotate-cas.md); a resumed run finds it kept and leaves it as it is.
	if got != nil && !files.Exists(previous(rel)) {
		if err := record(files, previous(rel), got); err != nil {
			return nil, err
		}
	}
	return s, files.WriteFileAtomic(pki(rel), want, mode)
}

// record writes a file holding a key into the staging directory: the file 0600 and every directory
// of the staging directory it is in 0700, on a worker too (where nothing else made them).
func record(files host.Files, p string, data []byte) error {
	if err := files.WriteFileAtomic(p, data, 0o600); err != nil {
		return err
	}
	for d := path.Dir(p); strings.HasPrefix(d, v1alpha1.StagingDirectory); d = path.Dir(d) {
		if err := files.Chmod(d, 0o700); err != nil {
			return err
		}
	}
	return nil
}

// PreviousDirectory keeps, in the staging directory, the old authorities' files re-issue replaced.
const PreviousDirectory = v1alpha1.StagingDirectory + "/previous"

func previous(rel string) string { return path.Join(PreviousDirectory, rel) }

func keyOrCert(rel string) string {
	switch {
	case strings.HasSuffix(rel, ".key"):
		return "private key"
	case strings.HasSuffix(rel, ".pub"):
		return "public key"
	}
	return "certificate"
}

// reissueOne keeps t when the new authority signed it already, else installs the journal's record of
// it, else issues it anew (recorded in the journal first) and installs that.
func reissueOne(files host.Files, t Target, s *signer, now time.Time, dryRun bool) (Step, error) {
	cur, key, err := ReadTarget(files, t)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		// A file that cannot be read (torn, not a certificate) is re-issued only from its journal record.
		cur = nil
	}
	if IssuedBy(cur, key, s.cert) {
		return Step{Path: t.Path, State: "kept", After: describeIssuer(s.cert), Serial: serial(cur)}, nil
	}
	step := Step{Path: t.Path, Before: "(unreadable)", After: describeIssuer(s.cert)}
	if cur != nil {
		step.Before = describeIssuerOf(cur, files)
	}
	jc, certPEM, keyPEM, ok, err := readJournal(files, t, s.cert)
	if err != nil {
		return Step{}, err
	}
	if ok {
		step.State, step.Serial = "install", serial(jc)
	} else {
		if cur == nil {
			return Step{}, fmt.Errorf("%s: cannot re-issue a certificate that is missing or cannot be read and that no run recorded in %s", t.Path, JournalDirectory)
		}
		step.State = "issue"
		if dryRun {
			step.Serial = "new"
			return step, nil
		}
		var c *x509.Certificate
		c, certPEM, keyPEM, err = issueLike(cur, key, s, now)
		if err != nil {
			return Step{}, fmt.Errorf("%s: %w", t.Path, err)
		}
		step.Serial = serial(c)
		// The record before the certificate is put in place (rule 16): a resumed run installs this one.
		if err := record(files, journalFile(t), append(append([]byte(nil), certPEM...), keyPEM...)); err != nil {
			return Step{}, err
		}
	}
	if dryRun {
		return step, nil
	}
	return step, install(files, t, certPEM, keyPEM)
}

// install writes an issued certificate and key where t keeps them: a key before its certificate, so
// that a certificate of the new authority is never beside a key that is not its own.
func install(files host.Files, t Target, certPEM, keyPEM []byte) error {
	switch t.kind {
	case kubeconfigData:
		data, err := files.ReadFile(t.Path)
		if err != nil {
			return err
		}
		cfg, err := clientcmd.Load(data)
		if err != nil {
			return fmt.Errorf("%s: %w", t.Path, err)
		}
		ai, err := currentAuthInfo(cfg, t.Path)
		if err != nil {
			return err
		}
		ai.ClientCertificateData, ai.ClientKeyData = certPEM, keyPEM
		out, err := clientcmd.Write(*cfg)
		if err != nil {
			return err
		}
		return files.WriteFileAtomic(t.Path, out, modeOf(files, t.Path, 0o600))
	case combinedPEM:
		return files.WriteFileAtomic(t.Path, append(append([]byte(nil), certPEM...), keyPEM...), 0o600)
	default:
		if err := files.WriteFileAtomic(t.KeyPath, keyPEM, 0o600); err != nil {
			return err
		}
		return files.WriteFileAtomic(t.Path, certPEM, modeOf(files, t.Path, 0o644))
	}
}

func modeOf(files host.Files, p string, otherwise fs.FileMode) fs.FileMode {
	if fi, err := files.Stat(p); err == nil {
		return fi.Mode().Perm()
	}
	return otherwise
}

// issueLike issues a certificate as `kubeadm certs renew` does from old: the same common name,
// organizations, DNS and IP SANs and extended key usages, a new key of old's kind and size, signed
// by s, valid from five minutes ago for LeafValidity but no longer than s.
func issueLike(old *x509.Certificate, oldKey crypto.Signer, s *signer, now time.Time) (*x509.Certificate, []byte, []byte, error) {
	key, keyPEM, err := newKeyLike(old, oldKey)
	if err != nil {
		return nil, nil, nil, err
	}
	sn, err := rand.Int(rand.Reader, big.NewInt(math.MaxInt64-1))
	if err != nil {
		return nil, nil, nil, err
	}
	notAfter := now.Add(LeafValidity).UTC()
	if notAfter.After(s.cert.NotAfter) {
		notAfter = s.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn.Add(sn, big.NewInt(1)),
		Subject:               pkix.Name{CommonName: old.Subject.CommonName, Organization: old.Subject.Organization},
		DNSNames:              old.DNSNames,
		IPAddresses:           old.IPAddresses,
		NotBefore:             now.Add(-backdate).UTC(),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageKeyEncipherment | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           old.ExtKeyUsage,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.cert, key.Public(), s.key)
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, err
	}
	return c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// newKeyLike makes a key of the kind of old's (RSA of its size, ECDSA on its curve), PEM-encoded as
// kubeadm and the kubelet write them.
func newKeyLike(old *x509.Certificate, oldKey crypto.Signer) (crypto.Signer, []byte, error) {
	pub := old.PublicKey
	if oldKey != nil {
		pub = oldKey.Public()
	}
	return newKeyOfKind(pub)
}

// newKeyOfKind makes a key of pub's kind (RSA of its size but at least keyBits, ECDSA on its
// curve); a nil or other pub gets kubeadm's default, RSA of keyBits.
func newKeyOfKind(pub crypto.PublicKey) (crypto.Signer, []byte, error) {
	switch p := pub.(type) {
	case *ecdsa.PublicKey:
		curve := p.Curve
		if curve == nil {
			curve = elliptic.P256()
		}
		k, err := ecdsa.GenerateKey(curve, rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, nil, err
		}
		return k, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
	default:
		bits := keyBits
		if r, ok := pub.(*rsa.PublicKey); ok && r.N.BitLen() >= keyBits {
			bits = r.N.BitLen()
		}
		k, err := rsa.GenerateKey(rand.Reader, bits)
		if err != nil {
			return nil, nil, err
		}
		return k, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), nil
	}
}

// parseAnyKey is the first private key in data: PKCS#1 RSA, SEC 1 EC or PKCS#8.
func parseAnyKey(data []byte) (crypto.Signer, error) {
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, errors.New("no PEM private key")
		}
		switch b.Type {
		case "RSA PRIVATE KEY":
			return x509.ParsePKCS1PrivateKey(b.Bytes)
		case "EC PRIVATE KEY":
			return x509.ParseECPrivateKey(b.Bytes)
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
			if err != nil {
				return nil, err
			}
			s, ok := k.(crypto.Signer)
			if !ok {
				return nil, errors.New("a PKCS#8 key that cannot sign")
			}
			return s, nil
		}
	}
}

func firstCert(data []byte) (*x509.Certificate, error) {
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, errors.New("no PEM certificate")
		}
		if b.Type == "CERTIFICATE" {
			return x509.ParseCertificate(b.Bytes)
		}
	}
}

// splitPEM is the certificates and the private key blocks of data, each re-encoded.
func splitPEM(data []byte) (certPEM, keyPEM []byte) {
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return certPEM, keyPEM
		}
		enc := pem.EncodeToMemory(b)
		if b.Type == "CERTIFICATE" {
			certPEM = append(certPEM, enc...)
		} else {
			keyPEM = append(keyPEM, enc...)
		}
	}
}

func serial(c *x509.Certificate) string {
	if c == nil {
		return ""
	}
	return c.SerialNumber.Text(16)
}

// describeIssuer names an authority for a person: its common name and the start of its fingerprint.
func describeIssuer(ca *x509.Certificate) string {
	sum := sha256.Sum256(ca.Raw)
	return fmt.Sprintf("CA %q (sha256 %s…, until %s)", ca.Subject.CommonName, hex.EncodeToString(sum[:6]), ca.NotAfter.UTC().Format("2006-01-02"))
}

// describeIssuerOf names c's issuer: the authority in /etc/kubernetes/pki or the staging directory
// that signed it when one did, its issuer's name otherwise.
func describeIssuerOf(c *x509.Certificate, files host.Files) string {
	for _, p := range []Pair{pairs[v1alpha1.AuthorityCluster], pairs[v1alpha1.AuthorityEtcd], pairs[v1alpha1.AuthorityFrontProxy]} {
		for _, f := range []string{pki(p.Cert), pki(trustBundles[p.Name].bundle), staged(p.Cert)} {
			data, err := files.ReadFile(f)
			if err != nil {
				continue
			}
			for rest := data; ; {
				var b *pem.Block
				b, rest = pem.Decode(rest)
				if b == nil {
					break
				}
				ca, err := x509.ParseCertificate(b.Bytes)
				if err == nil && c.CheckSignatureFrom(ca) == nil {
					return describeIssuer(ca)
				}
			}
		}
	}
	return fmt.Sprintf("%q (not an authority of this node)", c.Issuer.CommonName)
}
