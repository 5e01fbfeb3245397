package commands

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host/hosttest"
)

// tlsFileServer serves files over real TLS with httptest's own certificate, which no system trusts;
// it counts the requests it gets.
func tlsFileServer(t *testing.T, files map[string]string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		body, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func caBundle(srv *httptest.Server) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
}

func runCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A download over https trusts the system's CAs and those of the command's caBundle, no others.
func TestHTTPSDownloadTrustsItsCABundle(t *testing.T) {
	srv, _ := tlsFileServer(t, map[string]string{
		"/shim":                            "new shim",
		"/v1.37.2/bin/linux/amd64/kubelet": "kubelet v1.37.2",
		"/v1.37.2/bin/linux/amd64/kubelet.sha256": sum("kubelet v1.37.2"),
	})
	env, root, _ := localEnv(t, map[string]string{"/opt/bin/shim": "old shim", "/usr/bin/kubelet": "kubelet v1.36.0"}, false)
	file := &v1alpha1.InstallFileCommand{URL: srv.URL + "/shim", SHA256: sum("new shim"), Path: "/opt/bin/shim"}
	bins := &v1alpha1.InstallBinariesCommand{Components: []string{"kubelet"}, Version: "v1.37.2", Source: v1alpha1.BinarySource{BaseURL: srv.URL}}

	_, err := Run(runCtx(t), env, &v1alpha1.Command{InstallFile: file})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("installFile without caBundle: err = %v, want a certificate error", err)
	}
	_, err = Run(runCtx(t), env, &v1alpha1.Command{InstallBinaries: bins})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("installBinaries without caBundle: err = %v, want a certificate error", err)
	}
	if got := hosttest.ReadFile(t, root, "/opt/bin/shim"); got != "old shim" {
		t.Fatalf("shim = %q after an untrusted download", got)
	}

	file.CABundle = caBundle(srv)
	bins.Source.CABundle = caBundle(srv)
	if _, err := Run(runCtx(t), env, &v1alpha1.Command{InstallFile: file}); err != nil {
		t.Fatalf("installFile with caBundle: %v", err)
	}
	if _, err := Run(runCtx(t), env, &v1alpha1.Command{InstallBinaries: bins}); err != nil {
		t.Fatalf("installBinaries with caBundle: %v", err)
	}
	if got := hosttest.ReadFile(t, root, "/opt/bin/shim"); got != "new shim" {
		t.Errorf("shim = %q", got)
	}
	if got := hosttest.ReadFile(t, root, "/usr/bin/kubelet"); got != "kubelet v1.37.2" {
		t.Errorf("kubelet = %q", got)
	}

	file.CABundle, file.Path = "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n", "/opt/bin/other"
	if _, err := Run(runCtx(t), env, &v1alpha1.Command{InstallFile: file}); err == nil || !strings.Contains(err.Error(), "caBundle") {
		t.Errorf("a caBundle that does not parse: err = %v, want it named", err)
	}
}

