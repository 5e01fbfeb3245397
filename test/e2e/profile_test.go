package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// The sample's placeholders, replaced by the test's own HTTP server and the files' real digests.
const (
	profSampleBaseURL = "https://shims.example/v0.x/"
	profShimDir       = "/usr/local/bin/"
)

var profSampleShims = []struct{ name, placeholder string }{
	{"containerd-shim-wasmedge-v1", "0000000000000000000000000000000000000000000000000000000000000001"},
	{"containerd-shim-wasmtime-v1", "0000000000000000000000000000000000000000000000000000000000000002"},
	{"containerd-shim-spin-v2", "0000000000000000000000000000000000000000000000000000000000000003"},
}

// TestNodeProfile is issue 6 end to end: config/samples/wasm-shims.yaml applied with kubectl on
// nodeops-local (real manager and agents), shims served over local https whose certificate the
// agents trust only through the profile's caBundle.
func TestNodeProfile(t *testing.T) {
	t.Parallel()
	const sims = 200
	l := framework.StartLocal(t, "--control-planes=1", "--workers=2", fmt.Sprintf("--sim-nodes=%d", sims))
	l.WaitNodesReady(t, 3+sims, 5*time.Minute)

	shims, digests := map[string][]byte{}, map[string]string{}
	for _, s := range profSampleShims {
		data := make([]byte, 64<<10)
		if _, err := rand.Read(data); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		shims[s.name], digests[s.name] = data, hex.EncodeToString(sum[:])
	}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, ok := shims[strings.TrimPrefix(r.URL.Path, "/v0.x/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(data)
	}))
	t.Cleanup(srv.Close)

	sample, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "wasm-shims.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	caBundle := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	urlLine := regexp.MustCompile(`(?m)^([ \t]*)url: ` + regexp.QuoteMeta(profSampleBaseURL))
	manifest := urlLine.ReplaceAllString(string(sample), "${1}caBundle: "+strconv.Quote(caBundle)+"\n${1}url: "+srv.URL+"/v0.x/")
	for _, s := range profSampleShims {
		manifest = strings.ReplaceAll(manifest, s.placeholder, digests[s.name])
	}
	// Manifests live in the parent test's directory: kubectl -f splits a path at commas, which subtest names have.
	manifests := t.TempDir()
	manifestFile := filepath.Join(manifests, "wasm-shims.yaml")
	if err := os.WriteFile(manifestFile, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	l.MustKubectl(t, "apply", "-f", manifestFile)
	for _, rc := range []string{"wasmedge", "wasmtime", "spin"} {
		testutil.EventuallyEvery(t, time.Minute, framework.PollInterval, "RuntimeClass "+rc, func(ctx context.Context) error {
			obj := &nodev1.RuntimeClass{}
			if err := l.Client.Get(ctx, client.ObjectKey{Name: rc}, obj); err != nil {
				return err
			}
			if obj.Handler != rc || obj.Scheduling == nil || obj.Scheduling.NodeSelector[nodeprofile.ProvisionedLabel("wasm-shims")] != v1alpha1.ProvisionedValue {
				return fmt.Errorf("handler %q, scheduling %+v", obj.Handler, obj.Scheduling)
			}
			return nil
		})
	}

	t.Run("annotating worker-1 provisions it and only it", func(t *testing.T) {
		l.MustKubectl(t, "annotate", "node", "worker-1", "kwasm.sh/kwasm-node=true")
		framework.WaitForProfileLabel(t, l, "wasm-shims", "worker-1", true)
		root := l.NodeRoot("worker-1")
		for name, want := range digests {
			if got := framework.FileSHA256(t, filepath.Join(root, profShimDir, name)); got != want {
				t.Errorf("%s on worker-1: sha256 %s, want %s", name, got, want)
			}
		}
		config := framework.ReadFile(t, filepath.Join(root, "etc/containerd/config.toml"))
		for _, rt := range []string{"io.containerd.wasmedge.v1", "io.containerd.wasmtime.v1", "io.containerd.spin.v2"} {
			if !strings.Contains(config, rt) {
				t.Errorf("worker-1 config.toml lacks runtime %s:\n%s", rt, config)
			}
		}
		if n := framework.Restarts(t, root, "containerd"); n < 1 {
			t.Errorf("no containerd restart recorded on worker-1")
		}
		framework.WaitForProfileCondition(t, l, "wasm-shims", v1alpha1.ConditionReady, metav1.ConditionTrue)

		other := l.NodeRoot("worker-2")
		for name := range digests {
			if _, err := os.Stat(filepath.Join(other, profShimDir, name)); !os.IsNotExist(err) {
				t.Errorf("worker-2 has %s (%v)", name, err)
			}
		}
		if strings.Contains(framework.ReadFile(t, filepath.Join(other, "etc/containerd/config.toml")), "wasmedge") {
			t.Errorf("worker-2's containerd config was changed")
		}
		if framework.Restarts(t, other, "containerd") != 0 {
			t.Errorf("containerd restarted on worker-2")
		}
		if framework.ProfileLabelled(t, l, "wasm-shims", "worker-2") {
			t.Errorf("worker-2 labelled")
		}
	})

	t.Run("a wrong sha256 fails the task, no label, the condition names node and why", func(t *testing.T) {
		bad := fmt.Sprintf(`apiVersion: nodeops.io/v1alpha1
kind: NodeProfile
metadata:
  name: bad-shim
spec:
  trigger:
    annotation: nodeops.io/e2e-bad=true
  install:
  - name: bad-shim
    installFile:
      url: %s/v0.x/containerd-shim-wasmedge-v1
      caBundle: %s
      sha256: "%s"
      path: /usr/local/bin/bad-shim
      mode: "0755"
`, srv.URL, strconv.Quote(caBundle), strings.Repeat("f", 64))
		badFile := filepath.Join(manifests, "bad.yaml")
		if err := os.WriteFile(badFile, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		l.MustKubectl(t, "apply", "-f", badFile)
		l.MustKubectl(t, "annotate", "node", "worker-2", "nodeops.io/e2e-bad=true")
		c := framework.WaitForProfileCondition(t, l, "bad-shim", v1alpha1.ConditionDegraded, metav1.ConditionTrue)
		t.Logf("Degraded: %s", c.Message)
		if !strings.Contains(c.Message, "worker-2") || !strings.Contains(strings.ToLower(c.Message), "sha256") {
			t.Errorf("Degraded does not name worker-2 and the sha256 mismatch: %s", c.Message)
		}
		if framework.ProfileLabelled(t, l, "bad-shim", "worker-2") {
			t.Errorf("worker-2 labelled after a failed install")
		}
		if _, err := os.Stat(filepath.Join(l.NodeRoot("worker-2"), profShimDir, "bad-shim")); !os.IsNotExist(err) {
			t.Errorf("a file that failed verification was installed (%v)", err)
		}
		out := l.MustKubectl(t, "get", "nodeprofile", "bad-shim", "-o", "jsonpath={.status.failures[0].node}")
		if out != "worker-2" {
			t.Errorf("status.failures[0].node = %q", out)
		}
		l.MustKubectl(t, "delete", "nodeprofile", "bad-shim", "--wait=false")
		framework.WaitForProfileGone(t, l, "bad-shim")
	})

	t.Run("removing the annotation uninstalls", func(t *testing.T) {
		before := framework.Restarts(t, l.NodeRoot("worker-1"), "containerd")
		l.MustKubectl(t, "annotate", "node", "worker-1", "kwasm.sh/kwasm-node-")
		framework.WaitForProfileLabel(t, l, "wasm-shims", "worker-1", false)
		root := l.NodeRoot("worker-1")
		for name := range digests {
			if _, err := os.Stat(filepath.Join(root, profShimDir, name)); !os.IsNotExist(err) {
				t.Errorf("%s still on worker-1 (%v)", name, err)
			}
		}
		config := framework.ReadFile(t, filepath.Join(root, "etc/containerd/config.toml"))
		for _, rt := range []string{"io.containerd.wasmedge.v1", "io.containerd.wasmtime.v1", "io.containerd.spin.v2"} {
			if strings.Contains(config, rt) {
				t.Errorf("worker-1 config.toml still has %s:\n%s", rt, config)
			}
		}
		if after := framework.Restarts(t, root, "containerd"); after <= before {
			t.Errorf("containerd not restarted by the uninstall (%d profRestarts before, %d after)", before, after)
		}
		if n := framework.GetNode(t, l, "worker-1"); n.Annotations[nodeprofile.HashAnnotation("wasm-shims")] != "" {
			t.Errorf("hash annotation left on worker-1")
		}
	})

	t.Run("autoProvision over the sim nodes never exceeds maxUnavailable", func(t *testing.T) {
		const limit = 20
		ctx := context.Background()
		var simNodes []string
		for i := 1; i <= sims; i++ {
			simNodes = append(simNodes, fmt.Sprintf("sim-%d", i))
		}
		framework.LabelNodes(t, l, "e2e.nodeops.io/pool", "sim", simNodes...)
		w := framework.WatchTasks(t, l, client.MatchingLabels{v1alpha1.LabelProfile: "sim-shims"})
		prof := &v1alpha1.NodeProfile{
			ObjectMeta: metav1.ObjectMeta{Name: "sim-shims"},
			Spec: v1alpha1.NodeProfileSpec{
				NodeSelector:   &metav1.LabelSelector{MatchLabels: map[string]string{"e2e.nodeops.io/pool": "sim"}},
				AutoProvision:  true,
				MaxUnavailable: ptr.To(intstr.FromInt32(limit)),
				Install: []v1alpha1.Command{{Name: "shim", InstallFile: &v1alpha1.InstallFileCommand{
					URL: srv.URL + "/v0.x/containerd-shim-wasmedge-v1", CABundle: caBundle, SHA256: digests["containerd-shim-wasmedge-v1"], Path: profShimDir + "containerd-shim-wasmedge-v1", Mode: "0755",
				}}},
				Uninstall: []v1alpha1.Command{{Name: "shim", InstallFile: &v1alpha1.InstallFileCommand{
					URL: srv.URL + "/v0.x/containerd-shim-wasmedge-v1", SHA256: digests["containerd-shim-wasmedge-v1"], Path: profShimDir + "containerd-shim-wasmedge-v1", Remove: true,
				}}},
			},
		}
		if err := l.Client.Create(ctx, prof); err != nil {
			t.Fatal(err)
		}
		testutil.EventuallyEvery(t, 10*time.Minute, framework.PollInterval, "every sim node provisioned", func(ctx context.Context) error {
			n, err := framework.CountProfileLabelled(ctx, l, "sim-shims")
			if err != nil {
				return err
			}
			if n < sims {
				return fmt.Errorf("%d of %d labelled: %s", n, sims, framework.ProfileSummary(ctx, l, "sim-shims"))
			}
			return nil
		})
		framework.WaitForProfileCondition(t, l, "sim-shims", v1alpha1.ConditionReady, metav1.ConditionTrue)
		peak, at := framework.MaxHeld(w.Events(t), nil)
		if peak > limit {
			t.Fatalf("%d nodes held unfinished tasks at once (maxUnavailable %d) %s", peak, limit, at)
		}
		t.Logf("peak %d sim nodes with unfinished tasks (maxUnavailable %d)", peak, limit)

		// Deleting the profile uninstalls every node, then the profile goes.
		l.MustKubectl(t, "delete", "nodeprofile", "sim-shims", "--wait=false")
		framework.WaitForProfileGone(t, l, "sim-shims")
		if n, err := framework.CountProfileLabelled(ctx, l, "sim-shims"); err != nil || n != 0 {
			t.Errorf("%d sim nodes still labelled after the profile went (%v)", n, err)
		}
		if peak, at := framework.MaxHeld(w.Stop(t), nil); peak > limit {
			t.Fatalf("%d nodes held unfinished tasks at once (maxUnavailable %d) %s", peak, limit, at)
		}
	})

	t.Run("deleting the profile uninstalls every node, then the profile is gone", func(t *testing.T) {
		l.MustKubectl(t, "annotate", "node", "worker-1", "worker-2", "kwasm.sh/kwasm-node=true", "--overwrite")
		framework.WaitForProfileLabel(t, l, "wasm-shims", "worker-1", true)
		framework.WaitForProfileLabel(t, l, "wasm-shims", "worker-2", true)
		l.MustKubectl(t, "delete", "nodeprofile", "wasm-shims", "--wait=false")
		framework.WaitForProfileGone(t, l, "wasm-shims")
		for _, node := range []string{"worker-1", "worker-2"} {
			if framework.ProfileLabelled(t, l, "wasm-shims", node) {
				t.Errorf("%s still labelled", node)
			}
			for name := range digests {
				if _, err := os.Stat(filepath.Join(l.NodeRoot(node), profShimDir, name)); !os.IsNotExist(err) {
					t.Errorf("%s still on %s (%v)", name, node, err)
				}
			}
		}
		for _, rc := range []string{"wasmedge", "wasmtime", "spin"} {
			err := l.Client.Get(context.Background(), client.ObjectKey{Name: rc}, &nodev1.RuntimeClass{})
			if !apierrors.IsNotFound(err) {
				t.Errorf("RuntimeClass %s still there (%v)", rc, err)
			}
		}
	})
}
