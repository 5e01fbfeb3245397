package agent_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/host/hosttest"
)

// An installFile with per-platform artifacts installs the one for its Node's kubernetes.io/arch;
// a node whose platform has none fails, naming both, before anything is downloaded.
func TestInstallFilePicksTheNodesPlatform(t *testing.T) {
	artifacts := map[string]string{"/shim-amd64": "an amd64 shim", "/shim-arm64": "an arm64 shim"}
	var requests atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		body, ok := artifacts[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	agentHTTP := srv.Client() // trusts the test server's certificate
	platform := func(arch string) v1alpha1.InstallFilePlatform {
		sum := sha256.Sum256([]byte(artifacts["/shim-"+arch]))
		return v1alpha1.InstallFilePlatform{Arch: arch, URL: srv.URL + "/shim-" + arch, SHA256: hex.EncodeToString(sum[:])}
	}

	create(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "platform-amd64", Labels: map[string]string{
		corev1.LabelOSStable: "linux", corev1.LabelArchStable: "amd64"}}})
	root := hosttest.NewRoot(t, nil)
	stop := startAgent(t, agent.Options{NodeName: "platform-amd64", HostRoot: root, HTTP: agentHTTP})
	defer stop()

	create(t, newTask("platform-arm64-only", "platform-amd64", v1alpha1.ExecutionAuto, v1alpha1.Command{InstallFile: &v1alpha1.InstallFileCommand{
		Platforms: []v1alpha1.InstallFilePlatform{platform("arm64")}, Path: "/usr/local/bin/containerd-shim-x-v1", Mode: "0755"}}))
	task := waitTask(t, "platform-arm64-only", phaseIs(v1alpha1.TaskFailed))
	if msg := task.Status.Commands[0].Message; !strings.Contains(msg, "no artifact for node platform-amd64's platform linux/amd64 (this installFile has linux/arm64)") {
		t.Errorf("message %q does not name the node's platform and the ones offered", msg)
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("%d downloads for a node with no matching platform, want none", n)
	}
	if fileExists(root, "/usr/local/bin/containerd-shim-x-v1") {
		t.Error("a file was installed for a platform with no artifact")
	}

	create(t, newTask("platform-both", "platform-amd64", v1alpha1.ExecutionAuto, v1alpha1.Command{InstallFile: &v1alpha1.InstallFileCommand{
		Platforms: []v1alpha1.InstallFilePlatform{platform("arm64"), platform("amd64")}, Path: "/usr/local/bin/containerd-shim-x-v1", Mode: "0755"}}))
	task = waitTask(t, "platform-both", phaseIs(v1alpha1.TaskSucceeded))
	if got := hosttest.ReadFile(t, root, "/usr/local/bin/containerd-shim-x-v1"); got != artifacts["/shim-amd64"] {
		t.Errorf("installed %q, want the amd64 artifact", got)
	}
	if msg := task.Status.Commands[0].Message; !strings.Contains(msg, "for linux/amd64") {
		t.Errorf("message %q does not say which platform was installed", msg)
	}
}
