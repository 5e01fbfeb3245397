package commands

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"reflect"
	"slices"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// The cluster-wide configuration kubeadm keeps, and the credentials kubeadm upgrade apply reads it
// with on a control plane. The agent's own ServiceAccount has no right to kube-system's ConfigMaps.
const (
	adminConf               = "/etc/kubernetes/admin.conf"
	kubeadmConfigMap        = "kubeadm-config"
	kubeadmConfigKey        = "ClusterConfiguration"
	kubeletConfigMap        = "kubelet-config"
	kubeletConfigKey        = "kubelet"
	kubeadmConfigAPIVersion = "kubeadm.k8s.io/v1beta4"
	kubeAPIServerManifest   = "/etc/kubernetes/manifests/kube-apiserver.yaml"
	kubeletConfigFile       = "/var/lib/kubelet/config.yaml"
)

// adminClient talks to the cluster as the host's admin.conf says, as kubeadm does; in a DryRun its
// writes are the API server's dry runs, as env.Client's are.
func adminClient(env *Env) (client.Client, error) {
	data, err := env.Host.Files.ReadFile(adminConf)
	if err != nil {
		return nil, fmt.Errorf("reading %s (the cluster's configuration is changed on a control plane, with kubeadm's credentials): %w", adminConf, err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", adminConf, err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, fmt.Errorf("a client from %s: %w", adminConf, err)
	}
	if env.DryRun {
		return client.NewDryRunClient(c), nil
	}
	return c, nil
}

// runKubeadmUpdateConfig patches kubeadm-config and kubelet-config, each written only when the patch
// changes it: run again (a retry, an agent restarted mid-command) it finds them patched and writes nothing.
func runKubeadmUpdateConfig(ctx context.Context, env *Env, c *v1alpha1.KubeadmUpdateConfigCommand) (Result, error) {
	cl, err := adminClient(env)
	if err != nil {
		return Result{}, err
	}
	var changed []string
	if c.ClusterConfiguration != nil {
		did, err := updateConfigMap(ctx, env, cl, kubeadmConfigMap, kubeadmConfigKey, func(s string) (string, error) {
			return PatchClusterConfiguration(s, c.ClusterConfiguration)
		})
		if err != nil {
			return Result{}, err
		}
		if did {
			changed = append(changed, kubeadmConfigMap)
		}
	}
	if c.KubeletConfiguration != "" {
		did, err := updateConfigMap(ctx, env, cl, kubeletConfigMap, kubeletConfigKey, func(s string) (string, error) {
			return PatchKubeletConfiguration(s, c.KubeletConfiguration)
		})
		if err != nil {
			return Result{}, err
		}
		if did {
			changed = append(changed, kubeletConfigMap)
		}
	}
	if len(changed) == 0 {
		return Result{Message: "kube-system's kubeadm configuration already holds the patch: nothing written"}, nil
	}
	return Result{Message: "patched kube-system/" + strings.Join(changed, " and kube-system/")}, nil
}

// updateConfigMap applies patch to one key of a kube-system ConfigMap, prints the difference and
// writes it when there is one (an update, so a concurrent change fails it rather than being lost).
func updateConfigMap(ctx context.Context, env *Env, cl client.Client, name, key string, patch func(string) (string, error)) (bool, error) {
	var cm corev1.ConfigMap
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: name}, &cm); err != nil {
		return false, fmt.Errorf("reading kube-system/%s: %w", name, err)
	}
	old, ok := cm.Data[key]
	if !ok {
		return false, fmt.Errorf("kube-system/%s has no %s", name, key)
	}
	updated, err := patch(old)
	if err != nil {
		return false, fmt.Errorf("kube-system/%s: %w", name, err)
	}
	if updated == old {
		env.printf("kube-system/%s: unchanged, already patched\n", name)
		return false, nil
	}
	env.printf("kube-system/%s %s:\n%s", name, key, LineDiff(old, updated))
	cm.Data[key] = updated
	if err := cl.Update(ctx, &cm); err != nil {
		return false, fmt.Errorf("writing kube-system/%s: %w", name, err)
	}
	if env.DryRun {
		env.printf("dry run: would write kube-system/%s (the API server accepted it in a dry run)\n", name)
	}
	return true, nil
}

