package cakeys

import (
	"bytes"
	"crypto/x509"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// kubeadmCerts runs the real kubeadm's `init phase certs all` on root's /etc/kubernetes/pki: it keeps
// the authorities and leaf certificates there and issues the missing leaves from those authorities.
func kubeadmCerts(t *testing.T, root string) {
	t.Helper()
	bin := os.Getenv("NODEOPS_BIN")
	if bin == "" {
		t.Fatal("NODEOPS_BIN is not set: run `make test-unit`, or `export NODEOPS_BIN=\"$PWD/bin\"` in the repository after `make tools`")
	}
	out, err := exec.Command(filepath.Join(bin, "kubeadm"), "init", "phase", "certs", "all", "--cert-dir", filepath.Join(root, PKIDirectory)).CombinedOutput()
	if err != nil {
		t.Fatalf("kubeadm init phase certs all: %v\n%s", err, out)
	}
}

// kubeletClientCert is where kubelet.conf names the kubelet's client certificate, as kubeadm writes it.
const kubeletClientCert = "/var/lib/kubelet/pki/kubelet-client-current.pem"

// completeTree is a control plane as phase re-issue leaves it: the old authorities' leaves issued by
// kubeadm, trust-both run, then the new authorities moved into /etc/kubernetes/pki and every leaf
// issued again by kubeadm from them; the kubeconfigs' client certificates are the new authority's and
// their certificate-authority-data still the bundle. kubelet.conf names its client certificate file.
type completeTree struct {
	kubeadmTree
	fresh map[string]authority
	// oldLeaves are the leaf certificates as the old authorities issued them, by path under pki.
	oldLeaves map[string][]byte
	newSA     []byte // the new sa.pub
}

func newCompleteTree(t *testing.T, root string) completeTree {
	t.Helper()
	ct := completeTree{kubeadmTree: newKubeadmTree(t, root, true), oldLeaves: map[string][]byte{}}
	kubeadmCerts(t, root)
	ct.fresh = stageNew(t, root)
	ct.newSA = readFile(t, root, staged("sa.pub"))
	files := host.NewLocal(root).Files
	if _, err := TrustBoth(files, TrustInput{Operation: trustOp, ServiceAccountKey: true}); err != nil {
		t.Fatal(err)
	}
	// Phase re-issue, as another command will do it: the new authorities replace the old files and
	// kubeadm issues every leaf again.
	for _, p := range append(mustPairs(t), serviceAccountPair) {
		writeFile(t, root, pki(p.Cert), readFile(t, root, staged(p.Cert)), 0o644)
		writeFile(t, root, pki(p.Key), readFile(t, root, staged(p.Key)), 0o600)
	}
	for _, leaves := range leafCertificates {
		for _, l := range leaves {
			ct.oldLeaves[l] = readFile(t, root, pki(l))
			for _, f := range []string{pki(l), pki(strings.TrimSuffix(l, ".crt") + ".key")} {
				if err := os.Remove(filepath.Join(root, f)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	kubeadmCerts(t, root)
	for _, kc := range Kubeconfigs {
		cfg, err := clientcmd.Load(readFile(t, root, kc))
		if err != nil {
			t.Fatal(err)
		}
		_, certPEM, keyPEM := ct.fresh[v1alpha1.AuthorityCluster].issue(t, "kubernetes-admin")
		u := cfg.AuthInfos["kubernetes-admin"]
		if kc == "/etc/kubernetes/kubelet.conf" {
			writeFile(t, root, kubeletClientCert, append(certPEM, keyPEM...), 0o600)
			u.ClientCertificateData, u.ClientKeyData = nil, nil
			u.ClientCertificate, u.ClientKey = kubeletClientCert, kubeletClientCert
		} else {
			u.ClientCertificateData, u.ClientKeyData = certPEM, keyPEM
		}
		data, err := clientcmd.Write(*cfg)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, root, kc, data, 0o600)
	}
	return ct
}

func mustPairs(t *testing.T) []Pair {
	t.Helper()
	p, err := Pairs(nil, false)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// acceptsTheNew fails unless every component of the control plane at root accepts the node's
// re-issued leaves and refuses the old authorities' certificates: the CA files the static pods' flags
// and the kubelet name exist and verify the new authority's certificates, and every kubeconfig's
// certificate-authority-data verifies the re-issued API server certificate. With done, also that
// nothing trusts the old authorities any more.
func acceptsTheNew(t *testing.T, root string, ct completeTree, done bool) {
	t.Helper()
	check := func(where, file string) {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Errorf("%s names %s: %v", where, file, err)
			return
		}
		if strings.HasSuffix(file, ".pub") {
			if !containsBytes(publicKeys(t, data), publicKeys(t, ct.newSA)[0]) {
				t.Errorf("%s: %s lacks the new service-account key", where, file)
			}
			if done && containsBytes(publicKeys(t, data), publicKeys(t, ct.oldSA)[0]) {
				t.Errorf("%s: %s still holds the old service-account key", where, file)
			}
			return
		}
		name := v1alpha1.AuthorityCluster
		switch {
		case strings.Contains(file, "front-proxy-ca"):
			name = v1alpha1.AuthorityFrontProxy
		case strings.Contains(file, "etcd/ca"):
			name = v1alpha1.AuthorityEtcd
		}
		c, _, _ := ct.fresh[name].issue(t, "new-"+name)
		if err := verifies(data, c); err != nil {
			t.Errorf("%s: %s refuses the new %s authority: %v", where, file, name, err)
		}
		if done {
			o, _, _ := ct.old[name].issue(t, "old-"+name)
			if verifies(data, o) == nil {
				t.Errorf("%s: %s still accepts the old %s authority", where, file, name)
			}
		}
	}
	for _, comp := range StaticPodComponents {
		for _, m := range anyFlagFile.FindAllStringSubmatch(string(readFile(t, root, host.Manifest(host.ManifestsDir, comp))), -1) {
			if strings.Contains(m[2], "ca") && !strings.Contains(m[2], ".key") || strings.HasSuffix(m[2], ".pub") {
				check(comp+" --"+m[1], m[2])
			}
		}
	}
	m := clientCAFileLine.FindStringSubmatch(strings.Split(strings.Split(string(readFile(t, root, KubeletConfigFile)), "x509:\n")[1], "\n")[0])
	check("kubelet clientCAFile", m[2])
	apiserver, err := parseCert(readFile(t, root, pki("apiserver.crt")))
	if err != nil {
		t.Fatal(err)
	}
	for _, kc := range Kubeconfigs {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(kubeconfigCA(t, root, kc))
		if _, err := apiserver.Verify(x509.VerifyOptions{Roots: pool}); err != nil {
			t.Errorf("%s refuses the re-issued API server certificate: %v", kc, err)
		}
		if done {
			if err := verifies(kubeconfigCA(t, root, kc), ct.oldClient); err == nil {
				t.Errorf("%s still trusts the old cluster authority", kc)
			}
		}
	}
}

// Phase complete on a control plane: every flag names the single (now new) file again, every
// kubeconfig and the kubelet trust the new authority alone, the API server verifies tokens with the
// new service-account key alone, the bundles and the staging directory are gone, and a second run
// (without the staging directory) changes nothing.
func TestCompleteOnAControlPlane(t *testing.T) {
	root := t.TempDir()
	ct := newCompleteTree(t, root)
	newSA := readFile(t, root, staged("sa.pub"))
	files := host.NewLocal(root).Files

	changes, err := TrustNewOnly(files, TrustInput{Operation: trustOp, ServiceAccountKey: true})
	if err != nil {
		t.Fatal(err)
	}
	var changed []string
	for _, c := range changes {
		changed = append(changed, c.Path)
		if len(c.Before) == 0 || len(c.After) == 0 {
			t.Errorf("%s: no words for what it trusts before or after: %s", c.Path, c)
		}
	}
	want := append([]string(nil), Kubeconfigs...)
	want = append(want, KubeletConfigFile)
	for _, comp := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		want = append(want, host.Manifest(host.ManifestsDir, comp))
	}
	want = append(want, pki("ca-bundle.crt"), pki("etcd/ca-bundle.crt"), pki("front-proxy-ca-bundle.crt"), pki("sa-bundle.pub"), v1alpha1.StagingDirectory)
	if strings.Join(changed, "\n") != strings.Join(want, "\n") {
		t.Fatalf("changed\n%s\nwant\n%s", strings.Join(changed, "\n"), strings.Join(want, "\n"))
	}

	for _, f := range []struct{ comp, flag, want string }{
		{"kube-apiserver", "client-ca-file", pki("ca.crt")},
		{"kube-apiserver", "etcd-cafile", pki("etcd/ca.crt")},
		{"kube-apiserver", "requestheader-client-ca-file", pki("front-proxy-ca.crt")},
		{"kube-apiserver", "service-account-key-file", pki("sa.pub")},
		{"kube-apiserver", "service-account-signing-key-file", pki("sa.key")},
		{"kube-controller-manager", "root-ca-file", pki("ca.crt")},
		{"kube-controller-manager", "requestheader-client-ca-file", pki("front-proxy-ca.crt")},
		{"kube-controller-manager", "cluster-signing-cert-file", pki("ca.crt")},
		{"etcd", "trusted-ca-file", pki("etcd/ca.crt")},
		{"etcd", "peer-trusted-ca-file", pki("etcd/ca.crt")},
	} {
		if got := flagValue(t, root, f.comp, f.flag); got != f.want {
			t.Errorf("%s --%s=%s, want %s", f.comp, f.flag, got, f.want)
		}
	}
	if !strings.Contains(string(readFile(t, root, KubeletConfigFile)), "    clientCAFile: "+pki("ca.crt")+"\n") {
		t.Errorf("kubelet configuration:\n%s", readFile(t, root, KubeletConfigFile))
	}
	if !bytes.Equal(readFile(t, root, pki("sa.pub")), newSA) {
		t.Error("sa.pub is not the new service-account key")
	}
	for _, p := range []string{pki("ca-bundle.crt"), pki("etcd/ca-bundle.crt"), pki("front-proxy-ca-bundle.crt"), pki("sa-bundle.pub"), v1alpha1.StagingDirectory} {
		if _, err := os.Stat(filepath.Join(root, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is still there (%v)", p, err)
		}
	}
	acceptsTheNew(t, root, ct, true)
	for _, kc := range Kubeconfigs {
		if fi, _ := os.Stat(filepath.Join(root, kc)); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %04o, want 0600 as before", kc, fi.Mode().Perm())
		}
	}

	again, err := TrustNewOnly(files, TrustInput{Operation: trustOp, ServiceAccountKey: true})
	if err != nil || len(again) != 0 {
		t.Fatalf("a second run changed %v (%v)", again, err)
	}
}

// Complete refuses, writing nothing, a control plane where dropping the old authorities would lock a
// component out: re-issue not run, a leaf certificate or a kubeconfig's or the kubelet's client
// certificate still the old authority's, or a node still trusting a bundle with nothing left to show
// that re-issue ran.
func TestCompleteRefusesToLockAComponentOut(t *testing.T) {
	template := t.TempDir()
	ct := newCompleteTree(t, template)
	for _, tt := range []struct {
		name  string
		spoil func(t *testing.T, root string, ct completeTree)
		want  string
	}{
		{"re-issue not run", func(t *testing.T, root string, ct completeTree) {
			writeFile(t, root, pki("etcd/ca.crt"), ct.old[v1alpha1.AuthorityEtcd].certPEM, 0o644)
		}, "phase re-issue (reissueCertificates) has not run on this node"},
		{"an old leaf", func(t *testing.T, root string, ct completeTree) {
			writeFile(t, root, pki("apiserver.crt"), ct.oldLeaves["apiserver.crt"], 0o644)
		}, `/etc/kubernetes/pki/apiserver.crt ("kube-apiserver", issued by "kubernetes") does not verify against the new authority`},
		{"an old etcd peer certificate", func(t *testing.T, root string, ct completeTree) {
			writeFile(t, root, pki("etcd/peer.crt"), ct.oldLeaves["etcd/peer.crt"], 0o644)
		}, "/etc/kubernetes/pki/etcd/peer.crt"},
		{"the kubelet's old client certificate", func(t *testing.T, root string, ct completeTree) {
			_, certPEM, keyPEM := ct.old[v1alpha1.AuthorityCluster].issue(t, "system:node:cp")
			writeFile(t, root, kubeletClientCert, append(certPEM, keyPEM...), 0o600)
		}, "/etc/kubernetes/kubelet.conf user kubernetes-admin's client certificate " + kubeletClientCert},
		{"an old admin.conf", func(t *testing.T, root string, ct completeTree) {
			writeFile(t, root, "/etc/kubernetes/admin.conf", ct.kubeconfig, 0o600)
		}, "/etc/kubernetes/admin.conf user kubernetes-admin's client certificate"},
		{"staging directory gone before complete", func(t *testing.T, root string, ct completeTree) {
			if err := os.RemoveAll(filepath.Join(root, v1alpha1.StagingDirectory)); err != nil {
				t.Fatal(err)
			}
		}, "nothing shows that phase re-issue ran on this node"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := copyTree(t, template)
			tt.spoil(t, root, ct)
			before := snapshot(t, root)
			_, err := TrustNewOnly(host.NewLocal(root).Files, TrustInput{Operation: trustOp, ServiceAccountKey: true})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v\nwant %q", err, tt.want)
			}
			if after := snapshot(t, root); after != before {
				t.Fatalf("files changed:\n%s", diffLines(before, after))
			}
		})
	}
}

// cutFiles fails the n-th change (a write or a removal, counting from 1), as a crash there would.
type cutFiles struct {
	host.Files
	n, changes int
}

func (f *cutFiles) cut() bool { f.changes++; return f.changes == f.n }

func (f *cutFiles) WriteFileAtomic(p string, data []byte, mode fs.FileMode) error {
	if f.cut() {
		return errCrash
	}
	return f.Files.WriteFileAtomic(p, data, mode)
}

func (f *cutFiles) Remove(p string) error {
	if f.cut() {
		return errCrash
	}
	return f.Files.Remove(p)
}

func (f *cutFiles) RemoveAll(p string) error {
	if f.cut() {
		return errCrash
	}
	return f.Files.RemoveAll(p)
}

// An interrupted complete never locks a component out and resumes: the run is cut at each of its
// writes and removals in turn; after every cut each CA file a component names is there and trusts the
// new authorities, every kubeconfig accepts the re-issued API server certificate, and a re-run ends
// in exactly the tree an uninterrupted run makes.
func TestCompleteInterruptedAtEveryWriteNeverLocksOutAndResumes(t *testing.T) {
	template := t.TempDir()
	ct := newCompleteTree(t, template)
	copyTree := func() string {
		dir := t.TempDir()
		if err := os.CopyFS(dir, os.DirFS(template)); err != nil {
			t.Fatal(err)
		}
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
	changes, err := TrustNewOnly(host.NewLocal(ref).Files, in)
	if err != nil {
		t.Fatal(err)
	}
	want := snapshot(t, ref)
	if len(changes) < 10 {
		t.Fatalf("only %d changes to cut", len(changes))
	}
	for n := 1; n <= len(changes); n++ {
		root := copyTree()
		ff := &cutFiles{Files: host.NewLocal(root).Files, n: n}
		if _, err := TrustNewOnly(ff, in); !errors.Is(err, errCrash) {
			t.Fatalf("cut at change %d: err = %v", n, err)
		}
		acceptsTheNew(t, root, ct, false)
		if _, err := TrustNewOnly(host.NewLocal(root).Files, in); err != nil {
			t.Fatalf("resume after a cut at change %d: %v", n, err)
		}
		if got := snapshot(t, root); got != want {
			t.Fatalf("resumed after a cut at change %d, the tree differs from an uninterrupted run's:\n%s", n, diffLines(want, got))
		}
	}
	acceptsTheNew(t, ref, ct, true)
}

// A DryRun lists every file complete would change with what it trusts before and after, and changes
// nothing.
func TestCompleteDryRunChangesNothing(t *testing.T) {
	root := t.TempDir()
	newCompleteTree(t, root)
	before := snapshot(t, root)
	var out bytes.Buffer
	changes, err := TrustNewOnly(host.NewLocal(root).DryRun(&out).Files, TrustInput{Operation: trustOp, ServiceAccountKey: true})
	if err != nil {
		t.Fatal(err)
	}
	if after := snapshot(t, root); after != before {
		t.Fatalf("a dry run changed files:\n%s", diffLines(before, after))
	}
	if len(changes) != 14 {
		t.Errorf("%d changes listed, want 14", len(changes))
	}
	for _, c := range changes {
		if !strings.Contains(out.String(), c.Path) {
			t.Errorf("the dry run does not report %s:\n%s", c.Path, out.String())
		}
	}
	text := ""
	for _, c := range changes {
		text += c.String() + "\n"
	}
	for _, w := range []string{
		`/etc/kubernetes/admin.conf: trusts CA "kubernetes"`,
		"/etc/kubernetes/pki/ca-bundle.crt: trusts CA",
		"after: (removed)",
		"kube-apiserver.yaml: trusts --client-ca-file=/etc/kubernetes/pki/ca-bundle.crt,",
		"after: --client-ca-file=/etc/kubernetes/pki/ca.crt (CA \"kubernetes\"",
	} {
		if !strings.Contains(text, w) {
			t.Errorf("changes lack %q:\n%s", w, text)
		}
	}
	if strings.Contains(text+out.String(), "PRIVATE KEY") {
		t.Error("a key in the dry run's output (rule 15)")
	}
}

// A worker trusts the cluster authority the control planes publish alone once they do: its
// kubelet.conf, ca.crt and clientCAFile; while the published bundle still holds the old authority it
// waits, a bundle it does not trust or an old kubelet client certificate is refused, and nothing
// changes until it goes on.
func TestCompleteOnAWorker(t *testing.T) {
	cpRoot, root := t.TempDir(), t.TempDir()
	tr := newKubeadmTree(t, root, false)
	fresh := stageNew(t, cpRoot)
	oldPEM := tr.old[v1alpha1.AuthorityCluster].certPEM
	newPEM := fresh[v1alpha1.AuthorityCluster].certPEM
	both := append(append([]byte(nil), oldPEM...), newPEM...)
	files := host.NewLocal(root).Files
	if _, err := TrustBoth(files, TrustInput{Operation: trustOp, NewClusterCA: both}); err != nil {
		t.Fatal(err)
	}
	// Phase re-issue: the kubelet's client certificate from the new authority, in its file.
	useClient := func(a authority) {
		_, certPEM, keyPEM := a.issue(t, "system:node:w")
		writeFile(t, root, kubeletClientCert, append(certPEM, keyPEM...), 0o600)
		cfg, err := clientcmd.Load(readFile(t, root, "/etc/kubernetes/kubelet.conf"))
		if err != nil {
			t.Fatal(err)
		}
		u := cfg.AuthInfos["kubernetes-admin"]
		u.ClientCertificateData, u.ClientKeyData, u.ClientCertificate, u.ClientKey = nil, nil, kubeletClientCert, kubeletClientCert
		data, _ := clientcmd.Write(*cfg)
		writeFile(t, root, "/etc/kubernetes/kubelet.conf", data, 0o600)
	}
	useClient(tr.old[v1alpha1.AuthorityCluster])
	before := snapshot(t, root)
	stranger := newAuthority(t).certPEM
	for _, tt := range []struct {
		name      string
		published []byte
		want      string
	}{
		{"still both", both, "the old authority is still published"},
		{"not this cluster's", stranger, "holds an authority this node does not trust"},
		{"an old kubelet client certificate", newPEM, "does not verify against the new authority"},
	} {
		_, err := TrustNewOnly(files, TrustInput{Operation: trustOp, NewClusterCA: tt.published})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want %q", tt.name, err, tt.want)
		}
		if tt.name == "still both" && !errors.Is(err, ErrOldStillPublished) {
			t.Errorf("still both: %v is not ErrOldStillPublished (the agent waits on it)", err)
		}
		if after := snapshot(t, root); after != before {
			t.Fatalf("%s: files changed:\n%s", tt.name, diffLines(before, after))
		}
	}

	useClient(fresh[v1alpha1.AuthorityCluster])
	changes, err := TrustNewOnly(files, TrustInput{Operation: trustOp, NewClusterCA: newPEM})
	if err != nil {
		t.Fatal(err)
	}
	var changed []string
	for _, c := range changes {
		changed = append(changed, c.Path)
	}
	if want := "/etc/kubernetes/kubelet.conf," + pki("ca.crt") + "," + KubeletConfigFile + "," + pki("ca-bundle.crt"); strings.Join(changed, ",") != want {
		t.Fatalf("changed %v, want %s", changed, want)
	}
	newClient, _, _ := fresh[v1alpha1.AuthorityCluster].issue(t, "kube-apiserver-kubelet-client")
	for _, b := range [][]byte{readFile(t, root, pki("ca.crt")), kubeconfigCA(t, root, "/etc/kubernetes/kubelet.conf")} {
		if err := verifies(b, newClient); err != nil {
			t.Errorf("the new cluster authority's certificate does not verify: %v", err)
		}
		if err := verifies(b, tr.oldClient); err == nil {
			t.Error("the old cluster authority's certificate still verifies")
		}
	}
	if !strings.Contains(string(readFile(t, root, KubeletConfigFile)), "    clientCAFile: "+pki("ca.crt")+"\n") {
		t.Errorf("kubelet configuration:\n%s", readFile(t, root, KubeletConfigFile))
	}
	again, err := TrustNewOnly(files, TrustInput{Operation: trustOp, NewClusterCA: newPEM})
	if err != nil || len(again) != 0 {
		t.Fatalf("a second run changed %v (%v)", again, err)
	}
}
