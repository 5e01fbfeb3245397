package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/internal/localcluster"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// TestLocalCluster brings up nodeops-local with 1 control plane, 2 workers and 100 simulated nodes
// and checks what issue 2 promises, then stops it with SIGTERM and checks nothing it started survives.
func TestLocalCluster(t *testing.T) {
	t.Parallel()
	l := framework.StartLocal(t, "--control-planes=1", "--workers=2", "--sim-nodes=100", "--no-manager", "--no-agents")

	t.Run("all 103 nodes are Ready with the promised labels and taints", func(t *testing.T) {
		var nodes corev1.NodeList
		if err := l.Client.List(context.Background(), &nodes); err != nil {
			t.Fatal(err)
		}
		if len(nodes.Items) != 103 {
			t.Fatalf("want 103 nodes, have %d", len(nodes.Items))
		}
		sims := 0
		for i := range nodes.Items {
			n := &nodes.Items[i]
			if !localcluster.NodeReady(n) {
				t.Errorf("node %s is not Ready: %v", n.Name, n.Status.Conditions)
			}
			if n.Labels["kubernetes.io/hostname"] != n.Name || n.Labels["kubernetes.io/os"] != "linux" {
				t.Errorf("node %s labels %v", n.Name, n.Labels)
			}
			_, cpLabel := n.Labels["node-role.kubernetes.io/control-plane"]
			cpTaint := false
			for _, taint := range n.Spec.Taints {
				cpTaint = cpTaint || taint.Key == "node-role.kubernetes.io/control-plane" && taint.Effect == corev1.TaintEffectNoSchedule
			}
			isCP := strings.HasPrefix(n.Name, "cp-")
			if cpLabel != isCP || cpTaint != isCP {
				t.Errorf("node %s: control-plane label %v, taint %v", n.Name, cpLabel, cpTaint)
			}
			if strings.HasPrefix(n.Name, "sim-") {
				sims++
			}
		}
		if sims != 100 {
			t.Errorf("want 100 sim nodes, have %d", sims)
		}
		out := l.MustKubectl(t, "get", "nodes", "--no-headers")
		if got := strings.Count(out, " Ready "); got != 103 {
			t.Errorf("kubectl get nodes shows %d Ready nodes, want 103:\n%s", got, out)
		}
	})

	t.Run("kubeadm checks the certificates of a control-plane root through chroot", func(t *testing.T) {
		root := l.NodeRoot("cp-1")
		out, err := exec.Command("chroot", root, "/usr/bin/kubeadm", "certs", "check-expiration").CombinedOutput()
		if err != nil {
			t.Fatalf("chroot %s /usr/bin/kubeadm certs check-expiration: %v\n%s", root, err, out)
		}
		for _, want := range []string{"apiserver ", "apiserver-kubelet-client", "front-proxy-client", "etcd-server", "admin.conf", "ca "} {
			if !strings.Contains(string(out), want) {
				t.Errorf("check-expiration output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(string(out), "MISSING") {
			t.Errorf("check-expiration reports missing certificates:\n%s", out)
		}
	})

	t.Run("node roots are Debian-like with busybox, kubeadm, containerd and kubelet configuration", func(t *testing.T) {
		for _, node := range []string{"cp-1", "worker-1", "worker-2"} {
			root := l.NodeRoot(node)
			out, err := exec.Command("chroot", root, "/bin/sh", "-c", ". /etc/os-release && echo $ID && ls /etc/containerd/config.toml /var/lib/kubelet && /usr/bin/kubeadm version -o short").CombinedOutput()
			if err != nil {
				t.Fatalf("%s: chroot sh: %v\n%s", node, err, out)
			}
			if !strings.HasPrefix(string(out), "debian\n") || !strings.Contains(string(out), "v1.37.2") {
				t.Errorf("%s: unexpected output:\n%s", node, out)
			}
			toml, err := os.ReadFile(filepath.Join(root, "etc/containerd/config.toml"))
			if err != nil || !strings.HasPrefix(string(toml), "version = 3\n") {
				t.Errorf("%s: containerd config.toml is not version 3: %v", node, err)
			}
			// kubeadm upgrade node takes the node's name from kubelet.conf's client certificate.
			if cn := framework.KubeconfigClientCertificate(t, filepath.Join(root, "etc/kubernetes/kubelet.conf")).Subject.CommonName; cn != "system:node:"+node {
				t.Errorf("%s: kubelet.conf client certificate CN %q", node, cn)
			}
		}
		for _, manifest := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"} {
			if _, err := os.Stat(filepath.Join(l.NodeRoot("cp-1"), "etc/kubernetes/manifests", manifest+".yaml")); err != nil {
				t.Errorf("cp-1 lacks the %s static pod manifest: %v", manifest, err)
			}
		}
		if _, err := os.Stat(filepath.Join(l.NodeRoot("worker-1"), "etc/kubernetes/pki/ca.key")); err == nil {
			t.Errorf("worker-1 holds the cluster CA key")
		}
	})

	t.Run("kube-system holds kubeadm's configuration", func(t *testing.T) {
		var cm corev1.ConfigMap
		if err := l.Client.Get(context.Background(), client.ObjectKey{Namespace: "kube-system", Name: "kubeadm-config"}, &cm); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(cm.Data["ClusterConfiguration"], "kubernetesVersion: v1.36.4") {
			t.Errorf("kubeadm-config ClusterConfiguration:\n%s", cm.Data["ClusterConfiguration"])
		}
		if err := l.Client.Get(context.Background(), client.ObjectKey{Namespace: "kube-system", Name: "kubelet-config"}, &cm); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Kubectl("get", "crd", "nodeoperations.nodeops.io", "nodetasks.nodeops.io", "nodeprofiles.nodeops.io"); err != nil {
			t.Errorf("nodeops CRDs: %v", err)
		}
	})

	t.Run("a Job runs to completion on a kwok node", func(t *testing.T) {
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
			Spec: batchv1.JobSpec{
				Completions: ptr.To[int32](3),
				Parallelism: ptr.To[int32](3),
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers:    []corev1.Container{{Name: "hello", Image: "busybox", Command: []string{"echo", "hello"}}},
				}},
			},
		}
		if err := l.Client.Create(context.Background(), job); err != nil {
			t.Fatal(err)
		}
		testutil.EventuallyEvery(t, 3*time.Minute, framework.PollInterval, "job hello to complete", func(ctx context.Context) error {
			if err := l.Client.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
				return err
			}
			for _, c := range job.Status.Conditions {
				if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
					return nil
				}
			}
			return fmt.Errorf("%d of 3 succeeded", job.Status.Succeeded)
		})
		var pods corev1.PodList
		if err := l.Client.List(context.Background(), &pods, client.InNamespace("default"), client.MatchingLabels{"job-name": "hello"}); err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName == "" || strings.HasPrefix(p.Spec.NodeName, "cp-") || p.Status.Phase != corev1.PodSucceeded {
				t.Errorf("pod %s on node %q phase %s", p.Name, p.Spec.NodeName, p.Status.Phase)
			}
		}
	})

	t.Run("SIGTERM stops every process nodeops-local started", func(t *testing.T) {
		procs, err := l.Processes()
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"} {
			if procs[name] == 0 {
				t.Errorf("process table lacks %s: %v", name, procs)
			}
		}
		pids := []int{l.PID()}
		for _, pid := range procs {
			pids = append(pids, pid)
		}
		alive, err := localcluster.ProcessGroupMembers(pids)
		if err != nil || len(alive) < len(pids) {
			t.Fatalf("before SIGTERM, want every process alive: %v of %v (%v)", alive, pids, err)
		}
		if err := l.Stop(); err != nil {
			t.Fatalf("nodeops-local exited with %v after SIGTERM", err)
		}
		alive, err = localcluster.ProcessGroupMembers(pids)
		if err != nil || len(alive) > 0 {
			t.Fatalf("after SIGTERM, still running: %v (%v); process table %v", alive, err, procs)
		}
		for _, pid := range pids {
			if err := syscall.Kill(pid, 0); err == nil {
				t.Errorf("pid %d still exists", pid)
			}
		}
		if !strings.Contains(l.Output(), "left for inspection") {
			t.Errorf("nodeops-local did not report its stop:\n%s", l.Output())
		}
		if _, err := os.Stat(filepath.Join(l.Dir, "logs", "kube-apiserver.log")); err != nil {
			t.Errorf("DIR was not left for inspection: %v", err)
		}
	})
}

