package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// TestAgent runs the agent's issue-4 scenarios on nodeops-local: real agent processes executing
// NodeTasks that the real manager creates from NodeOperations, on local node roots.
func TestAgent(t *testing.T) {
	t.Parallel()
	l := framework.StartLocal(t, "--control-planes=1", "--workers=2")
	l.WaitNodesReady(t, 3, 3*time.Minute)
	nodes := []string{"cp-1", "worker-1", "worker-2"}

	t.Run("a script appending to a file runs exactly once on every node", func(t *testing.T) {
		op := customOp("append-once", nil, script("mkdir -p /var/tmp && echo \"$NODEOPS_NODE_NAME $NODEOPS_OPERATION\" >> /var/tmp/e2e-append", false))
		framework.RunOperation(t, l, op, v1alpha1.OperationSucceeded)
		for _, n := range nodes {
			got, err := os.ReadFile(filepath.Join(l.NodeRoot(n), "var/tmp/e2e-append"))
			if err != nil || string(got) != n+" append-once\n" {
				t.Errorf("node %s: file %q (%v), want the script to have run once", n, got, err)
			}
		}
	})

	t.Run("drain stops at a PodDisruptionBudget with a clear message; uncordon restores schedulability", func(t *testing.T) {
		testDrainWithPDB(t, l)
	})

	t.Run("killing the agent: finished commands stay done, an interrupted non-idempotent one fails Interrupted", func(t *testing.T) {
		root := l.NodeRoot("worker-1")
		op := customOp("kill-nonidem", onNode("worker-1"),
			script("mkdir -p /var/tmp && echo first >> /var/tmp/e2e-kill", false),
			script("echo second >> /var/tmp/e2e-kill; sleep 120", false),
			script("echo third >> /var/tmp/e2e-kill", false))
		framework.Create(t, l, op)
		framework.WaitForFile(t, filepath.Join(root, "var/tmp/e2e-kill"), "first\nsecond\n")
		framework.KillAgent(t, l, "worker-1")
		task := framework.WaitForTask(t, l, op.Name, func(tk *v1alpha1.NodeTask) bool { return tk.Status.Phase == v1alpha1.TaskFailed })
		if task.Status.Reason != v1alpha1.ReasonInterrupted {
			t.Errorf("task failed with reason %q (%s), want Interrupted", task.Status.Reason, task.Status.Message)
		}
		if got, _ := os.ReadFile(filepath.Join(root, "var/tmp/e2e-kill")); string(got) != "first\nsecond\n" {
			t.Errorf("commands ran %q after the restart", got)
		}
		framework.AbortOperation(t, l, op.Name)
	})

	t.Run("killing the agent: an interrupted idempotent command runs again", func(t *testing.T) {
		root := l.NodeRoot("worker-2")
		op := customOp("kill-idem", onNode("worker-2"),
			script("mkdir -p /var/tmp && echo first >> /var/tmp/e2e-idem", false),
			script("echo second >> /var/tmp/e2e-idem; [ -f /var/tmp/e2e-idem-marker ] && exit 0; touch /var/tmp/e2e-idem-marker; sleep 120", true))
		framework.Create(t, l, op)
		framework.WaitForFile(t, filepath.Join(root, "var/tmp/e2e-idem"), "first\nsecond\n")
		framework.KillAgent(t, l, "worker-2")
		framework.WaitForOperation(t, l, framework.WaitForOperationInput{Name: op.Name, Phase: v1alpha1.OperationSucceeded})
		if got, _ := os.ReadFile(filepath.Join(root, "var/tmp/e2e-idem")); string(got) != "first\nsecond\nsecond\n" {
			t.Errorf("commands ran %q; want the finished one once and the idempotent one twice", got)
		}
	})

	t.Run("installFile refuses a download whose sha256 differs and keeps the old file", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("new content")) }))
		defer srv.Close()
		target := filepath.Join(l.NodeRoot("worker-1"), "opt/e2e/file")
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(target, []byte("old content"), 0o644); err != nil {
			t.Fatal(err)
		}
		wrong := sha256.Sum256([]byte("other content"))
		op := customOp("install-bad-sha", onNode("worker-1"), v1alpha1.Command{InstallFile: &v1alpha1.InstallFileCommand{
			URL: srv.URL + "/file", InsecureHTTP: true, SHA256: hex.EncodeToString(wrong[:]), Path: "/opt/e2e/file",
		}})
		framework.Create(t, l, op)
		task := framework.WaitForTask(t, l, op.Name, func(tk *v1alpha1.NodeTask) bool { return tk.Status.Phase == v1alpha1.TaskFailed })
		if msg := task.Status.Commands[0].Message; !strings.Contains(msg, "sha256") || !strings.Contains(msg, "left unchanged") {
			t.Errorf("message %q", msg)
		}
		if got, _ := os.ReadFile(target); string(got) != "old content" {
			t.Errorf("file is %q after a refused download", got)
		}
		framework.AbortOperation(t, l, op.Name)

		right := sha256.Sum256([]byte("new content"))
		op = customOp("install-good-sha", onNode("worker-1"), v1alpha1.Command{InstallFile: &v1alpha1.InstallFileCommand{
			URL: srv.URL + "/file", InsecureHTTP: true, SHA256: hex.EncodeToString(right[:]), Path: "/opt/e2e/file", Mode: "0600",
		}})
		framework.RunOperation(t, l, op, v1alpha1.OperationSucceeded)
		if got, _ := os.ReadFile(target); string(got) != "new content" {
			t.Errorf("file is %q after a verified download", got)
		}
	})

	t.Run("containerdRuntime adds and removes a handler in the node's config, round trip", func(t *testing.T) {
		cfgPath := filepath.Join(l.NodeRoot("worker-2"), "etc/containerd/config.toml")
		orig, err := os.ReadFile(cfgPath)
		if err != nil {
			t.Fatal(err)
		}
		handler := v1alpha1.ContainerdRuntimeCommand{Name: "wasmedge", RuntimeType: "io.containerd.wasmedge.v1", BinaryPath: "/opt/kwasm/bin/containerd-shim-wasmedge-v1"}
		add := handler
		framework.RunOperation(t, l, customOp("ctrd-add", onNode("worker-2"), v1alpha1.Command{ContainerdRuntime: &add}, v1alpha1.Command{ContainerdRuntime: &add}), v1alpha1.OperationSucceeded)
		added, _ := os.ReadFile(cfgPath)
		if !strings.Contains(string(added), "runtimes.wasmedge]") || !strings.Contains(string(added), `runtime_type = "io.containerd.wasmedge.v1"`) {
			t.Errorf("handler not in the config:\n%s", added)
		}
		rm := handler
		rm.Remove = true
		framework.RunOperation(t, l, customOp("ctrd-remove", onNode("worker-2"), v1alpha1.Command{ContainerdRuntime: &rm}), v1alpha1.OperationSucceeded)
		if back, _ := os.ReadFile(cfgPath); string(back) != string(orig) {
			t.Errorf("add then remove did not give back the node's config byte for byte:\n%s", back)
		}
		if n := framework.Restarts(t, l.NodeRoot("worker-2"), "containerd"); n != 3 {
			t.Errorf("containerd restarted %d times, want 3 (one per command):\n%s", n, framework.ServiceLog(t, l.NodeRoot("worker-2")))
		}
	})

	t.Run("containerdRuntime presets: each distro's config and unit on a root laid out like it, a drop-in when imports is set, a drained restart", func(t *testing.T) {
		testContainerdPresets(t, l)
	})
}

