package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// reconfigureSpec sets an API server flag and the kubelet's maxPods, as a newcomer's first
// reconfigure would.
func reconfigureSpec(mode v1alpha1.ExecutionMode) v1alpha1.NodeOperationSpec {
	return v1alpha1.NodeOperationSpec{ExecutionMode: mode, Reconfigure: &v1alpha1.ReconfigureOperation{
		ClusterConfiguration: &v1alpha1.ClusterConfigurationPatch{APIServer: &v1alpha1.APIServerPatch{
			ControlPlaneComponentPatch: v1alpha1.ControlPlaneComponentPatch{ExtraArgs: []v1alpha1.ExtraArg{{Name: "audit-log-maxage", Value: "30"}}},
		}},
		KubeletConfiguration: "maxPods: 150\n",
	}}
}

// commandOutput is the output tail of the first command of kind in the task.
func commandOutput(t *testing.T, task *v1alpha1.NodeTask, kind string) string {
	t.Helper()
	for i, c := range task.Spec.Commands {
		if c.Kind() == kind && i < len(task.Status.Commands) {
			return task.Status.Commands[i].OutputTail
		}
	}
	t.Fatalf("task %s has no %s command with a status", task.Name, kind)
	return ""
}

// TestReconfigure runs issue 28's reconfigure on nodeops-local with 3 control planes and a worker,
// the real kubeadm in every node root: a DryRun changes no root and no ConfigMap and shows each
// node's difference; the real run patches kube-system's kubeadm-config and kubelet-config, rolls
// the control planes one at a time (a watch never sees two at once, though the operation's budget
// allows every node), restarts every kubelet once, leaves each control plane's
// manifest with the flag and each node's kubelet configuration with maxPods, and the ClusterTarget
// reports no drift after it.
func TestReconfigure(t *testing.T) {
	t.Parallel()
	l := framework.StartLocal(t, "--control-planes=3", "--workers=1")
	l.WaitNodesReady(t, 4, 3*time.Minute)
	cps := []string{"cp-1", "cp-2", "cp-3"}
	nodes := append(append([]string(nil), cps...), "worker-1")
	framework.WaitForClusterTarget(t, l, "every node's drift read, none drifting", noDrift(nodes...))

	t.Run("a DryRun changes no root and no ConfigMap and shows each node's difference", func(t *testing.T) {
		trees := kadmSettledTrees(t, l, nodes)
		cluster := kadmClusterState(t, l)
		op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "reconfigure-dry-run"}, Spec: reconfigureSpec(v1alpha1.ExecutionDryRun)}
		framework.RunOperationWatched(t, l, op, framework.WaitForKubeadmOperation(v1alpha1.OperationSucceeded))

		kadmSameTrees(t, l, nodes, trees)
		if after := kadmClusterState(t, l); after != cluster {
			t.Errorf("the cluster changed in DryRun:\nbefore %s\nafter  %s", cluster, after)
		}
		first := framework.GetTask(t, l, objname.TaskName(op.Name, plan.GroupFirstControlPlane, "cp-1"))
		if out := commandOutput(t, first, "kubeadmUpdateConfig"); !strings.Contains(out, "+   - name: audit-log-maxage") || !strings.Contains(out, "+ maxPods: 150") {
			t.Errorf("kubeadmUpdateConfig's DryRun output does not show the ConfigMaps' difference:\n%s", out)
		}
		for _, task := range []*v1alpha1.NodeTask{first, framework.GetTask(t, l, objname.TaskName(op.Name, plan.GroupOtherControlPlanes, "cp-2")),
			framework.GetTask(t, l, objname.TaskName(op.Name, plan.GroupOtherControlPlanes, "cp-3"))} {
			out := commandOutput(t, task, "kubeadmReconfigureNode")
			for _, want := range []string{
				task.Spec.NodeName + " kube-apiserver.yaml would change:\n  flag --audit-log-maxage: (none) -> 30",
				task.Spec.NodeName + " kube-scheduler.yaml: unchanged",
				"maxPods: (none) -> 150",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("%s: the DryRun's output lacks %q:\n%s", task.Name, want, out)
				}
			}
		}
		worker := framework.GetTask(t, l, objname.TaskName(op.Name, plan.GroupWorkers, "worker-1"))
		if out := commandOutput(t, worker, "kubeadmReconfigureNode"); !strings.Contains(out, "worker-1 /var/lib/kubelet/config.yaml would change:\n  maxPods: (none) -> 150") || strings.Contains(out, "kube-apiserver") {
			t.Errorf("%s: the DryRun's output does not show the kubelet's difference alone:\n%s", worker.Name, out)
		}
	})

	t.Run("reconfigure rolls the control planes one at a time and leaves no drift", func(t *testing.T) {
		// Every node may be busy at once by the operation's budget: the control planes still go one at a time.
		all := intstr.FromString("100%")
		op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "reconfigure"}, Spec: reconfigureSpec(v1alpha1.ExecutionAuto)}
		op.Spec.MaxUnavailable = &all
		restarts := map[string]int{}
		for _, n := range nodes {
			restarts[n] = framework.Restarts(t, l.NodeRoot(n), "kubelet")
		}
		_, events := framework.RunOperationWatched(t, l, op, framework.WaitForKubeadmOperation(v1alpha1.OperationSucceeded))

		for _, n := range nodes {
			if got := framework.Restarts(t, l.NodeRoot(n), "kubelet"); got != restarts[n]+1 {
				t.Errorf("%s's kubelet restarted %d times, want once", n, got-restarts[n])
			}
		}
		among := map[string]bool{"cp-1": true, "cp-2": true, "cp-3": true}
		if held, what := framework.MaxHeld(framework.WorkEvents(events), among); held > 1 {
			t.Errorf("%d control planes reconfigured at once: %s", held, what)
		}
		for _, n := range cps {
			if m := framework.ReadFile(t, filepath.Join(l.NodeRoot(n), "etc/kubernetes/manifests/kube-apiserver.yaml")); !strings.Contains(m, "- --audit-log-maxage=30\n") {
				t.Errorf("%s's kube-apiserver manifest has no --audit-log-maxage=30:\n%s", n, m)
			}
		}
		for _, n := range nodes {
			if c := framework.ReadFile(t, filepath.Join(l.NodeRoot(n), "var/lib/kubelet/config.yaml")); !strings.Contains(c, "\nmaxPods: 150\n") {
				t.Errorf("%s's kubelet configuration has no maxPods: 150:\n%s", n, c)
			}
		}
		var kubeadmConfig, kubeletConfig corev1.ConfigMap
		ctx := context.Background()
		if err := l.Client.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "kubeadm-config"}, &kubeadmConfig); err != nil {
			t.Fatal(err)
		}
		if err := l.Client.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "kubelet-config"}, &kubeletConfig); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(kubeadmConfig.Data["ClusterConfiguration"], "name: audit-log-maxage\n    value: \"30\"") || !strings.Contains(kubeletConfig.Data["kubelet"], "maxPods: 150") {
			t.Errorf("the ConfigMaps do not hold the change:\n%s\n%s", kubeadmConfig.Data["ClusterConfiguration"], kubeletConfig.Data["kubelet"])
		}
		framework.WaitForClusterTarget(t, l, "no drift after the reconfigure", noDrift(nodes...))

		// Run again, it writes no ConfigMap: the patch is already there.
		again := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "reconfigure-again"}, Spec: reconfigureSpec(v1alpha1.ExecutionAuto)}
		framework.RunOperationWatched(t, l, again, framework.WaitForKubeadmOperation(v1alpha1.OperationSucceeded))
		var cm corev1.ConfigMap
		if err := l.Client.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "kubeadm-config"}, &cm); err != nil {
			t.Fatal(err)
		}
		if cm.ResourceVersion != kubeadmConfig.ResourceVersion {
			t.Errorf("a second reconfigure with the same patch wrote kubeadm-config again (resourceVersion %s -> %s)", kubeadmConfig.ResourceVersion, cm.ResourceVersion)
		}
		first := framework.GetTask(t, l, objname.TaskName(again.Name, plan.GroupFirstControlPlane, "cp-1"))
		if out := commandOutput(t, first, "kubeadmUpdateConfig"); !strings.Contains(out, "unchanged, already patched") {
			t.Errorf("the second kubeadmUpdateConfig's output does not say it changed nothing:\n%s", out)
		}
	})

	t.Run("the ClusterTarget's controlPlane section generates a reconfigure; a hand edit shows as drift, the fix as none", func(t *testing.T) {
		framework.EditClusterTarget(t, l, func(ct *v1alpha1.ClusterTarget) {
			ct.Spec.ControlPlane = &v1alpha1.ClusterConfigurationPatch{Scheduler: &v1alpha1.ControlPlaneComponentPatch{
				ExtraArgs: []v1alpha1.ExtraArg{{Name: "v", Value: "3"}}}}
		})
		ct := framework.WaitForClusterTarget(t, l, "a generated reconfigure succeeded and the target UpToDate", func(ct *v1alpha1.ClusterTarget) error {
			var gen *v1alpha1.GeneratedOperation
			for i := range ct.Status.Operations {
				if ct.Status.Operations[i].Kind == v1alpha1.GeneratedReconfigure {
					gen = &ct.Status.Operations[i]
				}
			}
			if gen == nil || gen.Phase != v1alpha1.OperationSucceeded {
				return fmt.Errorf("generated %+v, phase %s", ct.Status.Operations, ct.Status.Phase)
			}
			if ct.Status.Phase != v1alpha1.ClusterUpToDate {
				return fmt.Errorf("phase %s after %s succeeded", ct.Status.Phase, gen.Name)
			}
			return nil
		})
		if ops := framework.GeneratedOperations(t, l); len(ops) != 1 || !strings.HasPrefix(ops[0], "cluster-reconfigure-") {
			t.Errorf("generated operations %v, want one reconfigure", ops)
		}
		manifests := map[string]string{}
		for _, n := range cps {
			path := filepath.Join(l.NodeRoot(n), "etc/kubernetes/manifests/kube-scheduler.yaml")
			m := framework.ReadFile(t, path)
			if !strings.Contains(m, "- --v=3\n") {
				t.Errorf("%s's kube-scheduler manifest has no --v=3:\n%s", n, m)
			}
			manifests[path] = m
		}
		generated := ct.Status.Operations[len(ct.Status.Operations)-1].Name
		ct = framework.WaitForClusterTarget(t, l, "no drift after the generated reconfigure", noDrift(nodes...))
		t.Logf("after %s: %s", generated, driftSummary(ct))

		// By hand, cp-2's scheduler loses the flag: drift, and no new operation (drift generates none).
		// This gives back the very bytes the agent compared before the reconfigure: it compares
		// again after every task on its node, so it does not take them for what it last saw.
		path := filepath.Join(l.NodeRoot("cp-2"), "etc/kubernetes/manifests/kube-scheduler.yaml")
		if err := os.WriteFile(path, []byte(strings.Replace(manifests[path], "    - --v=3\n", "", 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		framework.WaitForClusterTarget(t, l, "cp-2's kube-scheduler drifting by the hand edit", func(ct *v1alpha1.ClusterTarget) error {
			for _, d := range ct.Status.Drift {
				if d.Node == "cp-2" && d.Drifted && len(d.Components) == 1 && d.Components[0].Component == v1alpha1.DriftKubeScheduler && strings.Contains(d.Components[0].Reason, "flag --v missing") {
					return nil
				}
			}
			return fmt.Errorf("drift: %s", driftSummary(ct))
		})
		if err := os.WriteFile(path, []byte(manifests[path]), 0o600); err != nil {
			t.Fatal(err)
		}
		framework.WaitForClusterTarget(t, l, "no drift once the edit is fixed", noDrift(nodes...))
		if ops := framework.GeneratedOperations(t, l); len(ops) != 1 {
			t.Errorf("generated operations %v after a drift: drift generates none", ops)
		}
	})
}