// TestTwoInstancesSideBySide runs two small instances at once and stops one with `nodeops-local down`.
func TestTwoInstancesSideBySide(t *testing.T) {
	t.Parallel()
	a := framework.StartLocal(t, "--workers=0", "--no-manager", "--no-agents")
	b := framework.StartLocal(t, "--workers=1", "--no-manager", "--no-agents")
	if a.RESTConfig.Host == b.RESTConfig.Host {
		t.Fatalf("both instances serve %s", a.RESTConfig.Host)
	}
	for _, tc := range []struct {
		l    *framework.Local
		want int
	}{{a, 1}, {b, 2}} {
		var nodes corev1.NodeList
		if err := tc.l.Client.List(context.Background(), &nodes); err != nil {
			t.Fatal(err)
		}
		if len(nodes.Items) != tc.want {
			t.Errorf("instance %s has %d nodes, want %d", tc.l.Dir, len(nodes.Items), tc.want)
		}
	}
	out, err := exec.Command(filepath.Join(a.BinDir, "nodeops-local"), "down", "--dir", a.Dir).CombinedOutput()
	if err != nil {
		t.Fatalf("nodeops-local down: %v\n%s", err, out)
	}
	select {
	case <-a.Exited():
	case <-time.After(30 * time.Second): // down returns once the process is gone; reaping it is the framework's
		t.Fatalf("nodeops-local down returned while the instance still runs")
	}
	if _, err := b.Kubectl("get", "nodes"); err != nil {
		t.Errorf("the other instance stopped too: %v", err)
	}
	if out, err := exec.Command(filepath.Join(a.BinDir, "nodeops-local"), "down", "--dir", a.Dir).CombinedOutput(); err == nil {
		t.Errorf("down on a stopped instance succeeded: %s", out)
	}
}
