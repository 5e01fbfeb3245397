package commands

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
)

func localEnv(t *testing.T, files map[string]string, dryRun bool) (*Env, string, *bytes.Buffer) {
	t.Helper()
	root := hosttest.NewRoot(t, files)
	out := &bytes.Buffer{}
	return &Env{NodeName: "node-a", Operation: "op", DryRun: dryRun, Host: host.NewLocal(root), Out: out, Arch: "amd64", Poll: 10 * time.Millisecond}, root, out
}

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// fileServer serves files from a map on the loopback interface.
func fileServer(t *testing.T, files map[string]string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestScript(t *testing.T) {
	env, root, out := localEnv(t, map[string]string{"/var/log/.keep": ""}, false)
	res, err := Run(context.Background(), env, &v1alpha1.Command{Script: &v1alpha1.ScriptCommand{
		Inline: `echo "$NODEOPS_NODE_NAME $NODEOPS_OPERATION $NODEOPS_DRY_RUN $GREETING" >> /var/log/ran; echo done`,
		Env:    []v1alpha1.EnvVar{{Name: "GREETING", Value: "hello"}},
	}})
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := hosttest.ReadFile(t, root, "/var/log/ran"); got != "node-a op false hello\n" {
		t.Errorf("script wrote %q", got)
	}
	if !strings.Contains(out.String(), "done") || res.Message == "" {
		t.Errorf("output %q, message %q", out, res.Message)
	}

	_, err = Run(context.Background(), env, &v1alpha1.Command{Script: &v1alpha1.ScriptCommand{Inline: "echo x > /appended; exit 3"}})
	if host.ExitCode(err) != 3 {
		t.Errorf("exit code %d (%v)", host.ExitCode(err), err)
	}
	if hosttest.ReadFile(t, root, "/appended") != "x\n" {
		t.Errorf("script did not run inside the root")
	}

	dry, root2, _ := localEnv(t, nil, true)
	res, err = Run(context.Background(), dry, &v1alpha1.Command{Script: &v1alpha1.ScriptCommand{Inline: "touch /touched"}})
	if err != nil || hosttest.ReadFile(t, root2, "/touched") != "" || !strings.Contains(res.Message, "dry run") {
		t.Errorf("dry run ran the script: %v %q", err, res.Message)
	}
}

func TestInstallFile(t *testing.T) {
	srv := fileServer(t, map[string]string{"/shim": "new shim"})
	tests := []struct {
		name     string
		sha      string
		dryRun   bool
		mode     string
		wantErr  string
		wantFile string
		wantMode os.FileMode
	}{
		{name: "verified and installed", sha: sum("new shim"), mode: "0755", wantFile: "new shim", wantMode: 0o755},
		{name: "mismatch keeps the old file", sha: sum("something else"), wantErr: "left unchanged", wantFile: "old shim", wantMode: 0o644},
		{name: "dry run changes nothing", sha: sum("new shim"), dryRun: true, wantFile: "old shim", wantMode: 0o644},
		{name: "dry run reports a mismatch", sha: sum("x"), dryRun: true, wantErr: "sha256", wantFile: "old shim", wantMode: 0o644},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, root, _ := localEnv(t, map[string]string{"/opt/bin/shim": "old shim"}, tt.dryRun)
			_, err := Run(context.Background(), env, &v1alpha1.Command{InstallFile: &v1alpha1.InstallFileCommand{
				URL: srv.URL + "/shim", InsecureHTTP: true, SHA256: tt.sha, Path: "/opt/bin/shim", Mode: tt.mode,
			}})
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			if got := hosttest.ReadFile(t, root, "/opt/bin/shim"); got != tt.wantFile {
				t.Errorf("file = %q, want %q", got, tt.wantFile)
			}
			fi, _ := os.Stat(filepath.Join(root, "opt/bin/shim"))
			if fi.Mode().Perm() != tt.wantMode {
				t.Errorf("mode = %v, want %v", fi.Mode().Perm(), tt.wantMode)
			}
			entries, _ := os.ReadDir(filepath.Join(root, "opt/bin"))
			if len(entries) != 1 {
				t.Errorf("files left in /opt/bin: %v", entries)
			}
		})
	}
}

