package e2e

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/localcluster"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

var (
	kadmControlPlanes = []string{"cp-1", "cp-2", "cp-3"}
	kadmWorkers       = []string{"worker-1", "worker-2", "worker-3"}
)

// TestKubeadm runs issue 5's kubeadm workflows on nodeops-local with 3 control planes and 3 workers:
// the real manager and agents, and the real kubeadm in every node root. The scenarios run in order on
// one cluster: the ClusterTarget of the fresh install, renew certificates, upgrade in DryRun, upgrade
// for real through the ClusterTarget, a rotation through it, its two-step plan, then a refused upgrade.
func TestKubeadm(t *testing.T) {
	t.Parallel()
	l := framework.StartLocal(t, "--control-planes=3", "--workers=3")
	l.WaitNodesReady(t, 6, 3*time.Minute)
	source := l.BinarySourceURL(t)

	t.Run("a fresh install's ClusterTarget shows the cluster as it is: v1.36.4, every control plane's certificates, UpToDate, nothing run", func(t *testing.T) {
		ct := framework.WaitForClusterTarget(t, l, "the ClusterTarget of a fresh install", func(ct *v1alpha1.ClusterTarget) error {
			if ct.Spec.KubernetesVersion != "v1.36.4" || ct.Status.KubernetesVersion != "v1.36.4" {
				return fmt.Errorf("spec %s, observed %s", ct.Spec.KubernetesVersion, ct.Status.KubernetesVersion)
			}
			if c := meta.FindStatusCondition(ct.Status.Conditions, v1alpha1.ConditionUpToDate); c == nil || c.Status != metav1.ConditionTrue {
				return fmt.Errorf("UpToDate %+v", c)
			}
			var read []string
			for _, c := range ct.Status.Certificates {
				if c.Task == "" && len(c.Certificates) > 0 {
					read = append(read, c.Node)
				}
			}
			if !slices.Equal(read, kadmControlPlanes) || ct.Status.NextCertificateExpiry == nil {
				return fmt.Errorf("certificates read by the agents on %v, want %v; next expiry %v", read, kadmControlPlanes, ct.Status.NextCertificateExpiry)
			}
			return nil
		})
		for _, c := range ct.Status.Certificates {
			onDisk := kadmCertificates(t, l.NodeRoot(c.Node))
			for _, cert := range c.Certificates {
				if want, ok := onDisk[cert.Name]; ok && !cert.NotAfter.UTC().Equal(want.NotAfter.UTC()) {
					t.Errorf("%s: the ClusterTarget says %s expires %v, the file says %v", c.Node, cert.Name, cert.NotAfter.UTC(), want.NotAfter.UTC())
				}
			}
		}
		var ops v1alpha1.NodeOperationList
		if err := l.Client.List(context.Background(), &ops); err != nil || len(ops.Items) != 0 {
			t.Errorf("a fresh install ran %d operations (%v)", len(ops.Items), err)
		}
	})

	t.Run("renewCertificates renews every control plane's certificates one node at a time and touches no worker", func(t *testing.T) {
		before := map[string]map[string]*x509.Certificate{}
		for _, n := range kadmControlPlanes {
			before[n] = kadmCertificates(t, l.NodeRoot(n))
		}
		kadmDriftRead(t, l)
		workerTrees := kadmSettledTrees(t, l, kadmWorkers)
		op := &v1alpha1.NodeOperation{
			ObjectMeta: metav1.ObjectMeta{Name: "renew"},
			Spec:       v1alpha1.NodeOperationSpec{RenewCertificates: &v1alpha1.RenewCertificatesOperation{}},
		}
		_, events := framework.RunOperationWatched(t, l, op, framework.WaitForKubeadmOperation(v1alpha1.OperationSucceeded))

		if held, what := framework.MaxHeld(framework.WorkEvents(events), nil); held > 1 {
			t.Errorf("%d control planes worked on at once: %s", held, what)
		}
		seen := framework.NodesOf(events)
		if !slices.Equal(seen, kadmControlPlanes) {
			t.Errorf("the watch saw tasks on %v, want exactly the control planes %v", seen, kadmControlPlanes)
		}
		for _, n := range kadmControlPlanes {
			root := l.NodeRoot(n)
			after := kadmCertificates(t, root)
			for name, old := range before[n] {
				if cur := after[name]; !cur.NotBefore.After(old.NotBefore) {
					t.Errorf("%s %s: notBefore %v, was %v: not renewed", n, name, cur.NotBefore, old.NotBefore)
				}
			}
			task := framework.GetTask(t, l, objname.TaskName(op.Name, plan.GroupControlPlanes, n))
			reported := map[string]time.Time{}
			for _, c := range task.Status.Certificates {
				reported[c.Name] = c.NotAfter.UTC()
			}
			for name, cur := range after {
				if got, ok := reported[name]; !ok || !got.Equal(cur.NotAfter.UTC()) {
					t.Errorf("%s: task %s reports %s expiring %v (reported: %t), the renewed file says %v", n, task.Name, name, got, ok, cur.NotAfter.UTC())
				}
			}
			if len(reported) != len(after) {
				t.Errorf("%s: task reports %d certificates, the root has %d: %v", n, len(reported), len(after), task.Status.Certificates)
			}
			log := framework.ServiceLog(t, root)
			for _, c := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
				if !strings.Contains(log, "restart static-pod/"+c+" ") {
					t.Errorf("%s: static pod %s restart not recorded in the local service table:\n%s", n, c, log)
				}
			}
		}
		kadmSameTrees(t, l, kadmWorkers, workerTrees)
	})

	upgrade := func(name string, mode v1alpha1.ExecutionMode) *v1alpha1.NodeOperation {
		return &v1alpha1.NodeOperation{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.NodeOperationSpec{
				ExecutionMode: mode,
				Upgrade: &v1alpha1.UpgradeOperation{
					KubernetesVersion:     "v1.37.2",
					BinarySource:          &v1alpha1.BinarySource{BaseURL: source, InsecureHTTP: true}, // nodeops-local serves plain http
					IgnorePreflightErrors: framework.LocalPreflightIgnores,
				},
			},
		}
	}

	t.Run("upgrade in DryRun runs the control planes first and changes nothing", func(t *testing.T) {
		trees := kadmSettledTrees(t, l, append(append([]string(nil), kadmControlPlanes...), kadmWorkers...))
		cluster := kadmClusterState(t, l)
		op := upgrade("upgrade-dry-run", v1alpha1.ExecutionDryRun)
		_, events := framework.RunOperationWatched(t, l, op, framework.WaitForKubeadmOperation(v1alpha1.OperationSucceeded))

		kadmControlPlanesFirst(t, events)
		for _, task := range framework.OperationTasks(t, l, op.Name) {
			for i, c := range task.Spec.Commands {
				// kubeadm's dry run names its scratch directory kubeadm-upgrade-{apply,node}-dryrunNNN.
				if (c.KubeadmUpgradeApply != nil || c.KubeadmUpgradeNode != nil) && !strings.Contains(strings.ToLower(task.Status.Commands[i].OutputTail), "dryrun") {
					t.Errorf("%s: %s ran without --dry-run:\n%s", task.Name, c.DisplayName(), task.Status.Commands[i].OutputTail)
				}
			}
		}
		kadmSameTrees(t, l, append(append([]string(nil), kadmControlPlanes...), kadmWorkers...), trees)
		if after := kadmClusterState(t, l); after != cluster {
			t.Errorf("the cluster changed in DryRun:\nbefore %s\nafter  %s", cluster, after)
		}
		kadmAllSchedulable(t, l)
	})

	t.Run("upgrade for real replaces the binaries, restarts the kubelets and upgrades every node", func(t *testing.T) {
		all := append(append([]string(nil), kadmControlPlanes...), kadmWorkers...)
		served := map[string]string{}
		for _, b := range []string{"kubeadm", "kubelet", "kubectl"} {
			served[b] = framework.HTTPGetText(t, commands.BinaryURL(source, "v1.37.2", "amd64", b)+".sha256")
		}
		// kubeadm rewrites an unchanged kubelet configuration byte for byte: its modification time tells.
		oldKubelet, oldConfig, restarts := map[string]string{}, map[string]time.Time{}, map[string]int{}
		for _, n := range all {
			root := l.NodeRoot(n)
			oldKubelet[n] = framework.ReadFile(t, filepath.Join(root, "usr/bin/kubelet"))
			oldConfig[n] = modTime(t, filepath.Join(root, "var/lib/kubelet/config.yaml"))
			restarts[n] = framework.Restarts(t, root, "kubelet")
		}
		// Through the ClusterTarget: one edit, exactly one generated upgrade.
		op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "cluster-upgrade-v1.37.2-1"}}
		w := framework.WatchTasks(t, l, client.MatchingLabels{v1alpha1.LabelOperation: op.Name})
		framework.EditClusterTarget(t, l, func(ct *v1alpha1.ClusterTarget) {
			ct.Spec.KubernetesVersion = "v1.37.2"
			ct.Spec.Upgrade.BinarySource = upgrade("", v1alpha1.ExecutionAuto).Spec.Upgrade.BinarySource
			ct.Spec.Upgrade.IgnorePreflightErrors = framework.LocalPreflightIgnores
		})
		in := framework.WaitForKubeadmOperation(v1alpha1.OperationSucceeded)
		in.Name = op.Name
		framework.WaitForOperation(t, l, in)
		kadmControlPlanesFirst(t, w.Stop(t))
		framework.WaitForClusterTarget(t, l, "UpToDate with every node observed at v1.37.2", func(ct *v1alpha1.ClusterTarget) error {
			if c := meta.FindStatusCondition(ct.Status.Conditions, v1alpha1.ConditionUpToDate); c == nil || c.Status != metav1.ConditionTrue {
				return fmt.Errorf("UpToDate %+v", c)
			}
			for _, n := range ct.Status.Nodes {
				if n.KubeletVersion != "v1.37.2" {
					return fmt.Errorf("node %s: kubelet %s", n.Name, n.KubeletVersion)
				}
				for comp, v := range n.StaticPods {
					if comp != "etcd" && v != "v1.37.2" {
						return fmt.Errorf("node %s: %s %s", n.Name, comp, v)
					}
				}
			}
			if len(ct.Status.Nodes) != len(all) {
				return fmt.Errorf("%d nodes observed, want %d", len(ct.Status.Nodes), len(all))
			}
			return nil
		})
		if got := framework.GeneratedOperations(t, l); !slices.Equal(got, []string{op.Name}) {
			t.Errorf("operations generated: %v, want exactly %s", got, op.Name)
		}

		for _, n := range all {
			root := l.NodeRoot(n)
			for b, want := range served {
				if got := framework.FileSHA256(t, filepath.Join(root, "usr/bin", b)); got != want {
					t.Errorf("%s: /usr/bin/%s has sha256 %s, the binary source serves %s", n, b, got, want)
				}
			}
			if prev, err := os.ReadFile(filepath.Join(root, "usr/bin/kubelet"+commands.PrevSuffix)); err != nil || string(prev) != oldKubelet[n] {
				t.Errorf("%s: the replaced kubelet was not kept as /usr/bin/kubelet%s", n, commands.PrevSuffix)
			}
			if got := framework.Restarts(t, root, "kubelet"); got != restarts[n]+1 {
				t.Errorf("%s: %d kubelet restarts recorded, want %d", n, got, restarts[n]+1)
			}
			if modTime(t, filepath.Join(root, "var/lib/kubelet/config.yaml")).Equal(oldConfig[n]) {
				t.Errorf("%s: /var/lib/kubelet/config.yaml was not rewritten", n)
			}
		}
		// kubeadm upgrade node, not anything else, wrote the kubelet configuration on the other nodes.
		for _, task := range framework.OperationTasks(t, l, op.Name) {
			for i, c := range task.Spec.Commands {
				if c.KubeadmUpgradeNode != nil && !strings.Contains(task.Status.Commands[i].OutputTail, `Writing kubelet configuration to file "/var/lib/kubelet/config.yaml"`) {
					t.Errorf("%s: kubeadm upgrade node did not write the kubelet configuration:\n%s", task.Name, task.Status.Commands[i].OutputTail)
				}
			}
		}
		if v := kadmConfigVersion(t, l); v != "v1.37.2" {
			t.Errorf("kubeadm-config says %s after the upgrade", v)
		}
		for _, n := range kadmControlPlanes {
			var p corev1.Pod
			if err := l.Client.Get(context.Background(), client.ObjectKey{Namespace: "kube-system", Name: "kube-apiserver-" + n}, &p); err != nil {
				t.Fatal(err)
			}
			if img := p.Spec.Containers[0].Image; img != "registry.k8s.io/kube-apiserver:v1.37.2" {
				t.Errorf("%s runs %s after the upgrade", p.Name, img)
			}
		}
		kadmAllSchedulable(t, l)
	})

	t.Run("raising the ClusterTarget's rotationCount renews every control plane's certificates once, and never again", func(t *testing.T) {
		before := map[string]map[string]*x509.Certificate{}
		for _, n := range kadmControlPlanes {
			before[n] = kadmCertificates(t, l.NodeRoot(n))
		}
		framework.EditClusterTarget(t, l, func(ct *v1alpha1.ClusterTarget) { ct.Spec.Certificates.RotationCount = 1 })
		const name = "cluster-rotate-certificates-1-1"
		in := framework.WaitForKubeadmOperation(v1alpha1.OperationSucceeded)
		in.Name = name
		framework.WaitForOperation(t, l, in)
		for _, n := range kadmControlPlanes {
			after := kadmCertificates(t, l.NodeRoot(n))
			for cert, old := range before[n] {
				if !after[cert].NotBefore.After(old.NotBefore) {
					t.Errorf("%s %s: notBefore %v, was %v: not renewed", n, cert, after[cert].NotBefore, old.NotBefore)
				}
			}
		}
		framework.WaitForClusterTarget(t, l, "UpToDate after the rotation", func(ct *v1alpha1.ClusterTarget) error {
			if c := meta.FindStatusCondition(ct.Status.Conditions, v1alpha1.ConditionUpToDate); c == nil || c.Status != metav1.ConditionTrue || ct.Status.LastRotationCount != 1 {
				return fmt.Errorf("UpToDate %+v, lastRotationCount %d", c, ct.Status.LastRotationCount)
			}
			return nil
		})
		if got := framework.GeneratedOperations(t, l); !slices.Equal(got, []string{"cluster-upgrade-v1.37.2-1", name}) {
			t.Errorf("operations generated: %v, want the upgrade and exactly one rotation", got)
		}
	})

	t.Run("with kubeadm-config at v1.35.3 the ClusterTarget's plan has two upgrade steps", func(t *testing.T) {
		framework.EditClusterTarget(t, l, func(ct *v1alpha1.ClusterTarget) {
			ct.Spec.Paused = true // show the plan, run nothing: the nodes are really at v1.37.2
			ct.Spec.Upgrade.Path = []string{"v1.36.4"}
		})
		kadmSetConfigVersion(t, l, "v1.35.3")
		framework.WaitForClusterTarget(t, l, "a two-step upgrade path", func(ct *v1alpha1.ClusterTarget) error {
			if ct.Status.KubernetesVersion != "v1.35.3" || !slices.Equal(ct.Status.UpgradePath, []string{"v1.36.4", "v1.37.2"}) {
				return fmt.Errorf("observed %s, path %v", ct.Status.KubernetesVersion, ct.Status.UpgradePath)
			}
			return nil
		})
		out, err := exec.Command(filepath.Join(l.BinDir, "kubectl-nodeops"), "target", "--kubeconfig", l.Kubeconfig).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "steps: v1.36.4 -> v1.37.2") {
			t.Errorf("kubectl nodeops target does not show the two steps (%v):\n%s", err, out)
		}
		if got := framework.GeneratedOperations(t, l); len(got) != 2 {
			t.Errorf("a paused ClusterTarget generated: %v", got)
		}
	})

	t.Run("an upgrade skipping a minor version is refused before any task is created", func(t *testing.T) {
		kadmSetConfigVersion(t, l, "v1.35.3")
		op := upgrade("upgrade-skew", v1alpha1.ExecutionAuto)
		done, events := framework.RunOperationWatched(t, l, op, framework.WaitForKubeadmOperation(v1alpha1.OperationFailed))
		c := meta.FindStatusCondition(done.Status.Conditions, v1alpha1.ConditionFailed)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != plan.ReasonUnsupportedVersionSkew ||
			!strings.Contains(c.Message, "v1.35.3") || !strings.Contains(c.Message, "v1.37.2") {
			t.Errorf("Failed condition %+v, want reason %s naming v1.35.3 and v1.37.2", c, plan.ReasonUnsupportedVersionSkew)
		}
		if len(events) != 0 {
			t.Errorf("%d task events for a refused upgrade, first %s %s", len(events), events[0].Type, events[0].Task.Name)
		}
		if tasks := framework.OperationTasks(t, l, op.Name); len(tasks) != 0 {
			t.Errorf("%d tasks for a refused upgrade", len(tasks))
		}
	})
}

