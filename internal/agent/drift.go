package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/host"
)

// DefaultDriftCheckInterval is how often an agent asks kubeadm what it would generate for its node,
// when its files have not changed; jittered by up to a fifth, as the certificate reading is.
const DefaultDriftCheckInterval = time.Hour

// DefaultDriftFileCheck is how often an agent looks whether its node's manifests or kubelet
// configuration changed (a digest of four files, no kubeadm): a change is compared at once.
const DefaultDriftFileCheck = 15 * time.Second

// Paths the drift reader compares, as kubeadm writes them.
const (
	staticPodDir      = "/etc/kubernetes/manifests"
	kubeletConfigPath = "/var/lib/kubelet/config.yaml"
)

// driftComponents are the static pods compared on a control plane: those `kubeadm upgrade node
// phase control-plane` generates (etcd is not among them).
var driftComponents = []string{v1alpha1.DriftKubeAPIServer, v1alpha1.DriftKubeControllerManager, v1alpha1.DriftKubeScheduler}

// DriftReader records in its Node's annotation v1alpha1.AnnotationDrift whether the node's static
// pod manifests (on a control plane) and kubelet configuration match what the real kubeadm generates
// from the cluster's kubeadm-config and kubelet-config ConfigMaps (`kubeadm upgrade node phase
// control-plane|kubelet-config --dry-run`), comparing the parts that matter (commands.DiffStaticPod,
// commands.DiffKubeletConfig). It reads soon after the agent starts, whenever the files' digest changes
// (looked at every FileCheck) and every Interval, jittered; it writes only when the reading changed.
type DriftReader struct {
	Client client.Client
	Node   string
	Host   *host.Host
	// Interval: zero for DefaultDriftCheckInterval.
	Interval time.Duration
	// FileCheck: zero for DefaultDriftFileCheck.
	FileCheck time.Duration
	// Busy says a task is running on the node: its files may be half changed, so the reading waits.
	Busy func() bool
	// Worked counts the tasks the agent began on the node: one that came and went since the last
	// reading may have changed what is compared (a reconfigure writes the files and the ConfigMaps)
	// or put a file back as it was, so the next look compares whatever the digest says.
	Worked func() uint64

	digest  string
	seen    uint64
	written string
}

// Start reads until ctx ends (a manager.Runnable). A failed reading is recorded as the reading's
// error and logged; it never stops the agent.
func (d *DriftReader) Start(ctx context.Context) error {
	every, look := d.Interval, d.FileCheck
	if every <= 0 {
		every = DefaultDriftCheckInterval
	}
	if look <= 0 {
		look = DefaultDriftFileCheck
	}
	logger := log.FromContext(ctx).WithValues("node", d.Node)
	next := time.Now().Add(time.Duration(rand.Int64N(int64(min(every, time.Minute))/5 + 1)))
	for {
		// At least a second between looks: a busy node, or a reading due, never spins.
		if err := clock.Sleep(ctx, max(min(look, time.Until(next)), time.Second)); err != nil {
			return nil
		}
		if d.Busy != nil && d.Busy() {
			continue
		}
		worked := d.worked()
		digest, err := d.fileDigest()
		if err == nil && digest == d.digest && worked == d.seen && time.Now().Before(next) {
			continue
		}
		if err == nil {
			err = d.ReadOnce(ctx)
		}
		if err != nil {
			logger.Error(err, "recording the node's drift")
			next = time.Now().Add(look)
			continue
		}
		d.digest, d.seen = digest, worked
		next = time.Now().Add(every + time.Duration(rand.Int64N(int64(every)/5+1)))
		// A file changed while kubeadm rendered and the reading compared: the reading may hold either
		// version, and a later edit back to the digest above would never be compared. Compare again.
		if after, err := d.fileDigest(); err != nil || after != digest {
			d.digest, next = "", time.Now()
		}
	}
}

func (d *DriftReader) worked() uint64 {
	if d.Worked == nil {
		return 0
	}
	return d.Worked()
}