func TestInstallBinariesKeepsPreviousAndIsIdempotent(t *testing.T) {
	srv := fileServer(t, map[string]string{
		"/v1.37.2/bin/linux/amd64/kubelet":        "kubelet v1.37.2",
		"/v1.37.2/bin/linux/amd64/kubelet.sha256": sum("kubelet v1.37.2") + "  kubelet\n",
		"/v1.37.2/bin/linux/amd64/kubectl":        "kubectl tampered",
		"/v1.37.2/bin/linux/amd64/kubectl.sha256": sum("kubectl v1.37.2"),
	})
	env, root, _ := localEnv(t, map[string]string{"/usr/bin/kubelet": "kubelet v1.36.0", "/usr/bin/kubectl": "kubectl v1.36.0"}, false)
	cmd := &v1alpha1.Command{InstallBinaries: &v1alpha1.InstallBinariesCommand{Components: []string{"kubelet"}, Version: "v1.37.2", Source: v1alpha1.BinarySource{BaseURL: srv.URL + "/", InsecureHTTP: true}}}
	for range 2 {
		if _, err := Run(context.Background(), env, cmd); err != nil {
			t.Fatal(err)
		}
	}
	if got := hosttest.ReadFile(t, root, "/usr/bin/kubelet"); got != "kubelet v1.37.2" {
		t.Errorf("kubelet = %q", got)
	}
	if got := hosttest.ReadFile(t, root, "/usr/bin/kubelet"+PrevSuffix); got != "kubelet v1.36.0" {
		t.Errorf("kept kubelet = %q (a second run must not overwrite it)", got)
	}
	_, err := Run(context.Background(), env, &v1alpha1.Command{InstallBinaries: &v1alpha1.InstallBinariesCommand{Components: []string{"kubectl"}, Version: "v1.37.2", Source: v1alpha1.BinarySource{BaseURL: srv.URL, InsecureHTTP: true}}})
	if err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Fatalf("tampered kubectl: err = %v", err)
	}
	if got := hosttest.ReadFile(t, root, "/usr/bin/kubectl"); got != "kubectl v1.36.0" {
		t.Errorf("kubectl = %q after a bad download", got)
	}
}

func TestContainerdRuntimeRestartsContainerd(t *testing.T) {
	cfg, err := os.ReadFile("../../containerdtoml/testdata/containerd/v3-default.toml")
	if err != nil {
		t.Fatal(err)
	}
	env, root, _ := localEnv(t, map[string]string{"/etc/containerd/config.toml": string(cfg)}, false)
	cmd := &v1alpha1.Command{ContainerdRuntime: &v1alpha1.ContainerdRuntimeCommand{Name: "wasmedge", RuntimeType: wasm.RuntimeType, BinaryPath: wasm.BinaryPath}}
	if _, err := Run(context.Background(), env, cmd); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile("../../containerdtoml/testdata/containerd/v3-default.toml.add.golden")
	if got := hosttest.ReadFile(t, root, "/etc/containerd/config.toml"); got != string(want) {
		t.Errorf("config differs from the golden file")
	}
	if log := hosttest.ReadFile(t, root, host.LocalServiceLog); !strings.HasPrefix(log, "restart containerd ") {
		t.Errorf("service table = %q", log)
	}

	dry, root2, _ := localEnv(t, map[string]string{"/etc/containerd/config.toml": string(cfg)}, true)
	if _, err := Run(context.Background(), dry, cmd); err != nil {
		t.Fatal(err)
	}
	if hosttest.ReadFile(t, root2, "/etc/containerd/config.toml") != string(cfg) || hosttest.ReadFile(t, root2, host.LocalServiceLog) != "" {
		t.Errorf("dry run changed the host")
	}
}