// kadmCertificates reads the leaf certificates `kubeadm certs renew all` renews in a control-plane
// root, by the names `kubeadm certs check-expiration` gives them.
func kadmCertificates(t *testing.T, root string) map[string]*x509.Certificate {
	t.Helper()
	out := map[string]*x509.Certificate{}
	for name, file := range map[string]string{
		"apiserver": "pki/apiserver.crt", "apiserver-etcd-client": "pki/apiserver-etcd-client.crt",
		"apiserver-kubelet-client": "pki/apiserver-kubelet-client.crt", "front-proxy-client": "pki/front-proxy-client.crt",
		"etcd-healthcheck-client": "pki/etcd/healthcheck-client.crt", "etcd-peer": "pki/etcd/peer.crt", "etcd-server": "pki/etcd/server.crt",
	} {
		path := filepath.Join(root, "etc/kubernetes", file)
		out[name] = framework.ParseCertificate(t, path, []byte(framework.ReadFile(t, path)))
	}
	for _, conf := range []string{"admin.conf", "super-admin.conf", "controller-manager.conf", "scheduler.conf"} {
		out[conf] = framework.KubeconfigClientCertificate(t, filepath.Join(root, "etc/kubernetes", conf))
	}
	return out
}

// kadmDriftRead waits until the ClusterTarget shows a drift reading from every node's agent. The
// first reading runs kubeadm's dry runs, which write under /etc/kubernetes/tmp for a moment and
// are removed before the reading is recorded: a snapshot of the roots taken during it would see
// files no operation wrote (make test saw "removed worker-3/etc/kubernetes/tmp/kubeadm-upgrade-
// node-dryrun..." once). Later readings run only when the compared files change.
func kadmDriftRead(t *testing.T, l *framework.Local) {
	t.Helper()
	all := append(append([]string(nil), kadmControlPlanes...), kadmWorkers...)
	framework.WaitForClusterTarget(t, l, "a drift reading from every node", func(ct *v1alpha1.ClusterTarget) error {
		var read []string
		for _, d := range ct.Status.Drift {
			read = append(read, d.Node)
		}
		sort.Strings(read)
		if !slices.Equal(read, all) {
			return fmt.Errorf("drift read on %v, want %v", read, all)
		}
		return nil
	})
}

