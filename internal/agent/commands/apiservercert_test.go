package commands

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeops/nodeops/internal/host/hosttest"
	"github.com/nodeops/nodeops/internal/kubeadmconfig"
)

const certCluster = `apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.37.2
controlPlaneEndpoint: 127.0.0.1:6443
certificatesDir: /etc/kubernetes/pki
encryptionAlgorithm: ECDSA-P256
apiServer:
  certSANs:
  - 127.0.0.1
`

var newSANs = []string{"api.example.com", "10.9.9.9"}

// certRoot is a control plane's root made by the real kubeadm: its PKI and API server manifest from
// certCluster, and the ClusterConfiguration as kubeadmUpdateConfig leaves it, with newSANs added.
func certRoot(t *testing.T, dryRun bool) (*Env, string, string) {
	t.Helper()
	bin := os.Getenv("NODEOPS_BIN")
	if bin == "" {
		t.Fatal("NODEOPS_BIN is not set: run `make test-unit`, or `export NODEOPS_BIN=\"$PWD/bin\"` in the repository after `make tools`")
	}
	kubeadmBin, err := os.ReadFile(filepath.Join(bin, "kubeadm"))
	if err != nil {
		t.Fatal(err)
	}
	env, root, out := localEnv(t, nil, dryRun)
	env.NodeName = "cp-1"
	hosttest.WriteFile(t, root, "/usr/bin/kubeadm", string(kubeadmBin), 0o755)
	hosttest.WriteFile(t, root, "/root/kubeadm.yaml", "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\nlocalAPIEndpoint:\n  advertiseAddress: 192.0.2.10\n  bindPort: 6443\nnodeRegistration:\n  name: cp-1\n---\n"+certCluster, 0o600)
	for _, phase := range [][]string{{"certs", "all"}, {"control-plane", "apiserver"}} {
		args := append(append([]string{"init", "phase"}, phase...), "--config", "/root/kubeadm.yaml")
		if err := env.Host.Kubeadm.Kubeadm(context.Background(), out, args...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	if err := os.Remove(filepath.Join(root, "root/kubeadm.yaml")); err != nil {
		t.Fatal(err)
	}
	patched, err := kubeadmconfig.PatchClusterConfiguration(certCluster, sansPatch(newSANs))
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	return env, root, patched
}

// pair is a root's live or saved apiserver.crt and apiserver.key.
type pair struct{ crt, key string }

func readPair(t *testing.T, root, dir string) pair {
	t.Helper()
	return pair{hosttest.ReadFile(t, root, dir+"/apiserver.crt"), hosttest.ReadFile(t, root, dir+"/apiserver.key")}
}

// checkIssued: the live pair is a key and its certificate, with every new name and the old ones.
func checkIssued(t *testing.T, root string, old pair) {
	t.Helper()
	live := readPair(t, root, "/etc/kubernetes/pki")
	if _, err := tls.X509KeyPair([]byte(live.crt), []byte(live.key)); err != nil {
		t.Fatalf("the live apiserver.crt and apiserver.key are no pair: %v", err)
	}
	cert := parseCert(t, live.crt)
	if missing := missingNames(cert, append([]string{"cp-1", "192.0.2.10", "127.0.0.1", "kubernetes.default.svc"}, newSANs...)); len(missing) > 0 {
		t.Errorf("the issued certificate lacks %v: %s", missing, certificateNames(cert))
	}
	if live == old {
		t.Errorf("the old pair is still the live one")
	}
}

func parseCert(t *testing.T, s string) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode([]byte(s))
	if block == nil {
		t.Fatalf("no PEM in %q", s)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// The real kubeadm re-issues the certificate with the new names; the old pair is saved first, and run
// again the command keeps the certificate it issued (nothing issued twice) and the record it saved.
func TestReissueAPIServerCertificateWithRealKubeadm(t *testing.T) {
	env, root, cluster := certRoot(t, false)
	old := readPair(t, root, "/etc/kubernetes/pki")
	if missing := missingNames(parseCert(t, old.crt), newSANs); len(missing) != len(newSANs) {
		t.Fatalf("the first certificate already has %v", newSANs)
	}
	res, err := ReissueAPIServerCertificate(context.Background(), env, cluster, newSANs)
	if err != nil {
		t.Fatalf("%v\n%s", err, env.Out)
	}
	checkIssued(t, root, old)
	if saved := readPair(t, root, APIServerCertificateBackup); saved != old {
		t.Errorf("the saved pair is not the old one")
	}
	if !strings.Contains(res.Message, "re-issued") {
		t.Errorf("message %q", res.Message)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/kubernetes/tmp/nodeops-certs-apiserver.yaml")); !os.IsNotExist(err) {
		t.Errorf("kubeadm's configuration was left on the node (%v)", err)
	}

	issued := readPair(t, root, "/etc/kubernetes/pki")
	res, err = ReissueAPIServerCertificate(context.Background(), env, cluster, newSANs)
	if err != nil {
		t.Fatal(err)
	}
	if readPair(t, root, "/etc/kubernetes/pki") != issued || readPair(t, root, APIServerCertificateBackup) != old {
		t.Errorf("run again, it issued again or overwrote the saved pair")
	}
	if !strings.Contains(res.Message, "kept, not re-issued") {
		t.Errorf("message %q", res.Message)
	}
}

// Every state an interrupted run can leave is resumed: the old pair stays saved and the node ends with
// a new certificate and its own key; a node that lost its certificate otherwise gets nothing issued.
func TestReissueAPIServerCertificateResumesAnInterruptedRun(t *testing.T) {
	save := func(t *testing.T, root string, p pair) {
		hosttest.WriteFile(t, root, APIServerCertificateBackup+"/apiserver.crt", p.crt, 0o644)
		hosttest.WriteFile(t, root, APIServerCertificateBackup+"/apiserver.key", p.key, 0o600)
	}
	remove := func(t *testing.T, root, p string) {
		if err := os.Remove(filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name        string
		interrupt   func(t *testing.T, root string, old pair)
		wantRefused string
	}{
		{"key saved, certificate not yet", func(t *testing.T, root string, old pair) {
			hosttest.WriteFile(t, root, APIServerCertificateBackup+"/apiserver.key", old.key, 0o600)
		}, ""},
		{"saved, nothing moved", save, ""},
		{"saved, certificate moved, key left", func(t *testing.T, root string, old pair) {
			save(t, root, old)
			remove(t, root, "/etc/kubernetes/pki/apiserver.crt")
		}, ""},
		{"saved, both moved", func(t *testing.T, root string, old pair) {
			save(t, root, old)
			remove(t, root, "/etc/kubernetes/pki/apiserver.crt")
			remove(t, root, "/etc/kubernetes/pki/apiserver.key")
		}, ""},
		{"kubeadm wrote its new key, not the certificate", func(t *testing.T, root string, old pair) {
			save(t, root, old)
			remove(t, root, "/etc/kubernetes/pki/apiserver.crt")
			hosttest.WriteFile(t, root, "/etc/kubernetes/pki/apiserver.key", newKeyPEM(t), 0o600)
		}, ""},
		{"certificate lost, nothing saved", func(t *testing.T, root string, old pair) {
			remove(t, root, "/etc/kubernetes/pki/apiserver.crt")
		}, "no old pair is saved"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, root, cluster := certRoot(t, false)
			old := readPair(t, root, "/etc/kubernetes/pki")
			tc.interrupt(t, root, old)
			_, err := ReissueAPIServerCertificate(context.Background(), env, cluster, newSANs)
			if tc.wantRefused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantRefused) {
					t.Fatalf("err %v, want it refused with %q", err, tc.wantRefused)
				}
				if _, err := os.Stat(filepath.Join(root, "etc/kubernetes/pki/apiserver.crt")); !os.IsNotExist(err) {
					t.Errorf("a certificate was issued (%v)", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, env.Out)
			}
			checkIssued(t, root, old)
			if saved := readPair(t, root, APIServerCertificateBackup); saved != old {
				t.Errorf("the saved pair is not the old one: the old pair is lost")
			}
		})
	}
}

func newKeyPEM(t *testing.T) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
}

// A DryRun prints the names before and after, from a certificate kubeadm issued in a scratch
// directory, and leaves every file of the node as it was.
func TestPreviewAPIServerCertificateChangesNothing(t *testing.T) {
	env, root, cluster := certRoot(t, true)
	before := snapshot(t, root)
	if _, err := PreviewAPIServerCertificate(context.Background(), env, cluster, newSANs); err != nil {
		t.Fatalf("%v\n%s", err, env.Out)
	}
	out := env.Out.(interface{ String() string }).String()
	for _, want := range []string{
		"dry run: cp-1 apiserver.crt would be re-issued:\n  names: DNS cp-1, kubernetes, kubernetes.default, kubernetes.default.svc, kubernetes.default.svc.cluster.local; IP 10.96.0.1, 127.0.0.1, 192.0.2.10\n",
		"      -> DNS api.example.com, cp-1, kubernetes, kubernetes.default, kubernetes.default.svc, kubernetes.default.svc.cluster.local; IP 10.9.9.9, 10.96.0.1, 127.0.0.1, 192.0.2.10\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if after := snapshot(t, root); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Errorf("the DryRun changed the node's files:\nbefore %v\nafter  %v", before, after)
	}
}

// snapshot lists every file under root/etc with its content.
func snapshot(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(filepath.Join(root, "etc"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			out = append(out, p)
			return err
		}
		b, err := os.ReadFile(p)
		out = append(out, p+" "+string(b))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
