package cakeys

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strings"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// PKIDirectory is where kubeadm keeps a node's certificates (ClusterConfiguration certificatesDir's default).
const PKIDirectory = "/etc/kubernetes/pki"

// KubeletConfigFile is the kubelet's configuration file on a kubeadm node.
const KubeletConfigFile = "/var/lib/kubelet/config.yaml"

// Kubeconfigs are the kubeconfigs kubeadm writes on a node (a worker has kubelet.conf only).
var Kubeconfigs = []string{
	"/etc/kubernetes/admin.conf", "/etc/kubernetes/super-admin.conf", "/etc/kubernetes/controller-manager.conf",
	"/etc/kubernetes/scheduler.conf", "/etc/kubernetes/kubelet.conf",
}

// trustBundle is what phase trust-both adds beside one authority's file in /etc/kubernetes/pki: a
// bundle of the old and the new, which the flags that accept a bundle are pointed at. The old file is
// never changed in this phase, so the flags that cannot take a bundle (the controller-manager's
// --client-ca-file and --cluster-signing-cert-file, kubeadm issue 1350; --service-account-signing-key-file)
// keep the old authority, and so does kubeadm, which reads it.
type trustBundle struct {
	name   string
	old    string // relative to PKIDirectory and to the staging directory
	bundle string
	// flags that accept a bundle, by static pod; each is rewritten only when it names the old file.
	flags map[string][]string
}

var trustBundles = map[string]trustBundle{
	v1alpha1.AuthorityCluster: {name: v1alpha1.AuthorityCluster, old: "ca.crt", bundle: "ca-bundle.crt", flags: map[string][]string{
		"kube-apiserver":          {"client-ca-file", "kubelet-certificate-authority"},
		"kube-controller-manager": {"root-ca-file"},
		"kube-scheduler":          {"client-ca-file"},
	}},
	v1alpha1.AuthorityEtcd: {name: v1alpha1.AuthorityEtcd, old: "etcd/ca.crt", bundle: "etcd/ca-bundle.crt", flags: map[string][]string{
		"kube-apiserver": {"etcd-cafile"},
		"etcd":           {"trusted-ca-file", "peer-trusted-ca-file"},
	}},
	v1alpha1.AuthorityFrontProxy: {name: v1alpha1.AuthorityFrontProxy, old: "front-proxy-ca.crt", bundle: "front-proxy-ca-bundle.crt", flags: map[string][]string{
		"kube-apiserver":          {"requestheader-client-ca-file"},
		"kube-controller-manager": {"requestheader-client-ca-file"},
		"kube-scheduler":          {"requestheader-client-ca-file"},
	}},
}

// The service-account key: the API server verifies tokens with every public key in its
// --service-account-key-file, so a file of both keys lets it accept tokens signed by either while it
// still signs with the old key (--service-account-signing-key-file is left alone).
var serviceAccountBundle = trustBundle{name: "service-account", old: "sa.pub", bundle: "sa-bundle.pub", flags: map[string][]string{
	"kube-apiserver": {"service-account-key-file"},
}}

// what names the bundle's authority, or the service-account key, in a sentence.
func (b trustBundle) what() string {
	if b.name == serviceAccountBundle.name {
		return "service-account key"
	}
	return b.name + " authority"
}

// StaticPodComponents are the control plane's static pods whose flags trust-both rewrites.
var StaticPodComponents = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

func pki(rel string) string { return path.Join(PKIDirectory, rel) }

// Change is one file trust-both writes, with the authorities it trusts before and after, in words.
type Change struct {
	Path          string
	Before, After []string
}

func (c Change) String() string {
	return fmt.Sprintf("%s: trusts %s; after: %s", c.Path, listOr(c.Before, "nothing"), listOr(c.After, "nothing"))
}

func listOr(s []string, none string) string {
	if len(s) == 0 {
		return none
	}
	return strings.Join(s, ", ")
}

// TrustInput says which authorities a node trusts old and new in phase trust-both.
type TrustInput struct {
	Operation   string
	Authorities []string
	// ServiceAccountKey: the API server verifies with both service-account public keys.
	ServiceAccountKey bool
	// NewClusterCA, on a node without the staging directory (a worker), is the PEM of the cluster
	// authorities the cluster publishes (kube-root-ca.crt): it must hold every authority the node
	// trusts today, and the others in it are the new ones. Unused where the staging directory is.
	NewClusterCA []byte
}

