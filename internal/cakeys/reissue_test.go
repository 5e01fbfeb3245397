package cakeys

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// kubeadmBin is the kubeadm the repository builds (bin/, or $NODEOPS_BIN).
func kubeadmBin(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("NODEOPS_BIN")
	if dir == "" {
		dir = "../../bin"
	}
	p, err := filepath.Abs(filepath.Join(dir, "kubeadm"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("kubeadm: %v (set NODEOPS_BIN, or copy the tools into bin/)", err)
	}
	return p
}

// kubeadmConfig writes the configuration realControlPlane gives kubeadm for the node at root and
// returns its path.
func kubeadmConfig(t *testing.T, root, node, keys string) string {
	t.Helper()
	config := filepath.Join(t.TempDir(), "kubeadm.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, kubeadmInit, node, filepath.Join(root, PKIDirectory), keys), 0o600); err != nil {
		t.Fatal(err)
	}
	return config
}

// kubeadmInit is the configuration realControlPlane gives kubeadm: the node's name, the
// certificates' directory and the key algorithm, in that order.
const kubeadmInit = `apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: 10.0.0.1
nodeRegistration:
  name: %s
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.37.2
certificatesDir: %s
apiServer:
  certSANs: [cp.example.com]
encryptionAlgorithm: %s
`

// The key algorithms realControlPlane's kubeadm uses.
const (
	defaultKeys = "RSA-2048"
	fastKeys    = "ECDSA-P256"
)

// kubeletClientFile is the dated file kubelet-client-current.pem points at, as the kubelet names it.
const kubeletClientFile = KubeletPKIDirectory + "/kubelet-client-2026-01-02-03-04-05.pem"

// realControlPlane makes root a control plane as kubeadm makes it: `kubeadm init phase certs all`
// and `init phase kubeconfig all` (real authorities, certificates and kubeconfigs), kubelet.conf then
// pointed at kubelet-client-current.pem as kubeadm's kubelet-finalize phase leaves it, kubeadm's
// static pod manifests (testdata) and the kubelet's configuration. keys is kubeadm's
// encryptionAlgorithm: defaultKeys (RSA-2048, as most clusters have it), or
// fastKeys (ECDSA-P256) where a test re-issues everything many times and RSA key generation under
// the race detector would take minutes.
func realControlPlane(t *testing.T, root, node, keys string) {
	t.Helper()
	bin := kubeadmBin(t)
	config := kubeadmConfig(t, root, node, keys)
	for _, args := range [][]string{
		{"init", "phase", "certs", "all", "--config", config},
		{"init", "phase", "kubeconfig", "all", "--config", config, "--kubeconfig-dir", filepath.Join(root, "/etc/kubernetes")},
	} {
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("kubeadm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// kubelet-finalize: the kubelet's client certificate and key move to a file of their own.
	cfg, err := clientcmd.LoadFromFile(filepath.Join(root, KubeletKubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	ai := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo]
	writeFile(t, root, kubeletClientFile, append(append([]byte(nil), ai.ClientCertificateData...), ai.ClientKeyData...), 0o600)
	if err := os.Symlink(filepath.Base(kubeletClientFile), filepath.Join(root, KubeletPKIDirectory, "kubelet-client-current.pem")); err != nil {
		t.Fatal(err)
	}
	ai.ClientCertificateData, ai.ClientKeyData = nil, nil
	ai.ClientCertificate = KubeletPKIDirectory + "/kubelet-client-current.pem"
	ai.ClientKey = ai.ClientCertificate
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, root, KubeletKubeconfig, data, 0o600)
	writeFile(t, root, KubeletConfigFile, []byte(kubeletConfig), 0o644)
	for _, comp := range StaticPodComponents {
		data, err := os.ReadFile(filepath.Join("testdata/manifests", comp+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, root, host.Manifest(host.ManifestsDir, comp), data, 0o600)
	}
}

// trustedBoth is a control plane after phases prepare and trust-both, with the new authorities.
func trustedBoth(t *testing.T, root, keys string) map[string]authority {
	t.Helper()
	realControlPlane(t, root, "cp-1", keys)
	fresh := stageNew(t, root)
	if _, err := TrustBoth(host.NewLocal(root).Files, TrustInput{Operation: trustOp, ServiceAccountKey: true}); err != nil {
		t.Fatal(err)
	}
	return fresh
}

func reissueInput() ReissueInput {
	return ReissueInput{Operation: trustOp, ServiceAccountKey: true, Now: time.Now(), NodeName: "cp-1"}
}

// leaf is what a person checks of a re-issued certificate.
type leaf struct {
	cert    *x509.Certificate
	keyOK   bool
	file    string
	keyType string
}

// leaves reads every certificate phase re-issue re-issues on the control plane at root.
func leaves(t *testing.T, root string) map[string]leaf {
	t.Helper()
	files := host.NewLocal(root).Files
	targets, err := ControlPlaneTargets(files, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]leaf{}
	for _, tg := range targets {
		c, k, err := ReadTarget(files, tg)
		if err != nil {
			t.Fatalf("%s: %v", tg.Path, err)
		}
		l := leaf{cert: c, file: tg.Path, keyType: fmt.Sprintf("%T", c.PublicKey)}
		if k != nil {
			l.keyOK = sameKey(k, c)
		}
		out[tg.Name] = l
	}
	return out
}

// The names kubeadm gives what re-issue re-issues on a control plane kubeadm made.
var wantTargets = []string{"admin.conf", "apiserver", "apiserver-etcd-client", "apiserver-kubelet-client", "controller-manager.conf",
	"etcd-healthcheck-client", "etcd-peer", "etcd-server", "front-proxy-client", "kubelet-client", "scheduler.conf", "super-admin.conf"}

// Phase re-issue on a control plane kubeadm made: the new authorities (and service-account key)
// replace the old in /etc/kubernetes/pki; every certificate and kubeconfig kubeadm made is issued
// again by the new authority with the same subject, SANs and usages and a key of its own; the
// kubeconfigs still trust the old and the new cluster CA; kubelet-client-current.pem is still the
// kubelet's link to its dated file; a second run keeps everything (same serials).
func TestReissueOnAKubeadmControlPlane(t *testing.T) {
	root := t.TempDir()
	fresh := trustedBoth(t, root, defaultKeys)
	files := host.NewLocal(root).Files
	before := leaves(t, root)
	oldAuthorities := map[string][]byte{}
	for _, rel := range []string{"ca.crt", "ca.key", "etcd/ca.key", "front-proxy-ca.key", "sa.key", "sa.pub"} {
		oldAuthorities[rel] = readFile(t, root, pki(rel))
	}
	var names []string
	for n := range before {
		names = append(names, n)
	}
	sort.Strings(names)
	if strings.Join(names, ",") != strings.Join(wantTargets, ",") {
		t.Fatalf("targets %v, want %v", names, wantTargets)
	}
	bundleBefore := map[string][]byte{}
	for _, kc := range append(slices.Clone(kubeconfigTargets), KubeletKubeconfig) {
		bundleBefore[kc] = kubeconfigCA(t, root, kc)
	}

	steps, err := Reissue(files, reissueInput(), false)
	if err != nil {
		t.Fatal(err)
	}
	issued := 0
	for _, s := range steps {
		if s.State == "issue" {
			issued++
			if !strings.Contains(s.String(), "issued by CA") || !strings.Contains(s.String(), "after: issued by CA") {
				t.Errorf("step %q does not name the old and the new issuer", s)
			}
		}
		if strings.Contains(s.String(), "PRIVATE KEY") {
			t.Errorf("a step shows a key: %s", s)
		}
	}
	if issued != len(wantTargets) {
		t.Errorf("%d certificates issued, want %d:\n%v", issued, len(wantTargets), steps)
	}
	for _, rel := range []string{"ca.crt", "ca.key", "etcd/ca.crt", "etcd/ca.key", "front-proxy-ca.crt", "front-proxy-ca.key", "sa.key", "sa.pub"} {
		if !bytes.Equal(readFile(t, root, pki(rel)), readFile(t, root, staged(rel))) {
			t.Errorf("%s is not the new one", rel)
		}
	}
	// The old authorities are kept for a person who backs out (0600, in the staging directory).
	for rel, data := range oldAuthorities {
		if !bytes.Equal(readFile(t, root, previous(rel)), data) {
			t.Errorf("%s: the old %s is not kept", previous(rel), rel)
		}
		if fi, _ := os.Stat(filepath.Join(root, previous(rel))); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %04o", previous(rel), fi.Mode().Perm())
		}
	}
	after := leaves(t, root)
	for name, l := range after {
		b := before[name]
		ca := fresh[targetAuthority(t, files, name)].cert
		if err := l.cert.CheckSignatureFrom(ca); err != nil {
			t.Errorf("%s (%s) is not issued by the new authority: %v", name, l.file, err)
		}
		if !l.keyOK {
			t.Errorf("%s: the key does not match the certificate", name)
		}
		if l.cert.Subject.String() != b.cert.Subject.String() || fmt.Sprint(l.cert.DNSNames, l.cert.IPAddresses, l.cert.ExtKeyUsage) != fmt.Sprint(b.cert.DNSNames, b.cert.IPAddresses, b.cert.ExtKeyUsage) {
			t.Errorf("%s: %s %v %v %v, was %s %v %v %v", name, l.cert.Subject, l.cert.DNSNames, l.cert.IPAddresses, l.cert.ExtKeyUsage, b.cert.Subject, b.cert.DNSNames, b.cert.IPAddresses, b.cert.ExtKeyUsage)
		}
		if l.keyType != b.keyType || bytes.Equal(l.cert.RawSubjectPublicKeyInfo, b.cert.RawSubjectPublicKeyInfo) {
			t.Errorf("%s: key %s (same as before: %v), want a new %s", name, l.keyType, bytes.Equal(l.cert.RawSubjectPublicKeyInfo, b.cert.RawSubjectPublicKeyInfo), b.keyType)
		}
		if d := l.cert.NotAfter.Sub(l.cert.NotBefore); d < LeafValidity || d > LeafValidity+backdate+time.Minute {
			t.Errorf("%s valid for %s", name, d)
		}
	}
	if !slices.Contains(after["apiserver"].cert.DNSNames, "cp.example.com") {
		t.Errorf("apiserver lost its extra SAN: %v", after["apiserver"].cert.DNSNames)
	}
	for kc, b := range bundleBefore {
		if got := kubeconfigCA(t, root, kc); kc != KubeletKubeconfig && !bytes.Equal(got, b) {
			t.Errorf("%s trusts %v, want the old and the new as trust-both left it (%v)", kc, Trusted(got), Trusted(b))
		}
	}
	if len(Trusted(bundleBefore["/etc/kubernetes/admin.conf"])) != 2 {
		t.Fatalf("admin.conf trusted %v before", Trusted(bundleBefore["/etc/kubernetes/admin.conf"]))
	}
	if link, err := os.Readlink(filepath.Join(root, KubeletPKIDirectory, "kubelet-client-current.pem")); err != nil || link != filepath.Base(kubeletClientFile) {
		t.Errorf("kubelet-client-current.pem -> %q (%v)", link, err)
	}
	for _, d := range []string{JournalDirectory, PreviousDirectory, PreviousDirectory + "/etcd"} {
		if fi, err := os.Stat(filepath.Join(root, d)); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v, want mode 0700", d, fi, err)
		}
	}
	for _, p := range []string{kubeletClientFile, pki("apiserver.key"), journalFile(Target{Name: "apiserver"})} {
		if fi, err := os.Stat(filepath.Join(root, p)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want mode 0600", p, fi, err)
		}
	}

	// kubeadm itself takes the result for its own: `init phase certs all`, with the configuration the
	// node was made with, keeps an existing certificate only when the authority on disk signed it and
	// its key matches (phases/certs/certs.go), else fails.
	snap := snapshot(t, root)
	out, err := exec.Command(kubeadmBin(t), "init", "phase", "certs", "all", "--config", kubeadmConfig(t, root, "cp-1", defaultKeys)).CombinedOutput()
	if err != nil || strings.Contains(string(out), "Generating") {
		t.Fatalf("kubeadm init phase certs on the re-issued certificates: %v\n%s", err, out)
	}
	if snapshot(t, root) != snap {
		t.Fatal("kubeadm changed the re-issued certificates")
	}

	again, err := Reissue(files, reissueInput(), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range again {
		if s.State != "kept" {
			t.Errorf("a second run: %s", s)
		}
	}
	for name, l := range leaves(t, root) {
		if l.cert.SerialNumber.Cmp(after[name].cert.SerialNumber) != 0 {
			t.Errorf("%s issued again by a second run", name)
		}
	}
}

func targetAuthority(t *testing.T, files host.Files, name string) string {
	t.Helper()
	targets, err := ControlPlaneTargets(files, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range targets {
		if tg.Name == name {
			return tg.Authority
		}
	}
	t.Fatalf("no target %s", name)
	return ""
}

// describeTree is root's files as a person compares two runs: modes, authorities by fingerprint, and
// each certificate by its subject, SANs, usages and issuer, not by its serial or key (new each run).
func describeTree(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			l, _ := os.Readlink(p)
			fmt.Fprintf(&b, "%s -> %s\n", rel, l)
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %s: ", rel, fi.Mode().Perm())
		if cfg, err := clientcmd.Load(data); err == nil && len(cfg.Clusters) > 0 {
			for _, c := range cfg.Clusters {
				b.WriteString("trusts " + describePEM(c.CertificateAuthorityData) + "; ")
			}
			for _, a := range cfg.AuthInfos {
				b.WriteString("user " + describePEM(a.ClientCertificateData) + " " + describePEM(a.ClientKeyData) + a.ClientCertificate + "; ")
			}
		} else if bytes.Contains(data, []byte("-----BEGIN")) {
			b.WriteString(describePEM(data))
		} else {
			sum := sha256.Sum256(data)
			b.WriteString(hex.EncodeToString(sum[:8]))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func describePEM(data []byte) string {
	var out []string
	for rest := data; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			return strings.Join(out, " ")
		}
		switch blk.Type {
		case "CERTIFICATE":
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				out = append(out, "bad certificate")
				continue
			}
			if c.IsCA {
				sum := sha256.Sum256(c.Raw)
				out = append(out, "CA "+hex.EncodeToString(sum[:8]))
				continue
			}
			out = append(out, fmt.Sprintf("cert[%s %v %v %v by %x]", c.Subject, c.DNSNames, c.IPAddresses, c.ExtKeyUsage, c.AuthorityKeyId))
		case "PUBLIC KEY":
			sum := sha256.Sum256(blk.Bytes)
			out = append(out, "public key "+hex.EncodeToString(sum[:8]))
		default:
			k, err := parseAnyKey(pem.EncodeToMemory(blk))
			c, cerr := firstCert(data)
			switch {
			case err != nil:
				out = append(out, "bad key")
			case cerr == nil && sameKey(k, c):
				out = append(out, blk.Type+" of the certificate")
			default:
				out = append(out, blk.Type)
			}
		}
	}
}

func sameKey(k crypto.Signer, c *x509.Certificate) bool {
	pub, ok := k.Public().(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(c.PublicKey)
}

// newCASerials are the serial numbers, by target, of every certificate of the new authorities on the
// control plane at root, in place or recorded in the journal: a certificate issued already.
func newCASerials(t *testing.T, root string, fresh map[string]authority) map[string]string {
	t.Helper()
	files := host.NewLocal(root).Files
	targets, err := ControlPlaneTargets(files, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, tg := range targets {
		ca := fresh[tg.Authority].cert
		if c, _, err := ReadTarget(files, tg); err == nil && c.CheckSignatureFrom(ca) == nil {
			out[tg.Name] = serial(c)
		}
		if data, err := os.ReadFile(filepath.Join(root, journalFile(tg))); err == nil {
			if c, err := firstCert(data); err == nil && c.CheckSignatureFrom(ca) == nil {
				if prev, ok := out[tg.Name]; ok && prev != serial(c) {
					t.Errorf("%s: in place serial %s, in the journal %s", tg.Name, prev, serial(c))
				}
				out[tg.Name] = serial(c)
			}
		}
	}
	return out
}

// copyTree copies the tree at src, modes and symlinks kept.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, to)
		case fi.IsDir():
			return os.MkdirAll(to, fi.Mode().Perm())
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, data, fi.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// A re-issue cut at each of its writes in turn, then run again: every certificate the new authority
// had issued before the cut (in place or recorded in the journal) is the one in place at the end
// (same serial: nothing issued twice); every kubeconfig trusted the old and the new cluster CA at the
// cut; and the tree ends as an uninterrupted run leaves it. The node's keys are ECDSA (kubeadm's
// encryptionAlgorithm ECDSA-P256): the cuts re-issue about a thousand keys, and RSA's would take
// minutes under the race detector; TestReissueOnAKubeadmControlPlane covers RSA.
func TestReissueInterruptedAtEveryWriteIssuesNothingTwice(t *testing.T) {
	template := t.TempDir()
	fresh := trustedBoth(t, template, fastKeys)
	in := reissueInput()
	ref := copyTree(t, template)
	if _, err := Reissue(host.NewLocal(ref).Files, in, false); err != nil {
		t.Fatal(err)
	}
	want := describeTree(t, ref)
	counter := &failingFiles{Files: host.NewLocal(copyTree(t, template)).Files}
	if _, err := Reissue(counter, in, false); err != nil {
		t.Fatal(err)
	}
	// The authorities (8 files, each kept first), then per target its journal entry and its one or two files.
	if counter.writes < 16+2*len(wantTargets) {
		t.Fatalf("only %d writes to cut", counter.writes)
	}
	for n := 1; n <= counter.writes; n++ {
		root := copyTree(t, template)
		ff := &failingFiles{Files: host.NewLocal(root).Files, n: n}
		if _, err := Reissue(ff, in, false); !errors.Is(err, errCrash) {
			t.Fatalf("cut at write %d: err = %v", n, err)
		}
		for _, kc := range append(slices.Clone(kubeconfigTargets), KubeletKubeconfig) {
			ca := kubeconfigCA(t, root, kc)
			if !bundleHolds(ca, fresh[v1alpha1.AuthorityCluster].cert) || len(Trusted(ca)) != 2 {
				t.Fatalf("cut at write %d: %s trusts %v, want the old and the new", n, kc, Trusted(ca))
			}
		}
		issued := newCASerials(t, root, fresh)
		if _, err := Reissue(host.NewLocal(root).Files, in, false); err != nil {
			t.Fatalf("resume after a cut at write %d: %v", n, err)
		}
		final := newCASerials(t, root, fresh)
		for name, s := range issued {
			if final[name] != s {
				t.Fatalf("cut at write %d: %s was issued (serial %s) before the cut and again (serial %s) by the resumed run", n, name, s, final[name])
			}
		}
		for name, l := range leaves(t, root) {
			if !l.keyOK || l.cert.CheckSignatureFrom(fresh[targetAuthority(t, host.NewLocal(root).Files, name)].cert) != nil {
				t.Fatalf("cut at write %d, resumed: %s is not a matching pair of the new authority", n, name)
			}
		}
		if got := describeTree(t, root); got != want {
			t.Fatalf("resumed after a cut at write %d, the tree differs from an uninterrupted run's:\n%s", n, diffLines(want, got))
		}
	}
}

// Re-issue refuses a node where trust-both has not run, before anything is written: a certificate of
// the new authority would be refused by what trusts only the old, and with the service-account key
// a token signed by the new sa.key by an API server verifying with the old sa.pub alone.
func TestReissueRefusesANodeThatDoesNotTrustTheNew(t *testing.T) {
	root := t.TempDir()
	realControlPlane(t, root, "cp-1", defaultKeys)
	stageNew(t, root)
	before := snapshot(t, root)
	_, err := Reissue(host.NewLocal(root).Files, reissueInput(), false)
	if err == nil || !strings.Contains(err.Error(), "phase trust-both") {
		t.Fatalf("err = %v", err)
	}
	if snapshot(t, root) != before {
		t.Fatal("files changed")
	}
	// With the service-account key: trust-both without it left the API server verifying tokens with
	// the old sa.pub alone, which would refuse every token once it signs with the new sa.key.
	root = t.TempDir()
	realControlPlane(t, root, "cp-1", defaultKeys)
	stageNew(t, root)
	if _, err := TrustBoth(host.NewLocal(root).Files, TrustInput{Operation: trustOp}); err != nil {
		t.Fatal(err)
	}
	before = snapshot(t, root)
	_, err = Reissue(host.NewLocal(root).Files, reissueInput(), false)
	if err == nil || !strings.Contains(err.Error(), "--service-account-key-file") || !strings.Contains(err.Error(), "serviceAccountKey") {
		t.Fatalf("err = %v", err)
	}
	if snapshot(t, root) != before {
		t.Fatal("files changed")
	}
	// Another node's name in the kubelet's certificate is refused too: re-issue copies the subject.
	root = t.TempDir()
	trustedBoth(t, root, defaultKeys)
	before = snapshot(t, root)
	in := reissueInput()
	in.NodeName = "cp-2"
	if _, err := Reissue(host.NewLocal(root).Files, in, false); err == nil || !strings.Contains(err.Error(), `not "system:node:cp-2"`) {
		t.Fatalf("err = %v", err)
	}
	if snapshot(t, root) != before {
		t.Fatal("files changed")
	}
}

// A DryRun lists every file re-issue would change with its old and new issuer, and changes nothing.
func TestReissueDryRunListsEveryFileAndChangesNothing(t *testing.T) {
	root := t.TempDir()
	trustedBoth(t, root, defaultKeys)
	before := snapshot(t, root)
	steps, err := Reissue(host.NewLocal(root).Files, reissueInput(), true)
	if err != nil {
		t.Fatal(err)
	}
	if snapshot(t, root) != before {
		t.Fatal("a DryRun changed files")
	}
	var paths []string
	for _, s := range steps {
		paths = append(paths, s.Path)
		if s.Before == "" || s.After == "" || s.Before == s.After {
			t.Errorf("%s: before %q after %q", s.Path, s.Before, s.After)
		}
	}
	for _, p := range []string{pki("ca.crt"), pki("ca.key"), pki("sa.key"), pki("apiserver.crt"), pki("etcd/peer.crt"), "/etc/kubernetes/admin.conf", KubeletPKIDirectory + "/kubelet-client-current.pem"} {
		if !slices.Contains(paths, p) {
			t.Errorf("the DryRun does not list %s: %v", p, paths)
		}
	}
	if len(steps) != 8+len(wantTargets) {
		t.Errorf("%d steps, want %d", len(steps), 8+len(wantTargets))
	}
}

// In a whole rotation's DryRun (prepare staged nothing) each later phase lists, on a control plane
// kubeadm made, the service-account key's files beside the authorities': trust-both sa-bundle.pub
// and the API server's --service-account-key-file, re-issue sa.pub and sa.key, complete both back.
func TestUnpreparedDryRunListsTheServiceAccountKey(t *testing.T) {
	root := t.TempDir()
	realControlPlane(t, root, "cp-1", defaultKeys)
	files := host.NewLocal(root).Files
	before := snapshot(t, root)
	for step, want := range map[string][]string{
		"trust-both": {pki("sa-bundle.pub") + ": would be created: trusts public key (sha256 ",
			"kube-apiserver.yaml: flag --service-account-key-file: " + pki("sa.pub") + " -> " + pki("sa-bundle.pub")},
		"re-issue": {pki("ca.crt") + ", " + pki("ca.key") + ": the old cluster authority -> the new",
			pki("sa.pub") + ", " + pki("sa.key") + ": the old service-account key -> the new"},
		"complete": {pki("sa-bundle.pub") + ": would be removed once " + pki("sa.pub") + " is the new service-account key alone",
			"kube-apiserver.yaml: flag --service-account-key-file: " + pki("sa-bundle.pub") + " -> " + pki("sa.pub")},
	} {
		lines, err := UnpreparedDryRun(files, step, nil, true)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		out := strings.Join(lines, "\n")
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s's DryRun lacks %q:\n%s", step, w, out)
			}
		}
		without, err := UnpreparedDryRun(files, step, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		if out := strings.Join(without, "\n"); strings.Contains(out, "sa.pub") || strings.Contains(out, "sa-bundle.pub") {
			t.Errorf("%s's DryRun without the service-account key lists its files:\n%s", step, out)
		}
	}
	if snapshot(t, root) != before {
		t.Fatal("a DryRun listing changed files")
	}
}