// kadmTrees digests every entry of the nodes' roots: path -> type, permissions and content (a
// symlink's target), so that "unchanged" means byte for byte. nodeops' own state directory is left
// out: every task, a DryRun's too, holds the node's lock there (agent.NodeLockFile), which names
// the task holding it; the host's own files are all compared.
func kadmTrees(t *testing.T, l *framework.Local, nodes []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range nodes {
		root := l.NodeRoot(n)
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p == filepath.Join(root, filepath.Dir(agent.NodeLockFile)) {
				return fs.SkipDir
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			desc := info.Mode().String()
			switch {
			case info.Mode().IsRegular():
				f, err := os.Open(p)
				if err != nil {
					return err
				}
				h := sha256.New()
				_, err = io.Copy(h, f)
				_ = f.Close()
				if err != nil {
					return err
				}
				desc += " " + hex.EncodeToString(h.Sum(nil))
			case info.Mode()&fs.ModeSymlink != 0:
				target, err := os.Readlink(p)
				if err != nil {
					return err
				}
				desc += " -> " + target
			}
			out[n+"/"+rel] = desc
			return nil
		})
		if err != nil {
			t.Fatalf("digesting %s: %v", root, err)
		}
	}
	return out
}

// kadmSettledTrees is kadmTrees taken while no drift reading is under way. A reading (the first one,
// and another whenever the files it compares change, as after a renewal) runs kubeadm's dry runs,
// which leave kubeadm-upgrade-{apply,node}-dryrunNNN under /etc/kubernetes/tmp until the agent
// removes them when the reading ends: a before-snapshot taken during one holds entries no operation
// wrote, which the after-snapshot then lacks (a CI-like run saw "removed cp-1/etc/kubernetes/tmp/
// kubeadm-upgrade-node-dryrun..." in the DryRun upgrade's check on 2026-12-05).
func kadmSettledTrees(t *testing.T, l *framework.Local, nodes []string) map[string]string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		trees := kadmTrees(t, l, nodes)
		var scratch []string
		for p := range trees {
			if strings.Contains(p, "/etc/kubernetes/tmp/kubeadm-upgrade-") && strings.Contains(p, "-dryrun") {
				scratch = append(scratch, p)
			}
		}
		if len(scratch) == 0 {
			return trees
		}
		if time.Now().After(deadline) {
			sort.Strings(scratch)
			t.Fatalf("kubeadm dry runs' scratch directories stayed for a minute:\n%s", strings.Join(scratch, "\n"))
		}
		time.Sleep(time.Second)
	}
}