// PatchClusterConfiguration applies p to a ClusterConfiguration in kubeadm's v1beta4 YAML. It
// returns the text as it was when the patch changes nothing, so that patching twice is patching once.
func PatchClusterConfiguration(text string, p *v1alpha1.ClusterConfigurationPatch) (string, error) {
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		return "", fmt.Errorf("ClusterConfiguration unreadable: %w", err)
	}
	if v := doc["apiVersion"]; v != kubeadmConfigAPIVersion {
		return "", fmt.Errorf("ClusterConfiguration is %v: only %s (kubeadm v1.31 and later) can be reconfigured", v, kubeadmConfigAPIVersion)
	}
	if k := doc["kind"]; k != "ClusterConfiguration" {
		return "", fmt.Errorf("kind %v, want ClusterConfiguration", k)
	}
	before, err := json.Marshal(doc)
	if err != nil {
		return "", err
	}
	if p.APIServer != nil {
		patchComponent(section(doc, "apiServer"), &p.APIServer.ControlPlaneComponentPatch)
		if len(p.APIServer.CertSANs) > 0 {
			s := section(doc, "apiServer")
			sans, _ := s["certSANs"].([]any)
			for _, san := range p.APIServer.CertSANs {
				if !slices.Contains(sans, any(san)) {
					sans = append(sans, san)
				}
			}
			s["certSANs"] = sans
		}
	}
	if p.ControllerManager != nil {
		patchComponent(section(doc, "controllerManager"), p.ControllerManager)
	}
	if p.Scheduler != nil {
		patchComponent(section(doc, "scheduler"), p.Scheduler)
	}
	if p.Etcd != nil {
		local := section(section(doc, "etcd"), "local")
		local["extraArgs"] = patchArgs(local["extraArgs"], p.Etcd.ExtraArgs, p.Etcd.RemoveExtraArgs)
	}
	if len(p.FeatureGates) > 0 {
		gates := section(doc, "featureGates")
		for _, name := range slices.Sorted(maps.Keys(p.FeatureGates)) {
			gates[name] = p.FeatureGates[name]
		}
	}
	after, err := json.Marshal(doc)
	if err != nil {
		return "", err
	}
	if bytes.Equal(before, after) {
		return text, nil
	}
	out, err := yaml.JSONToYAML(after)
	if err != nil {
		return "", err
	}
	return string(out), nil
}

// section is doc[key] as a map, made when missing.
func section(doc map[string]any, key string) map[string]any {
	s, ok := doc[key].(map[string]any)
	if !ok {
		s = map[string]any{}
		doc[key] = s
	}
	return s
}

func patchComponent(s map[string]any, p *v1alpha1.ControlPlaneComponentPatch) {
	if len(p.ExtraArgs) > 0 || len(p.RemoveExtraArgs) > 0 {
		s["extraArgs"] = patchArgs(s["extraArgs"], p.ExtraArgs, p.RemoveExtraArgs)
	}
	if len(p.ExtraVolumes) == 0 {
		return
	}
	vols, _ := s["extraVolumes"].([]any)
	for _, v := range p.ExtraVolumes {
		m := map[string]any{"name": v.Name, "hostPath": v.HostPath, "mountPath": v.MountPath}
		if v.ReadOnly {
			m["readOnly"] = true
		}
		if v.PathType != "" {
			m["pathType"] = string(v.PathType)
		}
		i := slices.IndexFunc(vols, func(o any) bool { om, _ := o.(map[string]any); return om["name"] == v.Name })
		if i >= 0 {
			vols[i] = m
		} else {
			vols = append(vols, m)
		}
	}
	s["extraVolumes"] = vols
}