func TestPreflight(t *testing.T) {
	env, _, _ := localEnv(t, map[string]string{"/usr/bin/kubeadm": "x"}, false)
	ok := &v1alpha1.Command{Preflight: &v1alpha1.PreflightCommand{Checks: []v1alpha1.PreflightCheck{
		{Binary: "/usr/bin/kubeadm"}, {MinFreeDiskMiB: 1}, {OSFamily: []string{"debian", "rhel"}},
	}}}
	if _, err := Run(context.Background(), env, ok); err != nil {
		t.Fatal(err)
	}
	bad := &v1alpha1.Command{Preflight: &v1alpha1.PreflightCommand{Checks: []v1alpha1.PreflightCheck{
		{Binary: "/usr/bin/kubelet"}, {MinFreeDiskMiB: 1 << 40}, {OSFamily: []string{"rhel"}},
	}}}
	_, err := Run(context.Background(), env, bad)
	for _, want := range []string{"/usr/bin/kubelet is missing", "MiB needed", "OS family debian is not one of rhel"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to say %q", err, want)
		}
	}
}

func TestRestartStaticPodsOnLocalNode(t *testing.T) {
	env, root, _ := localEnv(t, map[string]string{
		"/etc/kubernetes/manifests/kube-apiserver.yaml": "apiserver", "/etc/kubernetes/manifests/etcd.yaml": "etcd",
		// Left out by an interrupted run.
		"/etc/kubernetes/nodeops-moved/kube-scheduler.yaml": "scheduler",
	}, false)
	if _, err := Run(context.Background(), env, &v1alpha1.Command{RestartStaticPods: &v1alpha1.RestartStaticPodsCommand{}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"kube-apiserver", "etcd", "kube-scheduler"} {
		if hosttest.ReadFile(t, root, "/etc/kubernetes/manifests/"+c+".yaml") == "" {
			t.Errorf("manifest of %s not back in place", c)
		}
	}
	log := hosttest.ReadFile(t, root, host.LocalServiceLog)
	for _, c := range []string{"etcd", "kube-apiserver", "kube-scheduler"} {
		if !strings.Contains(log, "restart static-pod/"+c+" ") {
			t.Errorf("service table lacks %s:\n%s", c, log)
		}
	}
}

func TestParseCheckExpiration(t *testing.T) {
	text := `[check-expiration] Reading configuration from the "kubeadm-config" ConfigMap in namespace "kube-system"...

CERTIFICATE                EXPIRES                  RESIDUAL TIME   CERTIFICATE AUTHORITY   EXTERNALLY MANAGED
admin.conf                 Jan 02, 2027 15:04 UTC   364d            ca                      no
apiserver                  Jan 03, 2027 10:00 UTC   365d            ca                      no

CERTIFICATE AUTHORITY   EXPIRES                  RESIDUAL TIME   EXTERNALLY MANAGED
ca                      Dec 30, 2035 15:04 UTC   9y              no
`
	got, err := ParseCheckExpiration([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "admin.conf" || !got[0].NotAfter.Time.Equal(time.Date(2027, 1, 2, 15, 4, 0, 0, time.UTC)) || got[1].Name != "apiserver" {
		t.Errorf("parsed %+v", got)
	}
	js := `[check-expiration] Reading configuration from the cluster...
{
"kind":"CertificateExpirationInfo","certificates":[{"name":"admin.conf","expirationDate":"2027-01-02T15:04:05Z","missing":false},{"name":"etcd-server","missing":true}]}`
	got, err = ParseCheckExpiration([]byte(js))
	if err != nil || len(got) != 1 || got[0].Name != "admin.conf" {
		t.Errorf("parsed %+v, %v", got, err)
	}
	if _, err := ParseCheckExpiration([]byte("nothing")); err == nil {
		t.Errorf("no error for output without certificates")
	}
	cas, err := ParseCheckExpirationAuthorities([]byte(text))
	if err != nil || len(cas) != 1 || cas[0].Name != "ca" || !cas[0].NotAfter.Time.Equal(time.Date(2035, 12, 30, 15, 4, 0, 0, time.UTC)) {
		t.Errorf("authorities %+v, %v", cas, err)
	}
	cas, err = ParseCheckExpirationAuthorities([]byte(js[:len(js)-1] + `,"certificateAuthorities":[{"name":"ca","expirationDate":"2035-12-30T15:04:05Z"},{"name":"etcd-ca","missing":true}]}`))
	if err != nil || len(cas) != 1 || cas[0].Name != "ca" {
		t.Errorf("authorities from JSON %+v, %v", cas, err)
	}
}

// TestRenewCertificatesWithRealKubeadm renews the certificates of a root made by the real kubeadm.
func TestRenewCertificatesWithRealKubeadm(t *testing.T) {
	bin := os.Getenv("NODEOPS_BIN")
	if bin == "" {
		t.Fatal("NODEOPS_BIN is not set: run `make test-unit`, or `export NODEOPS_BIN=\"$PWD/bin\"` in the repository after `make tools`")
	}
	kubeadmBin, err := os.ReadFile(filepath.Join(bin, "kubeadm"))
	if err != nil {
		t.Fatal(err)
	}
	env, root, out := localEnv(t, nil, false)
	hosttest.WriteFile(t, root, "/usr/bin/kubeadm", string(kubeadmBin), 0o755)
	if err := env.Host.Kubeadm.Kubeadm(context.Background(), out, "init", "phase", "certs", "all"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	before, _ := os.Stat(filepath.Join(root, "etc/kubernetes/pki/apiserver.crt"))
	time.Sleep(1100 * time.Millisecond) // certificate times have a resolution of one second

	res, err := Run(context.Background(), env, &v1alpha1.Command{KubeadmRenewCertificates: &v1alpha1.KubeadmRenewCertificatesCommand{Certificates: []string{"apiserver"}}})
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	after, _ := os.Stat(filepath.Join(root, "etc/kubernetes/pki/apiserver.crt"))
	if !after.ModTime().After(before.ModTime()) {
		t.Errorf("apiserver.crt was not renewed")
	}
	names := map[string]bool{}
	for _, c := range res.Certificates {
		names[c.Name] = true
		if c.NotAfter.Before(&metav1.Time{Time: time.Now()}) {
			t.Errorf("certificate %s expires %v", c.Name, c.NotAfter)
		}
	}
	if !names["apiserver"] || !names["front-proxy-client"] {
		t.Errorf("certificates reported: %v", res.Certificates)
	}

	dry, droot, dout := localEnv(t, nil, true)
	hosttest.WriteFile(t, droot, "/usr/bin/kubeadm", string(kubeadmBin), 0o755)
	if err := dry.Host.Kubeadm.Kubeadm(context.Background(), dout, "init", "phase", "certs", "all"); err != nil {
		t.Fatal(err)
	}
	crt := hosttest.ReadFile(t, droot, "/etc/kubernetes/pki/apiserver.crt")
	if _, err := Run(context.Background(), dry, &v1alpha1.Command{KubeadmRenewCertificates: &v1alpha1.KubeadmRenewCertificatesCommand{}}); err != nil {
		t.Fatalf("%v\n%s", err, dout)
	}
	if hosttest.ReadFile(t, droot, "/etc/kubernetes/pki/apiserver.crt") != crt {
		t.Errorf("dry run renewed a certificate")
	}
}

// kubeadm upgrade --dry-run leaves kubeadm-upgrade-*-dryrunNNN directories in /etc/kubernetes/tmp;
// DryRun removes those its run added and nothing else.
func TestRemoveDryRunLeftovers(t *testing.T) {
	write := func(t *testing.T, p string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("directory made by the run", func(t *testing.T) {
		files := &host.FS{Root: t.TempDir()}
		dir := filepath.Join(files.Root, "tmp")
		before, existed, err := dirNames(files, "/tmp")
		if err != nil || existed {
			t.Fatalf("dirNames of a missing dir: %v, %v", existed, err)
		}
		write(t, filepath.Join(dir, "kubeadm-upgrade-node-dryrun123/tmp/config.yaml"))
		removed, err := removeDryRunLeftovers(files, "/tmp", before, existed)
		if err != nil || len(removed) != 1 {
			t.Fatalf("removed %v, %v", removed, err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s is still there (%v)", dir, err)
		}
	})
	t.Run("existing directory keeps what was there and what is not kubeadm's dry run", func(t *testing.T) {
		files := &host.FS{Root: t.TempDir()}
		dir := filepath.Join(files.Root, "tmp")
		write(t, filepath.Join(dir, "kubeadm-backup-manifests-1/etcd.yaml"))
		write(t, filepath.Join(dir, "kubeadm-upgrade-apply-dryrun1/config.yaml"))
		before, existed, err := dirNames(files, "/tmp")
		if err != nil || !existed {
			t.Fatal(existed, err)
		}
		write(t, filepath.Join(dir, "kubeadm-upgrade-apply-dryrun2/config.yaml"))
		write(t, filepath.Join(dir, "someone-else"))
		removed, err := removeDryRunLeftovers(files, "/tmp", before, existed)
		if err != nil || len(removed) != 1 || removed[0] != "kubeadm-upgrade-apply-dryrun2" {
			t.Fatalf("removed %v, %v", removed, err)
		}
		now, _, _ := dirNames(files, "/tmp")
		if len(now) != 3 || !now["kubeadm-backup-manifests-1"] || !now["kubeadm-upgrade-apply-dryrun1"] || !now["someone-else"] {
			t.Errorf("left %v", now)
		}
	})
}

// The runtime-socket check finds the node's own socket where kubeadm configured the kubelet with
// it, in either of the places kubeadm writes it; containerd's default otherwise.
func TestKubeletRuntimeEndpoint(t *testing.T) {
	for _, tc := range []struct{ name, file, content, want string }{
		{"config", "/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/x/containerd.sock\n", "/run/x/containerd.sock"},
		{"flags", "/var/lib/kubelet/kubeadm-flags.env", `KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/y.sock --pod-infra-container-image=p"` + "\n", "/run/y.sock"},
		{"neither", "/etc/hostname", "n\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, _, _ := localEnv(t, map[string]string{tc.file: tc.content}, false)
			if got := kubeletRuntimeEndpoint(env); got != tc.want {
				t.Errorf("endpoint %q, want %q", got, tc.want)
			}
		})
	}
}

// overlappingKubeadm is a kubeadm whose dry run writes its scratch directory under
// /etc/kubernetes/tmp as it goes: the first run, once it made its directory, gives a second one the
// time to start; the second writes its last file a moment later.
type overlappingKubeadm struct {
	root                      string
	firstWrote, secondStarted chan struct{}
	n                         atomic.Int32
}

func (k *overlappingKubeadm) Kubeadm(context.Context, io.Writer, ...string) error {
	n := k.n.Add(1)
	dir := filepath.Join(k.root, "etc/kubernetes/tmp", fmt.Sprintf("kubeadm-upgrade-node-dryrun%d", n))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if n == 1 {
		close(k.firstWrote)
		select {
		case <-k.secondStarted:
		case <-time.After(300 * time.Millisecond): // no second run during this one
		}
	} else {
		close(k.secondStarted)
		time.Sleep(100 * time.Millisecond)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.yaml"), []byte("x"), 0o600)
}

// TestKubeadmDryRunsLeaveNoScratchDirectory: a DryRun task's kubeadm dry run and the drift
// reader's, on one node at once, leave /etc/kubernetes/tmp as it was (here: absent).
func TestKubeadmDryRunsLeaveNoScratchDirectory(t *testing.T) {
	env, root, _ := localEnv(t, nil, false)
	k := &overlappingKubeadm{root: root, firstWrote: make(chan struct{}), secondStarted: make(chan struct{})}
	env.Host.Kubeadm = k
	var wg sync.WaitGroup
	errs := make([]error, 2)
	run := func(i int) {
		defer wg.Done()
		errs[i] = kubeadmDryRun(context.Background(), &Env{Host: env.Host, Out: io.Discard}, "upgrade", "node")
	}
	wg.Add(2)
	go run(0)
	<-k.firstWrote // the second starts while the first runs
	go run(1)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/kubernetes/tmp")); !os.IsNotExist(err) {
		entries, _ := os.ReadDir(filepath.Join(root, "etc/kubernetes/tmp"))
		t.Fatalf("/etc/kubernetes/tmp left behind by two dry runs at once (%v, holding %v)", err, entries)
	}
}