// IsControlPlane says whether the node holds operation's staged authorities, which makes it a
// control plane of the rotation; a node with another operation's staging directory is an error.
func IsControlPlane(files host.Files, operation string) (bool, error) {
	switch got := Operation(files); got {
	case operation:
		return true, nil
	case "":
		for _, c := range StaticPodComponents {
			if files.Exists(host.Manifest(host.ManifestsDir, c)) || files.Exists(host.Manifest(host.MovedManifestsDir, c)) {
				return false, fmt.Errorf("this node runs static pod %s but holds no authorities of operation %s in %s: phase prepare (copyCertificateAuthorities) has not run on it", c, operation, v1alpha1.StagingDirectory)
			}
		}
		return false, nil
	default:
		return false, fmt.Errorf("%s holds the authorities of operation %q, not %q", v1alpha1.StagingDirectory, got, operation)
	}
}

// TrustBoth makes the node trust the old and the new authorities wherever a bundle is accepted,
// and never drops the old: the bundles are new files beside the old ones (written first, read by
// nothing yet); then every kubeconfig's certificate-authority-data becomes old plus new; then the
// kubelet's clientCAFile and the static pods' flags are pointed at the bundles (last, since the
// kubelet restarts a static pod whose manifest changes). Every write is atomic and each one leaves the
// old authority trusted, so an interruption anywhere leaves a node that trusts at least the old, and a
// re-run computes the same files again. It returns the files it changed (unchanged ones are left alone).
func TrustBoth(files host.Files, in TrustInput) ([]Change, error) {
	cp, err := IsControlPlane(files, in.Operation)
	if err != nil {
		return nil, err
	}
	want, err := Pairs(in.Authorities, in.ServiceAccountKey)
	if err != nil {
		return nil, err
	}
	var bundles []trustBundle
	newPEM := map[string][]byte{} // bundle name -> the new authority's (or key's) PEM
	for _, p := range want {
		b := serviceAccountBundle
		if p.CommonName != "" {
			b = trustBundles[p.Name]
		}
		switch {
		case cp:
			if err := checkPair(files, p); err != nil {
				return nil, fmt.Errorf("the staged %s: %w", p.Name, err)
			}
			data, err := files.ReadFile(staged(p.Cert))
			if err != nil {
				return nil, err
			}
			newPEM[b.name] = data
		case p.Name == v1alpha1.AuthorityCluster:
			// A worker trusts the cluster authority only (its kubelet's clients and its API server).
			newPEM[b.name] = in.NewClusterCA
		default:
			continue
		}
		bundles = append(bundles, b)
	}

	var changes []Change
	// 1. The bundle files, which nothing reads until step 3.
	bundlePEM := map[string][]byte{}
	for _, b := range bundles {
		old, err := files.ReadFile(pki(b.old))
		if err != nil {
			return nil, fmt.Errorf("the %s authority in use: %w", b.name, err)
		}
		merged, err := mergeTrust(b, old, newPEM[b.name], cp)
		if err != nil {
			return nil, err
		}
		bundlePEM[b.name] = merged
		c, err := writeIfChanged(files, pki(b.bundle), merged, 0o644)
		if err != nil {
			return nil, err
		}
		if c != nil {
			changes = append(changes, *c)
		}
	}
	// 2. Every kubeconfig that trusts the old cluster authority also trusts the new.
	if merged, ok := bundlePEM[v1alpha1.AuthorityCluster]; ok {
		for _, kc := range Kubeconfigs {
			c, err := trustInKubeconfig(files, kc, merged)
			if err != nil {
				return nil, err
			}
			if c != nil {
				changes = append(changes, *c)
			}
		}
	}
	// 3. The files that point the components at the bundles.
	for _, b := range bundles {
		if b.name == v1alpha1.AuthorityCluster {
			c, err := pointLine(files, KubeletConfigFile, clientCAFileLine, pki(b.old), pki(b.bundle), bundlePEM[b.name])
			if err != nil {
				return nil, err
			}
			if c != nil {
				changes = append(changes, *c)
			}
		}
	}
	if cp {
		for _, comp := range StaticPodComponents {
			c, err := pointFlags(files, comp, bundles, bundlePEM)
			if err != nil {
				return nil, err
			}
			if c != nil {
				changes = append(changes, *c)
			}
		}
	}
	return changes, nil
}