// Plain http is refused before any request unless the command says insecureHTTP: true (admission
// refuses it too; a task may predate the rule, so the agent checks for itself).
func TestPlainHTTPOnlyWithInsecureHTTP(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		switch r.URL.Path {
		case "/shim":
			_, _ = w.Write([]byte("new shim"))
		case "/v1.37.2/bin/linux/amd64/kubectl":
			_, _ = w.Write([]byte("kubectl v1.37.2"))
		case "/v1.37.2/bin/linux/amd64/kubectl.sha256":
			_, _ = w.Write([]byte(sum("kubectl v1.37.2")))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	env, root, _ := localEnv(t, map[string]string{"/opt/bin/shim": "old shim", "/usr/bin/kubectl": "kubectl v1.36.0"}, false)
	file := &v1alpha1.InstallFileCommand{URL: srv.URL + "/shim", SHA256: sum("new shim"), Path: "/opt/bin/shim"}
	bins := &v1alpha1.InstallBinariesCommand{Components: []string{"kubectl"}, Version: "v1.37.2", Source: v1alpha1.BinarySource{BaseURL: srv.URL}}

	for what, cmd := range map[string]*v1alpha1.Command{"installFile": {InstallFile: file}, "installBinaries": {InstallBinaries: bins}} {
		_, err := Run(runCtx(t), env, cmd)
		if err == nil || !strings.Contains(err.Error(), "plain http") || !strings.Contains(err.Error(), "insecureHTTP: true") {
			t.Errorf("%s over http without insecureHTTP: err = %v, want it refused naming insecureHTTP", what, err)
		}
	}
	if got := n.Load(); got != 0 {
		t.Fatalf("the server got %d requests; a refused download must send none", got)
	}

	file.InsecureHTTP, bins.Source.InsecureHTTP = true, true
	if _, err := Run(runCtx(t), env, &v1alpha1.Command{InstallFile: file}); err != nil {
		t.Fatalf("installFile with insecureHTTP: %v", err)
	}
	if _, err := Run(runCtx(t), env, &v1alpha1.Command{InstallBinaries: bins}); err != nil {
		t.Fatalf("installBinaries with insecureHTTP: %v", err)
	}
	if got := hosttest.ReadFile(t, root, "/opt/bin/shim"); got != "new shim" {
		t.Errorf("shim = %q", got)
	}
	if got := hosttest.ReadFile(t, root, "/usr/bin/kubectl"); got != "kubectl v1.37.2" {
		t.Errorf("kubectl = %q", got)
	}

	file.URL, file.Path = "ftp://"+strings.TrimPrefix(srv.URL, "http://")+"/shim", "/opt/bin/other"
	if _, err := Run(runCtx(t), env, &v1alpha1.Command{InstallFile: file}); err == nil || !strings.Contains(err.Error(), "only https") {
		t.Errorf("ftp: err = %v, want it refused", err)
	}
}

// A digest pinned in binarySource.sha256 is used instead of the server's .sha256 file: a server that
// serves a changed binary with a matching .sha256 installs nothing, and no binary of the command is
// replaced when any one of them fails its pin.
func TestPinnedSHA256IsPreferredAndAMismatchInstallsNothing(t *testing.T) {
	srv, _ := tlsFileServer(t, map[string]string{
		"/v1.37.2/bin/linux/amd64/kubeadm":        "kubeadm v1.37.2",
		"/v1.37.2/bin/linux/amd64/kubeadm.sha256": sum("kubeadm v1.37.2"),
		"/v1.37.2/bin/linux/amd64/kubelet":        "kubelet tampered",
		"/v1.37.2/bin/linux/amd64/kubelet.sha256": sum("kubelet tampered"), // the server lies consistently
	})
	files := map[string]string{"/usr/bin/kubeadm": "kubeadm v1.36.0", "/usr/bin/kubelet": "kubelet v1.36.0"}
	env, root, _ := localEnv(t, files, false)
	env.HTTP = srv.Client() // trusts httptest's certificate, so only the digests are under test
	src := v1alpha1.BinarySource{BaseURL: srv.URL,
		SHA256: &v1alpha1.BinaryDigests{Kubeadm: sum("kubeadm v1.37.2"), Kubelet: sum("kubelet v1.37.2")}}
	_, err := Run(runCtx(t), env, &v1alpha1.Command{InstallBinaries: &v1alpha1.InstallBinariesCommand{
		Components: []string{"kubeadm", "kubelet"}, Version: "v1.37.2", Source: src}})
	if err == nil || !strings.Contains(err.Error(), "sha256 of "+srv.URL+"/v1.37.2/bin/linux/amd64/kubelet") {
		t.Fatalf("err = %v, want kubelet's pinned sha256 to fail", err)
	}
	for p, want := range files {
		if got := hosttest.ReadFile(t, root, p); got != want {
			t.Errorf("%s = %q after a failed pin, want it untouched (%q)", p, got, want)
		}
		if _, err := os.Stat(filepath.Join(root, p+PrevSuffix)); err == nil {
			t.Errorf("%s was kept as previous: the install started", p+PrevSuffix)
		}
	}

	// A pin needs no .sha256 on the server at all.
	bare, _ := tlsFileServer(t, map[string]string{"/v1.37.2/bin/linux/amd64/kubeadm": "kubeadm v1.37.2"})
	src = v1alpha1.BinarySource{BaseURL: bare.URL, SHA256: &v1alpha1.BinaryDigests{Kubeadm: sum("kubeadm v1.37.2")}}
	if _, err := Run(runCtx(t), env, &v1alpha1.Command{InstallBinaries: &v1alpha1.InstallBinariesCommand{
		Components: []string{"kubeadm"}, Version: "v1.37.2", Source: src}}); err != nil {
		t.Fatalf("pinned kubeadm from a server without .sha256: %v", err)
	}
	if got := hosttest.ReadFile(t, root, "/usr/bin/kubeadm"); got != "kubeadm v1.37.2" {
		t.Errorf("kubeadm = %q", got)
	}
}

// insecureHTTP allows a plain http URL; it never lets an https download be redirected to http.
func TestSafetyRule12_InsecureHTTPDoesNotAllowAnHTTPSToHTTPRedirect(t *testing.T) {
	plain := fileServer(t, map[string]string{"/shim": "new shim"})
	tlsSrv := httptest.NewTLSServer(http.RedirectHandler(plain.URL+"/shim", http.StatusFound))
	t.Cleanup(tlsSrv.Close)
	env, root, _ := localEnv(t, map[string]string{"/opt/bin/shim": "old shim"}, false)
	env.HTTP = tlsSrv.Client()
	_, err := Run(runCtx(t), env, &v1alpha1.Command{InstallFile: &v1alpha1.InstallFileCommand{URL: tlsSrv.URL + "/shim",
		SHA256: sum("new shim"), Path: "/opt/bin/shim", InsecureHTTP: true}})
	if err == nil || !strings.Contains(err.Error(), "refusing the redirect from https to http") {
		t.Fatalf("err = %v, want the redirect to http refused", err)
	}
	if got := hosttest.ReadFile(t, root, "/opt/bin/shim"); got != "old shim" {
		t.Errorf("the file was installed through the redirect: %q", got)
	}
}