func testDrainWithPDB(t *testing.T, l *framework.Local) {
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "e2e-drain"}}
	framework.Create(t, l, ns)
	labels := map[string]string{"app": "guarded"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "guarded", Namespace: ns.Name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"kubernetes.io/hostname": "worker-1"},
					Containers:   []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
				},
			},
		},
	}
	framework.Create(t, l, dep)
	minAvailable := intstr.FromInt32(2)
	framework.Create(t, l, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "guarded-pdb", Namespace: ns.Name},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &minAvailable, Selector: &metav1.LabelSelector{MatchLabels: labels}},
	})
	testutil.EventuallyEvery(t, 2*time.Minute, framework.PollInterval, "both guarded pods Ready and counted by the PDB", func(ctx context.Context) error {
		pdb := &policyv1.PodDisruptionBudget{}
		if err := l.Client.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "guarded-pdb"}, pdb); err != nil {
			return err
		}
		if pdb.Status.CurrentHealthy != 2 {
			return fmt.Errorf("PDB status %+v", pdb.Status)
		}
		return nil
	})

	op := customOp("drain-pdb", onNode("worker-1"),
		v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}},
		v1alpha1.Command{Drain: &v1alpha1.DrainCommand{Timeout: &metav1.Duration{Duration: 10 * time.Second}}})
	framework.Create(t, l, op)
	task := framework.WaitForTask(t, l, op.Name, func(tk *v1alpha1.NodeTask) bool { return tk.Status.Phase == v1alpha1.TaskFailed })
	msg := task.Status.Commands[1].Message
	for _, want := range []string{"timed out", "e2e-drain/guarded-", "PodDisruptionBudget e2e-drain/guarded-pdb"} {
		if !strings.Contains(msg, want) {
			t.Errorf("drain message %q does not say %q", msg, want)
		}
	}
	node := &corev1.Node{}
	if err := l.Client.Get(ctx, client.ObjectKey{Name: "worker-1"}, node); err != nil {
		t.Fatal(err)
	}
	if !node.Spec.Unschedulable {
		t.Errorf("worker-1 is not cordoned")
	}
	framework.AbortOperation(t, l, op.Name)

	framework.RunOperation(t, l, customOp("uncordon-after", onNode("worker-1"), v1alpha1.Command{Uncordon: &v1alpha1.UncordonCommand{}}), v1alpha1.OperationSucceeded)
	if err := l.Client.Get(ctx, client.ObjectKey{Name: "worker-1"}, node); err != nil {
		t.Fatal(err)
	}
	if node.Spec.Unschedulable {
		t.Errorf("uncordon left worker-1 unschedulable, though it was schedulable before cordon")
	}
	if err := l.Client.Delete(ctx, ns); err != nil {
		t.Fatal(err)
	}
}

func script(s string, idempotent bool) v1alpha1.Command {
	return v1alpha1.Command{Script: &v1alpha1.ScriptCommand{Inline: s, Idempotent: idempotent}}
}

func onNode(name string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/hostname": name}}
}

func customOp(name string, sel *metav1.LabelSelector, cmds ...v1alpha1.Command) *v1alpha1.NodeOperation {
	return &v1alpha1.NodeOperation{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.NodeOperationSpec{
			NodeSelector: sel,
			Custom:       &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{{Name: "main", Commands: cmds}}},
		},
	}
}