// kadmSameTrees requires the nodes' roots as they were before. The agents' drift readers run
// kubeadm's own dry runs after any task ran on their node, whose scratch directories
// (/etc/kubernetes/tmp/kubeadm-upgrade-node-dryrunNNN) exist only while a reading runs: the roots are
// read again until they match or a minute has passed, so a file an operation left stays a failure.
func kadmSameTrees(t *testing.T, l *framework.Local, nodes []string, before map[string]string) {
	t.Helper()
	var diff []string
	deadline := time.Now().Add(time.Minute)
	for {
		diff = treeDiff(before, kadmTrees(t, l, nodes))
		if len(diff) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if len(diff) > 0 {
		t.Errorf("%d node root entries differ:\n%s", len(diff), strings.Join(diff, "\n"))
	}
}

func treeDiff(before, after map[string]string) []string {
	var diff []string
	for p, d := range before {
		if a, ok := after[p]; !ok {
			diff = append(diff, "removed "+p)
		} else if a != d {
			diff = append(diff, fmt.Sprintf("changed %s: %s -> %s", p, d, a))
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			diff = append(diff, "added "+p)
		}
	}
	sort.Strings(diff)
	return diff
}

// kadmClusterState summarises what kubeadm upgrade would change in the cluster: kube-system
// ConfigMaps (kubeadm-config, kubelet-config, coredns), DaemonSets and Deployments (addons),
// the control planes' mirror pods (static pod manifests), and the nodes' schedulability.
func kadmClusterState(t *testing.T, l *framework.Local) string {
	t.Helper()
	ctx := context.Background()
	var parts []string
	var cms corev1.ConfigMapList
	var dss appsv1.DaemonSetList
	var deps appsv1.DeploymentList
	var pods corev1.PodList
	var nodes corev1.NodeList
	for _, list := range []client.ObjectList{&cms, &dss, &deps, &pods} {
		if err := l.Client.List(ctx, list, client.InNamespace("kube-system")); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Client.List(ctx, &nodes); err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		h := sha256.New()
		keys := make([]string, 0, len(cm.Data))
		for k := range cm.Data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(h, "%s=%s\n", k, cm.Data[k])
		}
		parts = append(parts, fmt.Sprintf("configmap/%s=%x", cm.Name, h.Sum(nil)[:6]))
	}
	for _, ds := range dss.Items {
		parts = append(parts, fmt.Sprintf("daemonset/%s@%d", ds.Name, ds.Generation))
	}
	for _, d := range deps.Items {
		parts = append(parts, fmt.Sprintf("deployment/%s@%d", d.Name, d.Generation))
	}
	for _, p := range pods.Items {
		if hash := p.Annotations[localcluster.AnnotationConfigHash]; hash != "" {
			parts = append(parts, fmt.Sprintf("mirror/%s=%s", p.Name, hash))
		}
	}
	for _, n := range nodes.Items {
		parts = append(parts, fmt.Sprintf("node/%s unschedulable=%t", n.Name, n.Spec.Unschedulable))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func kadmAllSchedulable(t *testing.T, l *framework.Local) {
	t.Helper()
	var nodes corev1.NodeList
	if err := l.Client.List(context.Background(), &nodes); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if _, ok := n.Annotations[commands.AnnotationWasUnschedulable]; n.Spec.Unschedulable || ok {
			t.Errorf("node %s: unschedulable=%t, cordon record left: %t", n.Name, n.Spec.Unschedulable, ok)
		}
	}
}

func kadmConfigVersion(t *testing.T, l *framework.Local) string {
	t.Helper()
	var cm corev1.ConfigMap
	if err := l.Client.Get(context.Background(), client.ObjectKey{Namespace: "kube-system", Name: "kubeadm-config"}, &cm); err != nil {
		t.Fatal(err)
	}
	v, err := plan.KubeadmConfigVersion(cm.Data["ClusterConfiguration"])
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// kadmSetConfigVersion rewrites kubernetesVersion in kube-system/kubeadm-config, as a cluster
// at that version would have it.
func kadmSetConfigVersion(t *testing.T, l *framework.Local, version string) {
	t.Helper()
	var cm corev1.ConfigMap
	if err := l.Client.Get(context.Background(), client.ObjectKey{Namespace: "kube-system", Name: "kubeadm-config"}, &cm); err != nil {
		t.Fatal(err)
	}
	base := cm.DeepCopy()
	cm.Data["ClusterConfiguration"] = regexp.MustCompile(`(?m)^kubernetesVersion: .*$`).ReplaceAllString(cm.Data["ClusterConfiguration"], "kubernetesVersion: "+version)
	if err := l.Client.Patch(context.Background(), &cm, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	if got := kadmConfigVersion(t, l); got != version {
		t.Fatalf("kubeadm-config says %s after setting %s", got, version)
	}
}

// kadmControlPlanesFirst checks on the watched events that the upgrade ran group by group: every
// node's preflight succeeded before any work started, the first control plane's task before any
// other work appeared, every control plane's before any worker's, and the control planes one at a
// time.
func kadmControlPlanesFirst(t *testing.T, events []framework.TaskEvent) {
	t.Helper()
	rank := map[string]int{plan.GroupPreflight: 0, plan.GroupFirstControlPlane: 1, plan.GroupOtherControlPlanes: 2, plan.GroupWorkers: 3}
	succeeded := map[string]bool{}
	tasksOf := map[int]map[string]bool{}
	for _, ev := range events {
		r, ok := rank[ev.Task.Spec.Group]
		if !ok {
			t.Errorf("task %s of unknown group %q", ev.Task.Name, ev.Task.Spec.Group)
			continue
		}
		if tasksOf[r] == nil {
			tasksOf[r] = map[string]bool{}
		}
		if !tasksOf[r][ev.Task.Name] {
			tasksOf[r][ev.Task.Name] = true
			for earlier := 0; earlier < r; earlier++ {
				for name := range tasksOf[earlier] {
					if !succeeded[name] {
						t.Errorf("task %s (group %s) appeared before %s had succeeded", ev.Task.Name, ev.Task.Spec.Group, name)
					}
				}
			}
		}
		if ev.Task.Status.Phase == v1alpha1.TaskSucceeded {
			succeeded[ev.Task.Name] = true
		}
	}
	if len(tasksOf[0]) != len(kadmControlPlanes)+len(kadmWorkers) || len(tasksOf[1]) != 1 || len(tasksOf[2]) != len(kadmControlPlanes)-1 || len(tasksOf[3]) != len(kadmWorkers) {
		t.Errorf("the watch saw %d, %d, %d and %d tasks in the four groups, want %d, 1, %d and %d",
			len(tasksOf[0]), len(tasksOf[1]), len(tasksOf[2]), len(tasksOf[3]), len(kadmControlPlanes)+len(kadmWorkers), len(kadmControlPlanes)-1, len(kadmWorkers))
	}
	cps := map[string]bool{}
	for _, n := range kadmControlPlanes {
		cps[n] = true
	}
	if held, what := framework.MaxHeld(framework.WorkEvents(events), cps); held > 1 {
		t.Errorf("%d control planes upgraded at once: %s", held, what)
	}
}

// modTime is when path was last written.
func modTime(t *testing.T, path string) time.Time {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.ModTime()
}
