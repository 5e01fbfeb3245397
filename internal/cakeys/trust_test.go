package cakeys

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

const trustOp = "rot-1"

// kubeletConfig is the part of /var/lib/kubelet/config.yaml trust-both touches, as kubeadm writes it.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
cgroupDriver: systemd
`

// authority is a real CA: its certificate and key.
type authority struct {
	certPEM, keyPEM []byte
	cert            *x509.Certificate
	key             crypto.Signer
}

func loadAuthority(t *testing.T, certPEM, keyPEM []byte) authority {
	t.Helper()
	c, err := parseCert(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	k, err := parseAnyKey(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return authority{certPEM: certPEM, keyPEM: keyPEM, cert: c, key: k}
}

// issue makes a client certificate signed by a, as kubeadm issues admin.conf's with its
// encryptionAlgorithm ECDSA-P256: what the tests check is who signed it, and an RSA key would cost
// about a second under the race detector each time.
func (a authority) issue(t *testing.T, cn string) (*x509.Certificate, []byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn, Organization: []string{"kubeadm:cluster-admins"}},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// verifies says whether the PEM bundle accepts c as a client certificate.
func verifies(bundle []byte, c *x509.Certificate) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return errors.New("no certificate in the bundle")
	}
	_, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err
}

// kubeadmTree is a control plane's /etc/kubernetes as kubeadm leaves it (the static pod manifests are
// kubeadm v1.37's own output, testdata/manifests), with real old authorities, a real service-account
// key and kubeconfigs whose client certificates the old cluster authority issued.
type kubeadmTree struct {
	old        map[string]authority // by authority name
	oldSA      []byte               // sa.pub
	oldClient  *x509.Certificate    // issued by the old cluster authority
	kubeconfig []byte               // admin.conf as written
}

func writeFile(t *testing.T, root, p string, data []byte, mode fs.FileMode) {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, data, mode); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, root, p string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, p))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// newControlPlaneTree writes the tree into root (controlPlane) or a worker's part of it.
func newKubeadmTree(t *testing.T, root string, controlPlane bool) kubeadmTree {
	t.Helper()
	tr := kubeadmTree{old: map[string]authority{}}
	now := time.Now()
	for _, name := range v1alpha1.Authorities {
		p := pairs[name]
		certPEM, keyPEM, err := newPair(p, nil, now)
		if err != nil {
			t.Fatal(err)
		}
		tr.old[name] = loadAuthority(t, certPEM, keyPEM)
		if controlPlane || name == v1alpha1.AuthorityCluster {
			writeFile(t, root, pki(p.Cert), certPEM, 0o644)
		}
		if controlPlane {
			writeFile(t, root, pki(p.Key), keyPEM, 0o600)
		}
	}
	saPub, saKey, err := newPair(serviceAccountPair, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	tr.oldSA = saPub
	var clientPEM, clientKey []byte
	tr.oldClient, clientPEM, clientKey = tr.old[v1alpha1.AuthorityCluster].issue(t, "kubernetes-admin")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubernetes"] = &clientcmdapi.Cluster{Server: "https://10.0.0.1:6443", CertificateAuthorityData: tr.old[v1alpha1.AuthorityCluster].certPEM}
	cfg.AuthInfos["kubernetes-admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: clientPEM, ClientKeyData: clientKey}
	cfg.Contexts["kubernetes-admin@kubernetes"] = &clientcmdapi.Context{Cluster: "kubernetes", AuthInfo: "kubernetes-admin"}
	cfg.CurrentContext = "kubernetes-admin@kubernetes"
	tr.kubeconfig, err = clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, root, KubeletConfigFile, []byte(kubeletConfig), 0o644)
	writeFile(t, root, "/etc/kubernetes/kubelet.conf", tr.kubeconfig, 0o600)
	if !controlPlane {
		return tr
	}
	writeFile(t, root, pki("sa.pub"), saPub, 0o644)
	writeFile(t, root, pki("sa.key"), saKey, 0o600)
	for _, kc := range Kubeconfigs {
		writeFile(t, root, kc, tr.kubeconfig, 0o600)
	}
	for _, comp := range StaticPodComponents {
		data, err := os.ReadFile(filepath.Join("testdata/manifests", comp+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, root, host.Manifest(host.ManifestsDir, comp), data, 0o600)
	}
	return tr
}

// flagValue is comp's --flag as its manifest says, which must still be a valid Pod.
func flagValue(t *testing.T, root, comp, flag string) string {
	t.Helper()
	pod := &corev1.Pod{}
	if err := yaml.UnmarshalStrict(readFile(t, root, host.Manifest(host.ManifestsDir, comp)), pod); err != nil {
		t.Fatalf("%s manifest: %v", comp, err)
	}
	var found []string
	for _, a := range pod.Spec.Containers[0].Command {
		if v, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s has --%s %d times: %v", comp, flag, len(found), found)
	}
	return found[0]
}

func kubeconfigCA(t *testing.T, root, p string) []byte {
	t.Helper()
	cfg, err := clientcmd.Load(readFile(t, root, p))
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Clusters["kubernetes"].CertificateAuthorityData
}

// stageNew generates the rotation's new authorities into root's staging directory.
func stageNew(t *testing.T, root string) map[string]authority {
	t.Helper()
	files := host.NewLocal(root).Files
	if _, err := Generate(files, trustOp, nil, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	out := map[string]authority{}
	for _, name := range v1alpha1.Authorities {
		p := pairs[name]
		out[name] = loadAuthority(t, readFile(t, root, staged(p.Cert)), readFile(t, root, staged(p.Key)))
	}
	return out
}

func publicKeys(t *testing.T, data []byte) [][]byte {
	t.Helper()
	var out [][]byte
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return out
		}
		out = append(out, b.Bytes)
	}
}

// Phase trust-both on a control plane: every bundle holds the old and the new authority, a client
// certificate of either cluster CA verifies against the new bundle and the kubeconfigs, the API
// server verifies service-account tokens with both keys and still signs with the old, the flags that
// cannot take a bundle and the old files are as they were, and a second run changes nothing.
func TestTrustBothOnAControlPlane(t *testing.T) {
	root := t.TempDir()
	tr := newKubeadmTree(t, root, true)
	fresh := stageNew(t, root)
	oldCA := readFile(t, root, pki("ca.crt"))
	files := host.NewLocal(root).Files

	changes, err := TrustBoth(files, TrustInput{Operation: trustOp, ServiceAccountKey: true})
	if err != nil {
		t.Fatal(err)
	}
	var changed []string
	for _, c := range changes {
		changed = append(changed, c.Path)
		if len(c.After) == 0 {
			t.Errorf("%s: no words for what it trusts after", c.Path)
		}
	}
	want := []string{pki("ca-bundle.crt"), pki("etcd/ca-bundle.crt"), pki("front-proxy-ca-bundle.crt"), pki("sa-bundle.pub")}
	want = append(want, Kubeconfigs...)
	want = append(want, KubeletConfigFile)
	// kubeadm's kube-scheduler names no CA file: it trusts through scheduler.conf, changed above.
	for _, comp := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		want = append(want, host.Manifest(host.ManifestsDir, comp))
	}
	if strings.Join(changed, "\n") != strings.Join(want, "\n") {
		t.Fatalf("changed\n%s\nwant\n%s", strings.Join(changed, "\n"), strings.Join(want, "\n"))
	}

	newClient, _, _ := fresh[v1alpha1.AuthorityCluster].issue(t, "kubernetes-admin")
	bundle := readFile(t, root, pki("ca-bundle.crt"))
	if got := Trusted(bundle); len(got) != 2 || !strings.Contains(got[0], `"kubernetes"`) {
		t.Fatalf("ca-bundle.crt holds %v", got)
	}
	for what, c := range map[string]*x509.Certificate{"old": tr.oldClient, "new": newClient} {
		if err := verifies(bundle, c); err != nil {
			t.Errorf("a client certificate of the %s cluster CA does not verify against ca-bundle.crt: %v", what, err)
		}
		for _, kc := range Kubeconfigs {
			if err := verifies(kubeconfigCA(t, root, kc), c); err != nil {
				t.Errorf("%s: a certificate of the %s cluster CA does not verify: %v", kc, what, err)
			}
		}
	}
	// A certificate of a CA that is neither is refused: the bundle is not a blanket.
	stranger, _, _ := newAuthority(t).issue(t, "stranger")
	if err := verifies(bundle, stranger); err == nil {
		t.Error("a certificate of an unrelated CA verifies against ca-bundle.crt")
	}
	for _, name := range []string{v1alpha1.AuthorityEtcd, v1alpha1.AuthorityFrontProxy} {
		b := readFile(t, root, pki(trustBundles[name].bundle))
		for what, a := range map[string]authority{"old": tr.old[name], "new": fresh[name]} {
			c, _, _ := a.issue(t, "client")
			if err := verifies(b, c); err != nil {
				t.Errorf("%s bundle: a certificate of the %s CA does not verify: %v", name, what, err)
			}
		}
	}
	keys := publicKeys(t, readFile(t, root, pki("sa-bundle.pub")))
	if len(keys) != 2 || !bytes.Equal(keys[0], publicKeys(t, tr.oldSA)[0]) || !bytes.Equal(keys[1], publicKeys(t, readFile(t, root, staged("sa.pub")))[0]) {
		t.Errorf("sa-bundle.pub holds %d keys, want the old then the new", len(keys))
	}

	for _, f := range []struct{ comp, flag, want string }{
		{"kube-apiserver", "client-ca-file", pki("ca-bundle.crt")},
		{"kube-apiserver", "etcd-cafile", pki("etcd/ca-bundle.crt")},
		{"kube-apiserver", "requestheader-client-ca-file", pki("front-proxy-ca-bundle.crt")},
		{"kube-apiserver", "service-account-key-file", pki("sa-bundle.pub")},
		{"kube-apiserver", "service-account-signing-key-file", pki("sa.key")},
		{"kube-apiserver", "tls-cert-file", pki("apiserver.crt")},
		{"kube-controller-manager", "root-ca-file", pki("ca-bundle.crt")},
		{"kube-controller-manager", "requestheader-client-ca-file", pki("front-proxy-ca-bundle.crt")},
		// kubeadm issue 1350: these cannot take a bundle; they keep the old authority.
		{"kube-controller-manager", "client-ca-file", pki("ca.crt")},
		{"kube-controller-manager", "cluster-signing-cert-file", pki("ca.crt")},
		{"kube-controller-manager", "cluster-signing-key-file", pki("ca.key")},
		{"kube-controller-manager", "service-account-private-key-file", pki("sa.key")},
		{"etcd", "trusted-ca-file", pki("etcd/ca-bundle.crt")},
		{"etcd", "peer-trusted-ca-file", pki("etcd/ca-bundle.crt")},
		{"etcd", "cert-file", pki("etcd/server.crt")},
	} {
		if got := flagValue(t, root, f.comp, f.flag); got != f.want {
			t.Errorf("%s --%s=%s, want %s", f.comp, f.flag, got, f.want)
		}
	}
	if !strings.Contains(string(readFile(t, root, KubeletConfigFile)), "    clientCAFile: "+pki("ca-bundle.crt")+"\n") {
		t.Errorf("kubelet configuration:\n%s", readFile(t, root, KubeletConfigFile))
	}
	if !bytes.Equal(readFile(t, root, pki("ca.crt")), oldCA) {
		t.Error("ca.crt changed: trust-both must leave the old authority's file alone")
	}
	for _, kc := range Kubeconfigs {
		if fi, _ := os.Stat(filepath.Join(root, kc)); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %04o, want 0600 as before", kc, fi.Mode().Perm())
		}
		cfg, _ := clientcmd.Load(readFile(t, root, kc))
		if !bytes.Contains(cfg.AuthInfos["kubernetes-admin"].ClientKeyData, []byte("PRIVATE KEY")) {
			t.Errorf("%s lost its client key", kc)
		}
	}

	again, err := TrustBoth(files, TrustInput{Operation: trustOp, ServiceAccountKey: true})
	if err != nil || len(again) != 0 {
		t.Fatalf("a second run changed %v (%v)", again, err)
	}
}

func newAuthority(t *testing.T) authority {
	t.Helper()
	certPEM, keyPEM, err := newPair(Pair{Name: "x", CommonName: "stranger-ca"}, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return loadAuthority(t, certPEM, keyPEM)
}

// Only the authorities asked for: with authorities [etcd] the cluster and front-proxy files, the
// kubeconfigs and the kubelet are left alone.
func TestTrustBothOnlyTheAuthoritiesAskedFor(t *testing.T) {
	root := t.TempDir()
	newKubeadmTree(t, root, true)
	stageNew(t, root)
	changes, err := TrustBoth(host.NewLocal(root).Files, TrustInput{Operation: trustOp, Authorities: []string{v1alpha1.AuthorityEtcd}})
	if err != nil {
		t.Fatal(err)
	}
	var changed []string
	for _, c := range changes {
		changed = append(changed, c.Path)
	}
	want := []string{pki("etcd/ca-bundle.crt"), host.Manifest(host.ManifestsDir, "etcd"), host.Manifest(host.ManifestsDir, "kube-apiserver")}
	if strings.Join(changed, ",") != strings.Join(want, ",") {
		t.Fatalf("changed %v, want %v", changed, want)
	}
	if got := flagValue(t, root, "kube-apiserver", "client-ca-file"); got != pki("ca.crt") {
		t.Errorf("client-ca-file=%s", got)
	}
}

// A control plane without this operation's staged authorities is refused before anything is written.
func TestTrustBothRefusesAControlPlaneWithoutStagedAuthorities(t *testing.T) {
	root := t.TempDir()
	newKubeadmTree(t, root, true)
	before := snapshot(t, root)
	_, err := TrustBoth(host.NewLocal(root).Files, TrustInput{Operation: trustOp})
	if err == nil || !strings.Contains(err.Error(), "phase prepare (copyCertificateAuthorities) has not run on it") {
		t.Fatalf("err = %v", err)
	}
	if after := snapshot(t, root); after != before {
		t.Fatalf("files changed:\n%s", diffLines(before, after))
	}
}

// A worker trusts the cluster authority the cluster publishes beside its own: its kubelet.conf and
// its kubelet's clientCAFile; a published bundle without the authority it trusts now, or without a
// new one, changes nothing.
func TestTrustBothOnAWorker(t *testing.T) {
	cpRoot, root := t.TempDir(), t.TempDir()
	tr := newKubeadmTree(t, root, false)
	fresh := stageNew(t, cpRoot)
	oldPEM := tr.old[v1alpha1.AuthorityCluster].certPEM
	files := host.NewLocal(root).Files
	before := snapshot(t, root)

	for _, tt := range []struct {
		name      string
		published []byte
		want      string
	}{
		{"only the old", oldPEM, "no new authority published yet"},
		{"not this cluster's", fresh[v1alpha1.AuthorityCluster].certPEM, "lacks the cluster authority this node trusts"},
		{"no certificate", []byte("nothing"), "no PEM certificate"},
	} {
		_, err := TrustBoth(files, TrustInput{Operation: trustOp, NewClusterCA: tt.published})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want %q", tt.name, err, tt.want)
		}
		if after := snapshot(t, root); after != before {
			t.Fatalf("%s: files changed:\n%s", tt.name, diffLines(before, after))
		}
	}

	published := append(append([]byte(nil), oldPEM...), fresh[v1alpha1.AuthorityCluster].certPEM...)
	changes, err := TrustBoth(files, TrustInput{Operation: trustOp, ServiceAccountKey: true, NewClusterCA: published})
	if err != nil {
		t.Fatal(err)
	}
	var changed []string
	for _, c := range changes {
		changed = append(changed, c.Path)
	}
	if want := pki("ca-bundle.crt") + ",/etc/kubernetes/kubelet.conf," + KubeletConfigFile; strings.Join(changed, ",") != want {
		t.Fatalf("changed %v, want %s", changed, want)
	}
	newClient, _, _ := fresh[v1alpha1.AuthorityCluster].issue(t, "system:node:w")
	for what, c := range map[string]*x509.Certificate{"old": tr.oldClient, "new": newClient} {
		for _, b := range [][]byte{readFile(t, root, pki("ca-bundle.crt")), kubeconfigCA(t, root, "/etc/kubernetes/kubelet.conf")} {
			if err := verifies(b, c); err != nil {
				t.Errorf("a certificate of the %s cluster CA does not verify: %v", what, err)
			}
		}
	}
}

// snapshot is every file under root with its mode and content, to compare trees.
func snapshot(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		b.WriteString(rel + " " + fi.Mode().String() + " " + string(data) + "\x00\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func diffLines(a, b string) string {
	as, bs := strings.Split(a, "\x00\n"), strings.Split(b, "\x00\n")
	var out []string
	for _, l := range bs {
		if !strings.Contains(a, l) {
			out = append(out, "+ "+strings.SplitN(l, " ", 2)[0])
		}
	}
	for _, l := range as {
		if !strings.Contains(b, l) {
			out = append(out, "- "+strings.SplitN(l, " ", 2)[0])
		}
	}
	return strings.Join(out, "\n")
}

// failingFiles fails the n-th write (counting from 1), as a crash at that point would leave the tree.
type failingFiles struct {
	host.Files
	n, writes int
}

var errCrash = errors.New("crash")

func (f *failingFiles) WriteFileAtomic(p string, data []byte, mode fs.FileMode) error {
	f.writes++
	if f.writes == f.n {
		return errCrash
	}
	return f.Files.WriteFileAtomic(p, data, mode)
}

var anyFlagFile = regexp.MustCompile(`--([a-z-]+)=(/etc/kubernetes/pki/\S+\.(?:crt|pub))`)

// trustsOld fails unless every component of the control plane at root still accepts the old
// authorities: every CA or key file a static pod's flag names, the kubelet's clientCAFile and every
// kubeconfig verify a certificate of the old authority, or hold the old key.
func trustsOld(t *testing.T, root string, tr kubeadmTree) {
	t.Helper()
	oldBy := map[string]*x509.Certificate{}
	for _, name := range v1alpha1.Authorities {
		c, _, _ := tr.old[name].issue(t, "old-"+name)
		oldBy[name] = c
	}
	check := func(where, file string) {
		data := readFile(t, root, file)
		switch {
		case strings.HasSuffix(file, ".pub"):
			if !containsBytes(publicKeys(t, data), publicKeys(t, tr.oldSA)[0]) {
				t.Errorf("%s: %s lacks the old service-account key", where, file)
			}
		case strings.Contains(file, "front-proxy-ca"):
			if err := verifies(data, oldBy[v1alpha1.AuthorityFrontProxy]); err != nil {
				t.Errorf("%s: %s: %v", where, file, err)
			}
		case strings.Contains(file, "etcd/ca"):
			if err := verifies(data, oldBy[v1alpha1.AuthorityEtcd]); err != nil {
				t.Errorf("%s: %s: %v", where, file, err)
			}
		case strings.Contains(file, "/ca"):
			if err := verifies(data, oldBy[v1alpha1.AuthorityCluster]); err != nil {
				t.Errorf("%s: %s: %v", where, file, err)
			}
		}
	}
	for _, comp := range StaticPodComponents {
		for _, m := range anyFlagFile.FindAllStringSubmatch(string(readFile(t, root, host.Manifest(host.ManifestsDir, comp))), -1) {
			if strings.Contains(m[2], "ca") || strings.HasSuffix(m[2], ".pub") {
				check(comp+" --"+m[1], m[2])
			}
		}
	}
	m := clientCAFileLine.FindStringSubmatch(strings.Split(strings.Split(string(readFile(t, root, KubeletConfigFile)), "x509:\n")[1], "\n")[0])
	check("kubelet clientCAFile", m[2])
	for _, kc := range Kubeconfigs {
		if err := verifies(kubeconfigCA(t, root, kc), tr.oldClient); err != nil {
			t.Errorf("%s: %v", kc, err)
		}
	}
}

func containsBytes(list [][]byte, b []byte) bool {
	return slices.ContainsFunc(list, func(x []byte) bool { return bytes.Equal(x, b) })
}

// An interrupted trust-both resumes without losing the old authorities: the run is cut at each of its
// writes in turn; after every cut each component still trusts the old authorities (nothing
// half-applied: every file is whole, old or new), and a re-run ends in exactly the tree an
// uninterrupted run makes.
func TestTrustBothInterruptedAtEveryWriteKeepsTheOldAndResumes(t *testing.T) {
	template := t.TempDir()
	tr := newKubeadmTree(t, template, true)
	stageNew(t, template)
	copyTree := func() string {
		dir := t.TempDir()
		if err := os.CopyFS(dir, os.DirFS(template)); err != nil {
			t.Fatal(err)
		}
		// CopyFS drops modes beyond 0644/0755-ish; put them back as the template has them.
		err := filepath.WalkDir(template, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(template, p)
			return os.Chmod(filepath.Join(dir, rel), fi.Mode().Perm())
		})
		if err != nil {
			t.Fatal(err)
		}
		return dir
	}
	in := TrustInput{Operation: trustOp, ServiceAccountKey: true}
	ref := copyTree()
	changes, err := TrustBoth(host.NewLocal(ref).Files, in)
	if err != nil {
		t.Fatal(err)
	}
	want := snapshot(t, ref)
	if len(changes) < 10 {
		t.Fatalf("only %d writes to cut", len(changes))
	}
	for n := 1; n <= len(changes); n++ {
		root := copyTree()
		ff := &failingFiles{Files: host.NewLocal(root).Files, n: n}
		if _, err := TrustBoth(ff, in); !errors.Is(err, errCrash) {
			t.Fatalf("cut at write %d: err = %v", n, err)
		}
		trustsOld(t, root, tr)
		if _, err := TrustBoth(host.NewLocal(root).Files, in); err != nil {
			t.Fatalf("resume after a cut at write %d: %v", n, err)
		}
		if got := snapshot(t, root); got != want {
			t.Fatalf("resumed after a cut at write %d, the tree differs from an uninterrupted run's:\n%s", n, diffLines(want, got))
		}
	}
	trustsOld(t, ref, tr)
}