// patchArgs sets each flag of set by name (every entry of that name replaced by one, in the first's
// place) and drops those named in remove: kubeadm v1beta4's extraArgs are a list of {name, value}.
func patchArgs(existing any, set []v1alpha1.ExtraArg, remove []string) []any {
	args, _ := existing.([]any)
	name := func(a any) string { m, _ := a.(map[string]any); n, _ := m["name"].(string); return n }
	for _, a := range set {
		entry := map[string]any{"name": a.Name, "value": a.Value}
		i := slices.IndexFunc(args, func(o any) bool { return name(o) == a.Name })
		if i < 0 {
			args = append(args, entry)
			continue
		}
		args[i] = entry
		args = slices.Concat(args[:i+1], slices.DeleteFunc(slices.Clone(args[i+1:]), func(o any) bool { return name(o) == a.Name }))
	}
	args = slices.DeleteFunc(args, func(o any) bool { return slices.Contains(remove, name(o)) })
	if args == nil {
		args = []any{}
	}
	return args
}

// PatchKubeletConfiguration applies a JSON merge patch to a KubeletConfiguration in YAML; the text is
// returned as it was when the patch changes nothing.
func PatchKubeletConfiguration(text, patch string) (string, error) {
	doc, err := yaml.YAMLToJSON([]byte(text))
	if err != nil {
		return "", fmt.Errorf("KubeletConfiguration unreadable: %w", err)
	}
	parsed, err := v1alpha1.KubeletPatch(patch)
	if err != nil {
		return "", err
	}
	p, err := json.Marshal(parsed)
	if err != nil {
		return "", err
	}
	merged, err := jsonpatch.MergePatch(doc, p)
	if err != nil {
		return "", fmt.Errorf("applying the kubelet patch: %w", err)
	}
	var a, b any
	if err := json.Unmarshal(doc, &a); err != nil {
		return "", err
	}
	if err := json.Unmarshal(merged, &b); err != nil {
		return "", err
	}
	if reflect.DeepEqual(a, b) {
		return text, nil
	}
	out, err := yaml.JSONToYAML(merged)
	if err != nil {
		return "", err
	}
	return string(out), nil
}

// LineDiff shows the lines of b not in a (+) and of a not in b (-), in order, by a longest common
// subsequence: enough for a configuration of a few hundred lines.
func LineDiff(a, b string) string {
	x, y := strings.Split(strings.TrimSuffix(a, "\n"), "\n"), strings.Split(strings.TrimSuffix(b, "\n"), "\n")
	lcs := make([][]int, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out strings.Builder
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			i, j = i+1, j+1
		case j < len(y) && (i == len(x) || lcs[i][j+1] >= lcs[i+1][j]):
			fmt.Fprintf(&out, "+ %s\n", y[j])
			j++
		default:
			fmt.Fprintf(&out, "- %s\n", x[i])
			i++
		}
	}
	return out.String()
}

// runKubeadmReconfigureNode regenerates the node's files from the cluster's configuration with
// kubeadm. Its DryRun is kubeadm's rendering twice, from the cluster's configuration as it is and
// with the operation's patches applied (which the DryRun did not write), and the difference printed.
func runKubeadmReconfigureNode(ctx context.Context, env *Env, c *v1alpha1.KubeadmReconfigureNodeCommand) (Result, error) {
	patches, err := patchesArgs(env)
	if err != nil {
		return Result{}, err
	}
	var done []string
	if c.ControlPlane {
		if !env.Host.Files.Exists(kubeAPIServerManifest) {
			return Result{}, fmt.Errorf("%s has no %s: it is no kubeadm control plane", env.NodeName, kubeAPIServerManifest)
		}
		if env.DryRun {
			if err := previewControlPlane(ctx, env, c.ClusterConfiguration, patches); err != nil {
				return Result{}, err
			}
		} else {
			// Certificates and etcd are not this operation's: only the manifests whose configuration
			// changed are rewritten, and kubeadm waits for each of them to restart.
			args := append([]string{"upgrade", "node", "phase", "control-plane", "--certificate-renewal=false", "--etcd-upgrade=false"}, patches...)
			if err := kubeadm(ctx, env, args...); err != nil {
				return Result{}, err
			}
		}
		done = append(done, "static pod manifests")
	}
	if c.Kubelet {
		if env.DryRun {
			if err := previewKubelet(ctx, env, c.KubeletConfiguration, patches); err != nil {
				return Result{}, err
			}
		} else if err := kubeadm(ctx, env, append([]string{"upgrade", "node", "phase", "kubelet-config"}, patches...)...); err != nil {
			return Result{}, err
		}
		done = append(done, "kubelet configuration")
	}
	if len(done) == 0 {
		return Result{Message: "nothing to regenerate"}, nil
	}
	return Result{Message: "regenerated the " + strings.Join(done, " and ") + " with kubeadm"}, nil
}

