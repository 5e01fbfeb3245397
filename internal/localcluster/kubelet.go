package localcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/host"
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
	if err := c.Status().Patch(ctx, &n, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("recording kubelet %s on node %s: %w", v, node, err)
	}
	return nil
}