// ErrNoNewAuthority: a worker found no new authority in what the cluster publishes yet.
var ErrNoNewAuthority = errors.New("no new authority published yet")

// mergeTrust is the bundle of the authorities in old followed by those of add not in it yet. On a
// worker (fromCluster), add is what the cluster publishes: it must hold every authority old holds,
// or it is not the bundle of this cluster's rotation, and it must bring at least one new authority.
func mergeTrust(b trustBundle, old, add []byte, controlPlane bool) ([]byte, error) {
	oldBlocks, err := pemBlocks(old, b.name+" in use")
	if err != nil {
		return nil, err
	}
	addBlocks, err := pemBlocks(add, "new "+b.name)
	if err != nil {
		return nil, err
	}
	out := append([]*pem.Block(nil), oldBlocks...)
	fresh := 0
	for _, a := range addBlocks {
		if !slices.ContainsFunc(out, func(o *pem.Block) bool { return bytes.Equal(o.Bytes, a.Bytes) }) {
			out = append(out, a)
			fresh++
		}
	}
	if !controlPlane {
		for _, o := range oldBlocks {
			if !slices.ContainsFunc(addBlocks, func(a *pem.Block) bool { return bytes.Equal(o.Bytes, a.Bytes) }) {
				return nil, fmt.Errorf("the cluster's published CA bundle (kube-root-ca.crt) lacks the %s authority this node trusts (%s): it is not this cluster's rotation bundle, or the controller-manager does not publish it yet", b.name, describeBlock(o))
			}
		}
		if fresh == 0 {
			return nil, fmt.Errorf("%w: the cluster's published CA bundle (kube-root-ca.crt) holds only the %s authority this node trusts; the controller-manager publishes the new one once the control planes trust both (group ca-trust-both-control-planes)", ErrNoNewAuthority, b.name)
		}
	}
	var buf bytes.Buffer
	for _, blk := range out {
		if err := pem.Encode(&buf, blk); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

// pemBlocks are the certificates (or public keys) in data; a CERTIFICATE must be a CA's.
func pemBlocks(data []byte, what string) ([]*pem.Block, error) {
	var out []*pem.Block
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		switch b.Type {
		case "CERTIFICATE":
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
			if !c.IsCA {
				return nil, fmt.Errorf("%s: %s is no CA certificate", what, c.Subject)
			}
		case "PUBLIC KEY":
			if _, err := x509.ParsePKIXPublicKey(b.Bytes); err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
		default:
			return nil, fmt.Errorf("%s: a PEM block of type %q, where a certificate or public key belongs", what, b.Type)
		}
		out = append(out, &pem.Block{Type: b.Type, Bytes: b.Bytes})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no PEM certificate or public key", what)
	}
	return out, nil
}

// Trusted names what a PEM bundle holds, for a person: each authority's common name and the start
// of its fingerprint (or "public key" and its fingerprint).
func Trusted(data []byte) []string {
	var out []string
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return out
		}
		out = append(out, describeBlock(b))
	}
}

func describeBlock(b *pem.Block) string {
	sum := sha256.Sum256(b.Bytes)
	fp := hex.EncodeToString(sum[:6])
	if b.Type == "CERTIFICATE" {
		if c, err := x509.ParseCertificate(b.Bytes); err == nil {
			return fmt.Sprintf("CA %q (sha256 %s…, until %s)", c.Subject.CommonName, fp, c.NotAfter.UTC().Format("2006-01-02"))
		}
	}
	return fmt.Sprintf("%s (sha256 %s…)", strings.ToLower(b.Type), fp)
}

