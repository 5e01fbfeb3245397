package e2e

import (
	"fmt"
	"os"
	"path/filepath"
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
// ClusterTarget shows it per node: nothing on a fresh cluster, the component and the flag after a
// manifest is edited by hand, nothing again once the edit is reverted by hand.
func TestDrift(t *testing.T) {
	l := framework.StartLocal(t, "--control-planes=1", "--workers=1")
	l.WaitNodesReady(t, 2, 3*time.Minute)
	cp, worker := "cp-1", "worker-1"

	start := time.Now()
	framework.WaitForClusterTarget(t, l, "every node's drift read by its agent, none drifting", noDrift(cp, worker))
	t.Logf("a fresh cluster's drift read and shown in %s", time.Since(start).Round(time.Second))

	manifest := filepath.Join(l.NodeRoot(cp), "etc/kubernetes/manifests/kube-apiserver.yaml")
	original, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	const flag = "    - --secure-port=6443\n"
	if !strings.Contains(string(original), flag) {
		t.Fatalf("%s has no %q:\n%s", manifest, flag, original)
	}
	edited := strings.Replace(string(original), flag, flag+"    - --audit-log-maxage=7\n", 1)
	if err := os.WriteFile(manifest, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	ct := framework.WaitForClusterTarget(t, l, "cp-1's kube-apiserver shown drifting by its hand-added flag", func(ct *v1alpha1.ClusterTarget) error {
		for _, d := range ct.Status.Drift {
			if d.Node != cp {
				if d.Drifted {
					return fmt.Errorf("%s drifts too: %s", d.Node, driftSummary(ct))
				}
				continue
			}
			if !d.Drifted || len(d.Components) != 1 || d.Components[0].Component != v1alpha1.DriftKubeAPIServer ||
				!strings.Contains(d.Components[0].Reason, "--audit-log-maxage=7") {
				return fmt.Errorf("drift: %s", driftSummary(ct))
			}
		}
		if ct.Status.DriftedNodes != 1 {
			return fmt.Errorf("driftedNodes %d: %s", ct.Status.DriftedNodes, driftSummary(ct))
		}
		return nil
	})
	if took := time.Since(start); took > driftDeadline {
		t.Errorf("the hand edit showed after %s, more than %s", took.Round(time.Second), driftDeadline)
	}
	t.Logf("the hand edit showed in %s: %s", time.Since(start).Round(time.Second), driftSummary(ct))
	if ops := framework.GeneratedOperations(t, l); len(ops) != 0 {
		t.Errorf("drift generated operations %v: only controlPlane and kubelet sections generate reconfigure", ops)
	}

	if err := os.WriteFile(manifest, original, 0o600); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	framework.WaitForClusterTarget(t, l, "no drift once the edit is reverted by hand", noDrift(cp, worker))
	if took := time.Since(start); took > driftDeadline {
		t.Errorf("the revert showed after %s, more than %s", took.Round(time.Second), driftDeadline)
	}
	t.Logf("the revert showed in %s", time.Since(start).Round(time.Second))
}
