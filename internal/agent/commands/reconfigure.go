package commands

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/kubeadmconfig"
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
			return kubeadmconfig.PatchClusterConfiguration(s, c.ClusterConfiguration)
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
			return kubeadmconfig.PatchKubeletConfiguration(s, c.KubeletConfiguration)
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
	env.printf("kube-system/%s %s:\n%s", name, key, kubeadmconfig.LineDiff(old, updated))
	cm.Data[key] = updated
	if err := cl.Update(ctx, &cm); err != nil {
		return false, fmt.Errorf("writing kube-system/%s: %w", name, err)
	}
	if env.DryRun {
		env.printf("dry run: would write kube-system/%s (the API server accepted it in a dry run)\n", name)
	}
	return true, nil
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
			// Certificates are not this operation's, and etcd only when the patch changes it: only
			// the manifests whose configuration changed are rewritten, and kubeadm waits for each of
			// them to restart (etcd: after checking the cluster's health and backing up its data
			// directory, until the etcd cluster is available again).
			etcd := c.ClusterConfiguration != nil && c.ClusterConfiguration.Etcd != nil
			args := append([]string{"upgrade", "node", "phase", "control-plane", "--certificate-renewal=false", fmt.Sprintf("--etcd-upgrade=%t", etcd)}, patches...)
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
	patched, err := kubeadmconfig.PatchClusterConfiguration(current, p)
	if err != nil {
		return err
	}
	manifest, err := env.Host.Files.ReadFile(kubeAPIServerManifest)
	if err != nil {
		return err
	}
	initCfg, err := initConfiguration(env.NodeName, manifest)
	if err != nil {
		return err
	}
	before, err := renderControlPlane(ctx, env, initCfg+"---\n"+current, patches, p.Etcd != nil)
	if err != nil {
		return err
	}
	after, err := renderControlPlane(ctx, env, initCfg+"---\n"+patched, patches, p.Etcd != nil)
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
	if err := yaml.Unmarshal(apiserverManifest, &pod); err != nil {
		return "", fmt.Errorf("%s unreadable: %w", kubeAPIServerManifest, err)
	}
	if len(pod.Spec.Containers) == 0 {
		return "", fmt.Errorf("%s has no container", kubeAPIServerManifest)
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
		kubeadmconfig.APIVersion, addr, port, node), nil
}

// renderControlPlane runs `kubeadm init phase control-plane all --config --dry-run` with config (and,
// with etcd, `kubeadm init phase etcd local`, which writes the manifest kubeadm upgrade writes) and
// returns the manifests written into kubeadm's dry-run directories, by file name. The configuration
// file and the dry-run directories are written for the run and removed after it: nothing stays on the node.
func renderControlPlane(ctx context.Context, env *Env, config string, patches []string, etcd bool) (map[string]string, error) {
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
	if runErr == nil && etcd {
		args = append([]string{"init", "phase", "etcd", "local", "--config", path, "--dry-run"}, patches...)
		runErr = env.Host.Kubeadm.Kubeadm(ctx, &out, args...)
	}
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
	patched, err := kubeadmconfig.PatchKubeletConfiguration(current, p)
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
