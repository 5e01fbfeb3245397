package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// driftDeadline bounds how long a hand edit takes to show in the ClusterTarget: the agent looks at
// its files every 15 seconds (--drift-file-check), then runs the real kubeadm, on a loaded machine.
const driftDeadline = 3 * time.Minute

// driftSummary is the ClusterTarget's drift as one line per node, for the waits and their errors.
func driftSummary(ct *v1alpha1.ClusterTarget) string {
	var lines []string
	for _, d := range ct.Status.Drift {
		s := fmt.Sprintf("%s drifted=%t", d.Node, d.Drifted)
		if d.Problem != "" {
			s += " problem=" + d.Problem
		}
		for _, c := range d.Components {
			s += " [" + c.Component + ": " + c.Reason + "]"
		}
		lines = append(lines, s)
	}
	return strings.Join(lines, "; ")
}

// noDrift passes when every one of nodes has a reading in the ClusterTarget and none drifts.
func noDrift(nodes ...string) func(*v1alpha1.ClusterTarget) error {
	return func(ct *v1alpha1.ClusterTarget) error {
		read := map[string]bool{}
		for _, d := range ct.Status.Drift {
			if d.Drifted || d.Problem != "" {
				return fmt.Errorf("drift: %s", driftSummary(ct))
			}
			read[d.Node] = true
		}
		for _, n := range nodes {
			if !read[n] {
				return fmt.Errorf("no reading of %s yet: %s", n, driftSummary(ct))
			}
		}
		if ct.Status.DriftedNodes != 0 {
			return fmt.Errorf("driftedNodes %d", ct.Status.DriftedNodes)
		}
		return nil
	}
}

// TestDrift: each agent compares its node's static pod manifests and kubelet configuration with what
// the real kubeadm generates from kube-system's kubeadm-config and kubelet-config, and the
// ClusterTarget shows it per node: nothing on a fresh cluster (nodeops-local renders every file as
// kubeadm does), exactly the component and the field after a manifest and a kubelet configuration
// are edited by hand, nothing again once the edits are reverted by hand.
func TestDrift(t *testing.T) {
	t.Parallel()
	l := framework.StartLocal(t, "--control-planes=1", "--workers=1")
	l.WaitNodesReady(t, 2, 3*time.Minute)
	cp, worker := "cp-1", "worker-1"

	start := time.Now()
	framework.WaitForClusterTarget(t, l, "every node's drift read by its agent, none drifting", noDrift(cp, worker))
	t.Logf("a fresh cluster's drift read and shown in %s", time.Since(start).Round(time.Second))

	manifest := filepath.Join(l.NodeRoot(cp), "etc/kubernetes/manifests/kube-apiserver.yaml")
	kubeletConfig := filepath.Join(l.NodeRoot(worker), "var/lib/kubelet/config.yaml")
	originals := map[string][]byte{}
	for _, f := range []string{manifest, kubeletConfig} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		originals[f] = b
	}
	const flag = "    - --secure-port=6443\n"
	if !strings.Contains(string(originals[manifest]), flag) {
		t.Fatalf("%s has no %q:\n%s", manifest, flag, originals[manifest])
	}
	edited := strings.Replace(string(originals[manifest]), flag, flag+"    - --audit-log-maxage=7\n", 1)
	if err := os.WriteFile(manifest, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kubeletConfig, append(slices.Clone(originals[kubeletConfig]), "maxPods: 7\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	ct := framework.WaitForClusterTarget(t, l, "cp-1's kube-apiserver and worker-1's kubelet shown drifting by their hand edits, nothing else", func(ct *v1alpha1.ClusterTarget) error {
		want := map[string]struct{ component, reason string }{
			cp:     {v1alpha1.DriftKubeAPIServer, "--audit-log-maxage=7"},
			worker: {v1alpha1.DriftKubelet, "maxPods=7, kubeadm's has none"},
		}
		for _, d := range ct.Status.Drift {
			w, ok := want[d.Node]
			if !ok {
				if d.Drifted {
					return fmt.Errorf("%s drifts too: %s", d.Node, driftSummary(ct))
				}
				continue
			}
			if !d.Drifted || len(d.Components) != 1 || d.Components[0].Component != w.component || !strings.Contains(d.Components[0].Reason, w.reason) {
				return fmt.Errorf("drift: %s", driftSummary(ct))
			}
			delete(want, d.Node)
		}
		if len(want) != 0 || ct.Status.DriftedNodes != 2 {
			return fmt.Errorf("driftedNodes %d: %s", ct.Status.DriftedNodes, driftSummary(ct))
		}
		return nil
	})
	if took := time.Since(start); took > driftDeadline {
		t.Errorf("the hand edits showed after %s, more than %s", took.Round(time.Second), driftDeadline)
	}
	t.Logf("the hand edits showed in %s: %s", time.Since(start).Round(time.Second), driftSummary(ct))
	if ops := framework.GeneratedOperations(t, l); len(ops) != 0 {
		t.Errorf("drift generated operations %v: only controlPlane and kubelet sections generate reconfigure", ops)
	}

	for f, b := range originals {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	start = time.Now()
	framework.WaitForClusterTarget(t, l, "no drift once the edits are reverted by hand", noDrift(cp, worker))
	if took := time.Since(start); took > driftDeadline {
		t.Errorf("the revert showed after %s, more than %s", took.Round(time.Second), driftDeadline)
	}
	t.Logf("the revert showed in %s", time.Since(start).Round(time.Second))
}
