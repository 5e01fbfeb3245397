package realnode

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	images "github.com/nodeops/nodeops/hack/images"
)

// Workload is a Deployment or DaemonSet found in the manifests, waited for after applying.
type Workload struct{ Kind, Namespace, Name string }

// InstallNodeops installs nodeops with its Helm chart as a user installs the images `make images`
// built (`helm install` of charts/nodeops with the built helm, -f the values.yaml beside the
// layouts): each image by its index digest, imagePullPolicy Never since the layouts were imported
// into containerd, not pushed. On this one node: one manager replica and no PodDisruptionBudget:
// with two replicas and minAvailable 1 the upgrade's drain of the only node could never evict the
// second manager pod (its replacement cannot schedule on the cordoned node).
//
// One change a user of this cluster would make too: it runs no kube-proxy (kubeadm's addon is
// skipped, docs/realnode.md), so the kubernetes Service address does not route; nodeops' pods are told
// to reach the API server at the node's address (KUBERNETES_SERVICE_HOST/PORT), as on any cluster
// without kube-proxy. Helm's post-renderer (this program's post-render command, PostRender) does
// that, so the chart itself is installed unchanged.
func InstallNodeops(ctx context.Context, l Layout, apiHost string, imgs []NodeopsImage) error {
	start := time.Now()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this program for helm's post-renderer: %w", err)
	}
	args := HelmInstallArgs(filepath.Join(l.Repo, "charts", "nodeops"), filepath.Join(l.Images, images.HelmValuesFile), self, apiHost)
	var out bytes.Buffer
	if err := run(ctx, &out, filepath.Join(l.Bin, "helm"), args...); err != nil {
		Diagnose(ctx, os.Stdout, "nodeops-system")
		return fmt.Errorf("helm install nodeops: %w\n%s", err, out.String())
	}
	var refs []string
	for _, img := range imgs {
		refs = append(refs, img.Ref())
	}
	Logf("nodeops installed with its chart (helm install --wait -f %s: %s) in %s",
		filepath.Join(l.Images, images.HelmValuesFile), strings.Join(refs, ", "), time.Since(start).Round(time.Second))
	return nil
}

// HelmInstallArgs are the real node's helm install arguments (InstallNodeops): the values file
// `make images` wrote, both images never pulled, one manager and no PDB, the post-renderer.
func HelmInstallArgs(chart, valuesFile, postRenderer, apiHost string) []string {
	args := []string{"--kubeconfig", KubeconfigPath, "install", "nodeops", chart,
		"--namespace", "nodeops-system", "--create-namespace", "--wait", "--timeout", "5m",
		"--post-renderer", postRenderer, "--post-renderer-args", "post-render", "--post-renderer-args", apiHost,
		"-f", valuesFile, "--set", "manager.replicas=1", "--set", "manager.podDisruptionBudget.enabled=false"}
	for _, img := range images.Images() {
		args = append(args, "--set", "image."+img.Name+".pullPolicy=Never")
	}
	return args
}

// PostRender is helm's post-renderer for the real node: the rendered chart on in, with the API
// server's address set in nodeops' pods (RewriteManifests), on out.
func PostRender(in io.Reader, out io.Writer, apiHost string) error {
	data, err := io.ReadAll(in)
	if err != nil {
		return fmt.Errorf("read the rendered chart: %w", err)
	}
	rewritten, _, err := RewriteManifests(data, apiHost, "6443")
	if err != nil {
		return err
	}
	_, err = out.Write(rewritten)
	return err
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// RewriteManifests gives every container of the chart's Deployments and DaemonSets (nodeops' own:
// the chart renders no other) the API server's address. Namespaces are moved to the front. It
// returns the Deployments and DaemonSets it saw.
func RewriteManifests(in []byte, apiHost, apiPort string) ([]byte, []Workload, error) {
	var namespaces, rest [][]byte
	var workloads []Workload
	for _, doc := range docSep.Split(string(in), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			return nil, nil, fmt.Errorf("parse manifest: %w", err)
		}
		if obj == nil {
			continue
		}
		kind, _ := obj["kind"].(string)
		meta, _ := obj["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		ns, _ := meta["namespace"].(string)
		if kind == "Deployment" || kind == "DaemonSet" {
			if err := rewriteWorkload(obj, apiHost, apiPort); err != nil {
				return nil, nil, fmt.Errorf("%s %s: %w", kind, name, err)
			}
			if ns == "" {
				ns = "default"
			}
			workloads = append(workloads, Workload{Kind: kind, Namespace: ns, Name: name})
		}
		out, err := yaml.Marshal(obj)
		if err != nil {
			return nil, nil, fmt.Errorf("write manifest %s %s: %w", kind, name, err)
		}
		if kind == "Namespace" {
			namespaces = append(namespaces, out)
		} else {
			rest = append(rest, out)
		}
	}
	if len(workloads) == 0 {
		return nil, nil, fmt.Errorf("the rendered chart holds no Deployment or DaemonSet")
	}
	return bytes.Join(append(namespaces, rest...), []byte("---\n")), workloads, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func rewriteWorkload(obj map[string]any, apiHost, apiPort string) error {
	spec, _ := dig(obj, "spec", "template", "spec").(map[string]any)
	if spec == nil {
		return fmt.Errorf("no pod template")
	}
	for _, key := range []string{"initContainers", "containers"} {
		list, _ := spec[key].([]any)
		for _, c := range list {
			ctr, _ := c.(map[string]any)
			if ctr == nil {
				continue
			}
			env, _ := ctr["env"].([]any)
			var kept []any
			for _, e := range env {
				if m, _ := e.(map[string]any); m != nil && (m["name"] == "KUBERNETES_SERVICE_HOST" || m["name"] == "KUBERNETES_SERVICE_PORT") {
					continue
				}
				kept = append(kept, e)
			}
			ctr["env"] = append(kept,
				map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": apiHost},
				map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": apiPort})
		}
	}
	return nil
}

func dig(obj map[string]any, path ...string) any {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}

// Diagnose prints what explains a workload that does not become ready, before the teardown
// removes it: the nodes, every pod, the pods of namespace described, recent events, and the
// last lines of the kubelet's and containerd's logs.
func Diagnose(ctx context.Context, w io.Writer, namespace string) {
	fmt.Fprintln(w, "realnode: diagnostics follow")
	for _, args := range [][]string{
		{"get", "nodes", "-o", "wide"},
		{"get", "pods", "-A", "-o", "wide"},
		{"-n", namespace, "describe", "pods"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
	} {
		fmt.Fprintf(w, "--- kubectl %s\n", strings.Join(args, " "))
		if err := kubectl(ctx, w, args...); err != nil {
			fmt.Fprintf(w, "(%v)\n", err)
		}
	}
	for _, unit := range []string{"kubelet", "containerd"} {
		path := filepath.Join(LogDir, unit+".log")
		data, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(w, "--- %s: %v\n", path, err)
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		fmt.Fprintf(w, "--- last lines of %s\n%s\n", path, strings.Join(lines[max(len(lines)-40, 0):], "\n"))
	}
}