// patchesArgs passes the node's kubeadm patches directory when it has one, so that what kubeadm
// regenerates keeps them (as the drift reader does).
func patchesArgs(env *Env) ([]string, error) {
	fi, err := env.Host.Files.Stat(KubeadmPatchesDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("looking for %s: %w", KubeadmPatchesDir, err)
	case !fi.IsDir():
		return nil, fmt.Errorf("%s is no directory", KubeadmPatchesDir)
	}
	return []string{"--patches", KubeadmPatchesDir}, nil
}

// previewControlPlane prints, per static pod, how the patch changes what kubeadm generates for this
// node: `kubeadm init phase control-plane all --dry-run` from the cluster's ClusterConfiguration as it
// is and as patched, with this node's name and advertise address.
func previewControlPlane(ctx context.Context, env *Env, p *v1alpha1.ClusterConfigurationPatch, patches []string) error {
	if p == nil {
		return fmt.Errorf("a DryRun of the control plane needs the operation's clusterConfiguration patch")
	}
	cl, err := adminClient(env)
	if err != nil {
		return err
	}
	var cm corev1.ConfigMap
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: kubeadmConfigMap}, &cm); err != nil {
		return fmt.Errorf("reading kube-system/%s: %w", kubeadmConfigMap, err)
	}
	current := cm.Data[kubeadmConfigKey]
	patched, err := PatchClusterConfiguration(current, p)
	if err != nil {
		return err
	}
	manifest, err := env.Host.Files.ReadFile(kubeAPIServerManifest)
	if err != nil {
		return err
	}
	init, err := initConfiguration(env.NodeName, manifest)
	if err != nil {
		return err
	}
	before, err := renderControlPlane(ctx, env, init+"---\n"+current, patches)
	if err != nil {
		return err
	}
	after, err := renderControlPlane(ctx, env, init+"---\n"+patched, patches)
	if err != nil {
		return err
	}
	changed := false
	for _, name := range slices.Sorted(maps.Keys(after)) {
		diffs := StaticPodChanges([]byte(before[name]), []byte(after[name]))
		if len(diffs) == 0 {
			env.printf("dry run: %s %s: unchanged\n", env.NodeName, name)
			continue
		}
		changed = true
		env.printf("dry run: %s %s would change:\n", env.NodeName, name)
		for _, d := range diffs {
			env.printf("  %s\n", d)
		}
	}
	if !changed {
		env.printf("dry run: %s: no static pod manifest would change\n", env.NodeName)
	}
	return nil
}

// initConfiguration is the InitConfiguration kubeadm renders this control plane's manifests with:
// its node name, and the advertise address and port its API server runs with.
func initConfiguration(node string, apiserverManifest []byte) (string, error) {
	var pod corev1.Pod
	if err := yaml.Unmarshal(apiserverManifest, &pod); err != nil || len(pod.Spec.Containers) == 0 {
		return "", fmt.Errorf("%s unreadable: %v", kubeAPIServerManifest, err)
	}
	c := pod.Spec.Containers[0]
	f := flags(append(slices.Clone(c.Command), c.Args...))
	addr, port := f["--advertise-address"], f["--secure-port"]
	if addr == "" {
		return "", fmt.Errorf("%s has no --advertise-address", kubeAPIServerManifest)
	}
	if port == "" {
		port = "6443"
	}
	return fmt.Sprintf("apiVersion: %s\nkind: InitConfiguration\nlocalAPIEndpoint:\n  advertiseAddress: %q\n  bindPort: %s\nnodeRegistration:\n  name: %q\n",
		kubeadmConfigAPIVersion, addr, port, node), nil
}

