package localcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/plan"
)

// kubeletInterval is how often the kubelet-version stand-in looks at the roots' service tables.
const kubeletInterval = time.Second

// kubeletRestarts counts the `restart kubelet` lines of a root's local service table.
func kubeletRestarts(root string) (int, error) {
	data, err := os.ReadFile(filepath.Join(root, host.LocalServiceLog))
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "restart kubelet ") {
			n++
		}
	}
	return n, nil
}

// KubeletVersion is what a root's kubelet binary says it is: `kubelet --version` prints
// "Kubernetes v1.37.2".
func KubeletVersion(ctx context.Context, root string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(root, "usr/bin/kubelet"), "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s/usr/bin/kubelet --version: %w: %s", root, err, bytes.TrimSpace(out))
	}
	f := strings.Fields(string(out))
	if len(f) != 2 || f[0] != "Kubernetes" {
		return "", fmt.Errorf("%s/usr/bin/kubelet --version says %q", root, bytes.TrimSpace(out))
	}
	return f[1], nil
}

// runKubeletVersions is the local stand-in for a kubelet reporting its version: a real kubelet
// restarted on a new binary reports the new version in its Node's status.nodeInfo; a local node
// has no kubelet (kwok keeps its status), so after every `restart kubelet` in a root's service
// table (an upgrade's restartService) this asks the root's kubelet binary and records its answer.
func runKubeletVersions(ctx context.Context, c client.Client, dir string, nodes []string, logf func(string, ...any)) {
	seen := map[string]int{}
	for _, n := range nodes {
		seen[n], _ = kubeletRestarts(filepath.Join(dir, "nodes", n))
	}
	var lastLog time.Time
	for {
		if clock.Sleep(ctx, kubeletInterval) != nil {
			return
		}
		for _, n := range nodes {
			root := filepath.Join(dir, "nodes", n)
			count, err := kubeletRestarts(root)
			if err == nil && count == seen[n] {
				continue
			}
			if err == nil {
				err = reportKubeletVersion(ctx, c, n, root)
			}
			if err != nil {
				if ctx.Err() == nil && time.Since(lastLog) > time.Minute {
					logf("kubelet version of %s: %v", n, err)
					lastLog = time.Now()
				}
				continue
			}
			seen[n] = count
		}
	}
}

// reportKubeletVersion writes root's kubelet version into node's status, if it differs.
func reportKubeletVersion(ctx context.Context, c client.Client, node, root string) error {
	v, err := KubeletVersion(ctx, root)
	if err != nil {
		return err
	}
	return setKubeletVersion(ctx, c, node, v)
}

// setKubeletVersion writes v as node's kubelet version, if it differs.
func setKubeletVersion(ctx context.Context, c client.Client, node, v string) error {
	var n corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return err
	}
	if n.Status.NodeInfo.KubeletVersion == v {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"nodeInfo": map[string]string{"kubeletVersion": v}}})
	if err != nil {
		return err
	}
	// A Node's status is its kubelet's, which this stands in for; statuswrite writes nodeops' kinds.
	if err := c.Status().Patch(ctx, &n, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("recording kubelet %s on node %s: %w", v, node, err)
	}
	return nil
}

// runSimKubelets is the same stand-in for the simulated nodes, which have no root and whose one
// agent runs nothing: a sim node's kubelet "restarts onto" the kubelet its task installed, so an
// upgrade that reaches them ends with every node reporting the new version, as on a real cluster
// (the ClusterTarget says UpToDate only then). Only operations that restart the kubelet are read,
// and each finished one once, so a custom operation over thousands of sim nodes costs no reads.
func runSimKubelets(ctx context.Context, c client.Client, sims map[string]bool, logf func(string, ...any)) {
	done := map[types.UID]bool{}
	var lastLog time.Time
	for {
		if clock.Sleep(ctx, kubeletInterval) != nil {
			return
		}
		if err := syncSimKubelets(ctx, c, sims, done); err != nil && ctx.Err() == nil && time.Since(lastLog) > time.Minute {
			logf("kubelet versions of the simulated nodes: %v", err)
			lastLog = time.Now()
		}
	}
}

func syncSimKubelets(ctx context.Context, c client.Client, sims map[string]bool, done map[types.UID]bool) error {
	var ops v1alpha1.NodeOperationList
	if err := c.List(ctx, &ops); err != nil {
		return err
	}
	for i := range ops.Items {
		op := &ops.Items[i]
		if done[op.UID] || op.Spec.ExecutionMode == v1alpha1.ExecutionDryRun || !restartsKubelet(&op.Spec) {
			continue
		}
		// Read before the tasks: a finished operation's tasks are all final when listed after.
		finished := op.Status.Phase.Finished()
		var tasks v1alpha1.NodeTaskList
		if err := c.List(ctx, &tasks, client.MatchingLabels{v1alpha1.LabelOperation: op.Name}); err != nil {
			return err
		}
		for j := range tasks.Items {
			t := &tasks.Items[j]
			if !sims[t.Spec.NodeName] {
				continue
			}
			if v := RestartedKubeletVersion(t); v != "" {
				if err := setKubeletVersion(ctx, c, t.Spec.NodeName, v); err != nil {
					return err
				}
			}
		}
		if finished {
			done[op.UID] = true
		}
	}
	return nil
}

// restartsKubelet says whether an operation's plan restarts the kubelet anywhere.
func restartsKubelet(spec *v1alpha1.NodeOperationSpec) bool {
	groups, err := plan.Expand(spec)
	if err != nil {
		return false
	}
	for _, g := range groups {
		for _, cmd := range g.Commands {
			if cmd.RestartService != nil && cmd.RestartService.Name == "kubelet" {
				return true
			}
		}
	}
	return false
}

// RestartedKubeletVersion is the version a task's node's kubelet runs after the task, as far as the
// task tells: that of the last kubelet it installed before a kubelet restart that succeeded; empty
// when no restart followed an install, or the task ran in DryRun (its commands changed nothing).
func RestartedKubeletVersion(t *v1alpha1.NodeTask) string {
	if t.Spec.ExecutionMode == v1alpha1.ExecutionDryRun {
		return ""
	}
	installed, running := "", ""
	for i, cmd := range t.Spec.Commands {
		if i >= len(t.Status.Commands) || t.Status.Commands[i].Phase != v1alpha1.CommandSucceeded {
			continue
		}
		switch {
		case cmd.InstallBinaries != nil && slices.Contains(cmd.InstallBinaries.Components, "kubelet"):
			installed = cmd.InstallBinaries.Version
		case cmd.RestartService != nil && cmd.RestartService.Name == "kubelet" && installed != "":
			running = installed
		}
	}
	return running
}
