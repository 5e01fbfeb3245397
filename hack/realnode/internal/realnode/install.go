package realnode

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Workload is a Deployment or DaemonSet found in the manifests, waited for after applying.
type Workload struct{ Kind, Namespace, Name string }

// InstallNodeops installs nodeops from the project's own manifests, as a user would: the CRDs,
// the RBAC, the manager Deployment, the agent DaemonSet and the admission policies, with
// nodeops' images replaced by the locally built ones (imagePullPolicy Never).
//
// One change a user of this cluster would make too: it runs no kube-proxy (kubeadm's addon is
// skipped, REALNODE.md), so the kubernetes Service address does not route; nodeops' pods are told
// to reach the API server at the node's address (KUBERNETES_SERVICE_HOST/PORT), as on any cluster
// without kube-proxy.
func InstallNodeops(ctx context.Context, l Layout, apiHost string) error {
	start := time.Now()
	cfg := filepath.Join(l.Repo, "config")
	for _, d := range []string{"crd", "rbac", "manager", "agent", "admission"} {
		if files, _ := manifestFiles(filepath.Join(cfg, d)); len(files) == 0 {
			return fmt.Errorf("nodeops cannot be installed: %s has no manifests", filepath.Join(cfg, d))
		}
	}
	// -k: config/crd holds a kustomization.yaml beside the CRDs, which -f would send to the API server.
	if err := kubectl(ctx, io.Discard, "apply", "--server-side", "-k", filepath.Join(cfg, "crd")); err != nil {
		return fmt.Errorf("install CRDs: %w", err)
	}
	if err := kubectl(ctx, io.Discard, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"); err != nil {
		return fmt.Errorf("CRDs not established: %w", err)
	}
	var all bytes.Buffer
	for _, d := range []string{"rbac", "manager", "agent", "admission"} {
		files, err := manifestFiles(filepath.Join(cfg, d))
		if err != nil {
			return err
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				return fmt.Errorf("read %s: %w", f, err)
			}
			all.WriteString("\n---\n")
			all.Write(data)
		}
	}
	out, workloads, err := RewriteManifests(all.Bytes(), map[string]string{"manager": ManagerImage, "agent": AgentImage}, apiHost, "6443")
	if err != nil {
		return err
	}
	file := filepath.Join(StateDir, "nodeops.yaml")
	if err := os.WriteFile(file, out, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", file, err)
	}
	// Namespaces first, so the namespaced objects in the same apply find theirs.
	if err := kubectl(ctx, io.Discard, "apply", "--server-side", "-f", file); err != nil {
		if err2 := kubectl(ctx, io.Discard, "apply", "--server-side", "-f", file); err2 != nil {
			return fmt.Errorf("install nodeops: %w", err2)
		}
	}
	for _, w := range workloads {
		if err := kubectl(ctx, io.Discard, "-n", w.Namespace, "rollout", "status", strings.ToLower(w.Kind)+"/"+w.Name, "--timeout=180s"); err != nil {
			Diagnose(ctx, os.Stdout, w.Namespace)
			return fmt.Errorf("nodeops %s %s/%s did not become ready: %w", w.Kind, w.Namespace, w.Name, err)
		}
	}
	Logf("nodeops installed (%d workloads ready) in %s", len(workloads), time.Since(start).Round(time.Second))
	return nil
}

func manifestFiles(dir string) ([]string, error) {
	var files []string
	for _, pat := range []string{"*.yaml", "*.yml"} {
		m, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", dir, err)
		}
		for _, f := range m {
			if filepath.Base(f) != "kustomization.yaml" {
				files = append(files, f)
			}
		}
	}
	sort.Strings(files)
	return files, nil
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// RewriteManifests points nodeops' Deployments and DaemonSets at local images: a container whose
// image repository ends in one of images' keys ("manager", "agent") gets that image and
// imagePullPolicy Never, and every container of those workloads gets the API server address.
// Namespaces are moved to the front. It returns the Deployments and DaemonSets it saw.
func RewriteManifests(in []byte, images map[string]string, apiHost, apiPort string) ([]byte, []Workload, error) {
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
			if err := rewriteWorkload(obj, images, apiHost, apiPort); err != nil {
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

func rewriteWorkload(obj map[string]any, images map[string]string, apiHost, apiPort string) error {
	spec, _ := dig(obj, "spec", "template", "spec").(map[string]any)
	if spec == nil {
		return fmt.Errorf("no pod template")
	}
	matched := false
	for _, key := range []string{"initContainers", "containers"} {
		list, _ := spec[key].([]any)
		for _, c := range list {
			ctr, _ := c.(map[string]any)
			if ctr == nil {
				continue
			}
			image, _ := ctr["image"].(string)
			repo := image
			if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
				repo = repo[:i]
			}
			base := repo[strings.LastIndex(repo, "/")+1:]
			local, ok := images[base]
			if !ok {
				continue
			}
			matched = true
			ctr["image"] = local
			ctr["imagePullPolicy"] = "Never"
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
	if !matched {
		return fmt.Errorf("no container image named after %v", keys(images))
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

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
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