// fileDigest sums the files drift compares, so that a change to one is compared at once.
func (d *DriftReader) fileDigest() (string, error) {
	h := sha256.New()
	for _, p := range append(manifestPaths(), kubeletConfigPath) {
		b, err := d.Host.Files.ReadFile(p)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", p, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func manifestPaths() []string {
	out := make([]string, 0, len(driftComponents))
	for _, c := range driftComponents {
		out = append(out, staticPodDir+"/"+c+".yaml")
	}
	return out
}

// ReadOnce compares the node once and records the reading if it changed.
func (d *DriftReader) ReadOnce(ctx context.Context) error {
	value := v1alpha1.EncodeDrift(d.Read(ctx))
	if value == d.written {
		return nil
	}
	var node corev1.Node
	if err := d.Client.Get(ctx, client.ObjectKey{Name: d.Node}, &node); err != nil {
		return fmt.Errorf("get node %s: %w", d.Node, err)
	}
	if node.Annotations[v1alpha1.AnnotationDrift] != value {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.AnnotationDrift: value}}})
		if err != nil {
			return err
		}
		if err := d.Client.Patch(ctx, &node, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return fmt.Errorf("record the drift on node %s: %w", d.Node, err)
		}
		log.FromContext(ctx).Info("drift recorded", "node", d.Node, "drift", value)
	}
	d.written = value
	return nil
}

// Read asks kubeadm what it generates for the node and compares: the components that differ, or
// the reason it could not compare.
func (d *DriftReader) Read(ctx context.Context) v1alpha1.DriftReading {
	var reading v1alpha1.DriftReading
	patches := []string{}
	if fi, err := d.Host.Files.Stat(commands.KubeadmPatchesDir); err == nil && fi.IsDir() {
		patches = []string{"--patches", commands.KubeadmPatchesDir}
	}
	if d.Host.Files.Exists(kubeAPIServerManifest) {
		want, err := d.render(ctx, append([]string{"upgrade", "node", "phase", "control-plane"}, patches...))
		if err != nil {
			return v1alpha1.DriftReading{Error: err.Error()}
		}
		for _, c := range driftComponents {
			path := staticPodDir + "/" + c + ".yaml"
			generated, ok := want[path]
			if !ok {
				return v1alpha1.DriftReading{Error: "kubeadm generated no " + path}
			}
			have, err := d.Host.Files.ReadFile(path)
			if errors.Is(err, fs.ErrNotExist) {
				reading.Components = append(reading.Components, v1alpha1.ComponentDrift{Component: c, Reason: "manifest missing"})
				continue
			}
			if err != nil {
				return v1alpha1.DriftReading{Error: fmt.Sprintf("reading %s: %v", path, err)}
			}
			if reason := commands.DiffStaticPod(have, []byte(generated)); reason != "" {
				reading.Components = append(reading.Components, v1alpha1.ComponentDrift{Component: c, Reason: reason})
			}
		}
	}
	want, err := d.render(ctx, append([]string{"upgrade", "node", "phase", "kubelet-config"}, patches...))
	if err != nil {
		return v1alpha1.DriftReading{Error: err.Error()}
	}
	generated, ok := want[kubeletConfigPath]
	if !ok {
		return v1alpha1.DriftReading{Error: "kubeadm generated no " + kubeletConfigPath}
	}
	have, err := d.Host.Files.ReadFile(kubeletConfigPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		reading.Components = append(reading.Components, v1alpha1.ComponentDrift{Component: v1alpha1.DriftKubelet, Reason: kubeletConfigPath + " missing"})
	case err != nil:
		return v1alpha1.DriftReading{Error: fmt.Sprintf("reading %s: %v", kubeletConfigPath, err)}
	default:
		if reason := commands.DiffKubeletConfig(have, []byte(generated)); reason != "" {
			reading.Components = append(reading.Components, v1alpha1.ComponentDrift{Component: v1alpha1.DriftKubelet, Reason: reason})
		}
	}
	return reading
}

// render runs a kubeadm phase in its dry-run form and returns the files it would write, by path.
func (d *DriftReader) render(ctx context.Context, args []string) (map[string]string, error) {
	var out bytes.Buffer
	if err := commands.KubeadmRender(ctx, d.Host, &out, args...); err != nil {
		return nil, fmt.Errorf("kubeadm %s --dry-run: %w: %s", joinArgs(args), err, lastLine(out.String()))
	}
	return commands.ParseDryRunFiles(out.String()), nil
}

func joinArgs(args []string) string { return strings.Join(args, " ") }

// lastLine is the last non-empty line of out: kubeadm's error, for the reading's reason.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}