// renderControlPlane runs `kubeadm init phase control-plane all --config --dry-run` with config and
// returns the manifests it wrote into its dry-run directory, by file name. The configuration file and
// kubeadm's dry-run directory are written for the run and removed after it: nothing stays on the node.
func renderControlPlane(ctx context.Context, env *Env, config string, patches []string) (map[string]string, error) {
	files := env.actingFiles()
	before, existed, err := dirNames(files, kubeadmTmp)
	if err != nil {
		return nil, err
	}
	// kubeadm reads its --config inside the root; the file goes where its dry runs write theirs.
	path := kubeadmTmp + "/nodeops-reconfigure.yaml"
	if err := files.WriteFileAtomic(path, []byte(config), 0o600); err != nil {
		return nil, fmt.Errorf("writing kubeadm's configuration: %w", err)
	}
	var out bytes.Buffer
	args := append([]string{"init", "phase", "control-plane", "all", "--config", path, "--dry-run"}, patches...)
	runErr := env.Host.Kubeadm.Kubeadm(ctx, &out, args...)
	rendered := map[string]string{}
	now, _, listErr := dirNames(files, kubeadmTmp)
	var readErr error
	for name := range now {
		if before[name] || !strings.HasPrefix(name, "kubeadm-") || !strings.Contains(name, "dryrun") {
			continue
		}
		entries, err := files.ReadDir(kubeadmTmp + "/" + name)
		if err != nil {
			readErr = err
			continue
		}
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".yaml") {
				b, err := files.ReadFile(kubeadmTmp + "/" + name + "/" + e.Name())
				if err != nil {
					readErr = err
				}
				rendered[e.Name()] = string(b)
			}
		}
	}
	cleanErr := files.Remove(path)
	_, leftErr := removeDryRunLeftovers(files, kubeadmTmp, before, existed)
	if runErr != nil {
		return nil, fmt.Errorf("kubeadm %s: %w\n%s", strings.Join(args, " "), runErr, out.String())
	}
	if err := errors.Join(listErr, readErr, cleanErr, leftErr); err != nil {
		return nil, err
	}
	if len(rendered) == 0 {
		return nil, fmt.Errorf("kubeadm %s rendered no manifest:\n%s", strings.Join(args, " "), out.String())
	}
	return rendered, nil
}

// previewKubelet prints how the patch changes the kubelet configuration kubeadm writes for this node:
// `kubeadm upgrade node phase kubelet-config --dry-run` (from the ConfigMap as it is), then the patch
// merged into it. A patch in the node's patches directory that sets the same field wins on the node
// and is not shown here.
func previewKubelet(ctx context.Context, env *Env, p string, patches []string) error {
	var out bytes.Buffer
	if err := kubeadmDryRun(ctx, &Env{Host: env.Host, acting: env.acting, Out: &out, DryRun: true}, append([]string{"upgrade", "node", "phase", "kubelet-config"}, patches...)...); err != nil {
		return fmt.Errorf("kubeadm upgrade node phase kubelet-config --dry-run: %w\n%s", err, out.String())
	}
	current, ok := ParseDryRunFiles(out.String())[kubeletConfigFile]
	if !ok {
		return fmt.Errorf("kubeadm upgrade node phase kubelet-config --dry-run wrote no %s:\n%s", kubeletConfigFile, out.String())
	}
	patched, err := PatchKubeletConfiguration(current, p)
	if err != nil {
		return err
	}
	diffs := KubeletConfigChanges([]byte(current), []byte(patched))
	if len(diffs) == 0 {
		env.printf("dry run: %s %s: unchanged\n", env.NodeName, kubeletConfigFile)
		return nil
	}
	env.printf("dry run: %s %s would change:\n", env.NodeName, kubeletConfigFile)
	for _, d := range diffs {
		env.printf("  %s\n", d)
	}
	return nil
}