// writeIfChanged writes data to p atomically unless it holds it already.
func writeIfChanged(files host.Files, p string, data []byte, mode fs.FileMode) (*Change, error) {
	before, err := files.ReadFile(p)
	if err == nil && bytes.Equal(before, data) {
		return nil, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if err := files.WriteFileAtomic(p, data, mode); err != nil {
		return nil, err
	}
	return &Change{Path: p, Before: Trusted(before), After: Trusted(data)}, nil
}

// trustInKubeconfig makes every cluster of the kubeconfig at p that trusts the old cluster authority
// trust the bundle; a kubeconfig that is not there (a worker has kubelet.conf only) is left alone.
func trustInKubeconfig(files host.Files, p string, bundle []byte) (*Change, error) {
	data, err := files.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	bundleBlocks, err := pemBlocks(bundle, "bundle")
	if err != nil {
		return nil, err
	}
	var before []string
	changed := false
	for name, c := range cfg.Clusters {
		switch {
		case c.CertificateAuthority == pki("ca.crt"):
			c.CertificateAuthority = pki("ca-bundle.crt")
		case len(c.CertificateAuthorityData) > 0:
			blocks, err := pemBlocks(c.CertificateAuthorityData, p+" cluster "+name)
			if err != nil {
				return nil, err
			}
			// Only a kubeconfig of this cluster: every authority it trusts is in the bundle's old part.
			if !slices.ContainsFunc(blocks, func(b *pem.Block) bool {
				return slices.ContainsFunc(bundleBlocks, func(o *pem.Block) bool { return bytes.Equal(o.Bytes, b.Bytes) })
			}) {
				continue
			}
			if bytes.Equal(c.CertificateAuthorityData, bundle) {
				continue
			}
			before = append(before, Trusted(c.CertificateAuthorityData)...)
			c.CertificateAuthorityData = bundle
		default:
			continue
		}
		changed = true
	}
	if !changed {
		return nil, nil
	}
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	mode := fs.FileMode(0o600)
	if fi, err := files.Stat(p); err == nil {
		mode = fi.Mode().Perm()
	}
	if err := files.WriteFileAtomic(p, out, mode); err != nil {
		return nil, err
	}
	return &Change{Path: p, Before: before, After: Trusted(bundle)}, nil
}

// clientCAFileLine is the kubelet configuration's authentication.x509.clientCAFile, as kubeadm writes it.
var clientCAFileLine = regexp.MustCompile(`^(\s*clientCAFile:\s*)"?([^"\s]+)"?\s*$`)

// pointLine rewrites the value of every line of p matching re (its second group) from old to bundle;
// a file that is not there is left alone.
func pointLine(files host.Files, p string, re *regexp.Regexp, old, bundle string, bundlePEM []byte) (*Change, error) {
	data, err := files.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(data), "\n")
	changed := false
	for i, l := range lines {
		if m := re.FindStringSubmatch(l); m != nil && m[2] == old {
			lines[i] = m[1] + bundle
			changed = true
		}
	}
	if !changed {
		return nil, nil
	}
	return writePreservingMode(files, p, []byte(strings.Join(lines, "\n")), []string{old}, []string{bundle + ": " + strings.Join(Trusted(bundlePEM), ", ")})
}

func writePreservingMode(files host.Files, p string, data []byte, before, after []string) (*Change, error) {
	mode := fs.FileMode(0o644)
	if fi, err := files.Stat(p); err == nil {
		mode = fi.Mode().Perm()
	}
	if err := files.WriteFileAtomic(p, data, mode); err != nil {
		return nil, err
	}
	return &Change{Path: p, Before: before, After: after}, nil
}

// flagLine is one argument of a static pod's command as kubeadm writes it: `    - --name=value`.
var flagLine = regexp.MustCompile(`^(\s*-\s+"?--)([a-z0-9-]+)=([^"\s]+)("?\s*)$`)

// pointFlags points comp's flags that accept a bundle at the bundles, where they name the old files.
// The manifest is edited where it is: in the manifests directory, or where an interrupted restart
// left it.
func pointFlags(files host.Files, comp string, bundles []trustBundle, bundlePEM map[string][]byte) (*Change, error) {
	p := host.Manifest(host.ManifestsDir, comp)
	if !files.Exists(p) {
		p = host.Manifest(host.MovedManifestsDir, comp)
	}
	data, err := files.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(data), "\n")
	var before, after []string
	for _, b := range bundles {
		for _, flag := range b.flags[comp] {
			for i, l := range lines {
				m := flagLine.FindStringSubmatch(l)
				if m == nil || m[2] != flag || m[3] != pki(b.old) {
					continue
				}
				lines[i] = m[1] + m[2] + "=" + pki(b.bundle) + m[4]
				before = append(before, "--"+flag+"="+pki(b.old))
				after = append(after, "--"+flag+"="+pki(b.bundle)+" ("+strings.Join(Trusted(bundlePEM[b.name]), ", ")+")")
			}
		}
	}
	if len(before) == 0 {
		return nil, nil
	}
	return writePreservingMode(files, p, []byte(strings.Join(lines, "\n")), before, after)
}
