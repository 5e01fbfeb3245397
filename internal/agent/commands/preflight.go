package commands

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/plan"
)

// preflightProbeTimeout bounds each probe of a preflight check that waits on something else: a
// socket, a server, kubeadm. A probe that does not answer in time fails its check.
const preflightProbeTimeout = 15 * time.Second

// runPreflight checks the node; it changes nothing, so DryRun runs it as is. Every check runs, so
// the message names every reason the node fails at once; a check that cannot be evaluated fails
// (a gate that cannot be evaluated blocks, rule 14).
func runPreflight(ctx context.Context, env *Env, p *v1alpha1.PreflightCommand) (Result, error) {
	info := host.DetectOS(env.Host.Files)
	env.printf("os: id=%s version=%s family=%s init=%s packages=%s\n", info.ID, info.VersionID, info.Family, host.DetectInit(env.Host.Files), info.PackageManager)
	var failed []string
	for i := range p.Checks {
		ok, err := preflightCheck(ctx, env, &p.Checks[i], info)
		if err != nil {
			failed = append(failed, err.Error())
			continue
		}
		env.printf("ok: %s\n", ok)
	}
	if len(failed) > 0 {
		return Result{}, fmt.Errorf("preflight failed: %s", strings.Join(failed, "; "))
	}
	return Result{Message: fmt.Sprintf("%d checks passed (%s %s)", len(p.Checks), info.ID, info.VersionID)}, nil
}

// preflightCheck runs one check: what passed, or why it failed.
func preflightCheck(ctx context.Context, env *Env, c *v1alpha1.PreflightCheck, info host.OSInfo) (string, error) {
	switch {
	case c.Binary != "":
		fi, err := env.Host.Files.Stat(c.Binary)
		if err != nil || fi.IsDir() {
			return "", fmt.Errorf("binary %s is missing", c.Binary)
		}
		return "binary " + c.Binary, nil
	case c.MinFreeDiskMiB > 0:
		free, err := env.Host.Files.FreeBytes("/")
		if err != nil {
			return "", err
		}
		if mib := int64(free >> 20); mib < c.MinFreeDiskMiB { //nolint:gosec // bounded by disk size
			return "", fmt.Errorf("%d MiB free, %d MiB needed", mib, c.MinFreeDiskMiB)
		}
		return fmt.Sprintf("at least %d MiB free", c.MinFreeDiskMiB), nil
	case len(c.OSFamily) > 0:
		if !slices.Contains(c.OSFamily, info.Family) {
			return "", fmt.Errorf("OS family %s is not one of %s", info.Family, strings.Join(c.OSFamily, ", "))
		}
		return "OS family " + info.Family, nil
	case c.Kubeadm != nil:
		return checkKubeadm(ctx, env, c.Kubeadm.Version)
	case c.RuntimeSocket != "":
		return checkSocket(ctx, env, c.RuntimeSocket)
	case c.BinarySource != nil:
		return checkBinarySource(ctx, env, c.BinarySource)
	case c.KubeletSkew != nil:
		return checkKubeletSkew(ctx, env, c.KubeletSkew.KubernetesVersion)
	case c.InitSystem != nil:
		if env.Host.Services == nil {
			return "", fmt.Errorf("no service manager: services cannot be restarted")
		}
		if err := env.Host.Services.Supported(); err != nil {
			return "", fmt.Errorf("init system: %w", err)
		}
		return "services restart through " + env.Host.Services.Name(), nil
	case c.PackageManager != nil:
		// The same choice installPackages makes, so a node it would refuse fails here, before anything changes.
		m, err := choosePackageManager(c.PackageManager.Manager, info)
		if err != nil {
			return "", fmt.Errorf("unknown OS family or package manager (os-release ID %q, family %s): packages are never installed by guess: %w", info.ID, info.Family, err)
		}
		if !env.Host.Files.Exists(m.binary) {
			return "", fmt.Errorf("package manager %s: %s is not in the host root (OS %s, family %s)", m.name, m.binary, info.ID, info.Family)
		}
		return fmt.Sprintf("OS family %s, package manager %s", info.Family, m.name), nil
	}
	return "", fmt.Errorf("a check with nothing set")
}

// checkKubeadm runs the host's kubeadm for its version.
func checkKubeadm(ctx context.Context, env *Env, want string) (string, error) {
	if fi, err := env.Host.Files.Stat("/usr/bin/kubeadm"); err != nil || fi.IsDir() {
		return "", fmt.Errorf("kubeadm is missing (/usr/bin/kubeadm)")
	}
	ctx, cancel := context.WithTimeout(ctx, preflightProbeTimeout)
	defer cancel()
	var out strings.Builder
	if err := env.Host.Kubeadm.Kubeadm(ctx, &out, "version", "-o", "short"); err != nil {
		return "", fmt.Errorf("kubeadm version: %w: %s", err, lastLine(out.String()))
	}
	got := lastLine(out.String())
	if want != "" && got != want {
		return "", fmt.Errorf("kubeadm is %s, %s wanted", got, want)
	}
	return "kubeadm " + got, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// checkSocket connects to a unix socket under the host root.
func checkSocket(ctx context.Context, env *Env, p string) (string, error) {
	if p == plan.DefaultRuntimeSocket {
		// The planner's default stands for the node's own runtime: the kubelet's endpoint as
		// kubeadm configured it, else kubeadm's annotation on the Node (older kubeadm).
		if s := kubeletRuntimeEndpoint(env); s != "" {
			p = s
		} else if s := kubeadmCRISocket(ctx, env); s != "" {
			p = s
		}
	}
	real, err := env.Host.Files.Path(p)
	if err != nil {
		return "", err
	}
	addr, done, err := host.ShortUnixPath(real)
	if err != nil {
		return "", fmt.Errorf("container runtime socket %s: %w", p, err)
	}
	d := net.Dialer{Timeout: preflightProbeTimeout}
	conn, err := d.DialContext(ctx, "unix", addr)
	done()
	if err != nil {
		return "", fmt.Errorf("container runtime socket %s does not answer: %w", p, err)
	}
	_ = conn.Close()
	return "container runtime socket " + p + " answers", nil
}

// checkBinarySource asks the source, from this node, for each binary it will download (a HEAD).
func checkBinarySource(ctx context.Context, env *Env, b *v1alpha1.BinarySourceCheck) (string, error) {
	arch := env.Arch
	if arch == "" {
		arch = runtime.GOARCH
	}
	t := transport{insecureHTTP: b.Source.InsecureHTTP, caBundle: b.Source.CABundle}
	c, err := httpClient(env, t)
	if err != nil {
		return "", err
	}
	for _, name := range b.Components {
		url := BinaryURL(b.Source.BaseURL, b.Version, arch, name)
		if err := t.checkScheme(url); err != nil {
			return "", err
		}
		if err := head(ctx, c, url); err != nil {
			return "", fmt.Errorf("binary source unreachable: %w", err)
		}
	}
	return fmt.Sprintf("binary source %s has %s %s", b.Source.BaseURL, b.Version, strings.Join(b.Components, ", ")), nil
}

func head(ctx context.Context, c *http.Client, url string) error {
	ctx, cancel := context.WithTimeout(ctx, preflightProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("HEAD %s: %s", url, resp.Status)
	}
	return nil
}

// checkKubeletSkew compares the kubelet's version, as its Node reports it, with Kubernetes' skew
// policy for a control plane at target: the kubelet must not be newer, nor more than three minor
// versions older.
func checkKubeletSkew(ctx context.Context, env *Env, target string) (string, error) {
	if env.Client == nil {
		return "", fmt.Errorf("kubelet version: the agent has no API client to read its Node")
	}
	var node corev1.Node
	if err := env.Client.Get(ctx, types.NamespacedName{Name: env.NodeName}, &node); err != nil {
		return "", fmt.Errorf("kubelet version: reading node %s: %w", env.NodeName, err)
	}
	kv := node.Status.NodeInfo.KubeletVersion
	kubelet, err := version.ParseGeneric(kv)
	if err != nil {
		return "", fmt.Errorf("kubelet version %q of node %s: %w", kv, env.NodeName, err)
	}
	cp, err := version.ParseGeneric(target)
	if err != nil {
		return "", fmt.Errorf("target version %q: %w", target, err)
	}
	switch {
	case kubelet.Major() != cp.Major():
		return "", fmt.Errorf("kubelet %s and control plane %s differ in major version", kv, target)
	case kubelet.Minor() > cp.Minor():
		return "", fmt.Errorf("kubelet %s is newer than the control plane's %s (the skew policy allows none)", kv, target)
	case cp.Minor()-kubelet.Minor() > 3:
		return "", fmt.Errorf("kubelet %s is more than three minor versions older than %s (the skew policy's limit)", kv, target)
	}
	return fmt.Sprintf("kubelet %s within skew of %s", kv, target), nil
}

// kubeadmCRISocketAnnotation is where kubeadm records a node's container runtime socket.
const kubeadmCRISocketAnnotation = "kubeadm.alpha.kubernetes.io/cri-socket"

// kubeadmCRISocket is the socket path kubeadm recorded on the node, "" when it recorded none or
// the node cannot be read (the check then tries containerd's default).
func kubeadmCRISocket(ctx context.Context, env *Env) string {
	if env.Client == nil {
		return ""
	}
	node := &corev1.Node{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: env.NodeName}, node); err != nil {
		return ""
	}
	s := strings.TrimPrefix(node.Annotations[kubeadmCRISocketAnnotation], "unix://")
	if !strings.HasPrefix(s, "/") {
		return ""
	}
	return s
}

// kubeletRuntimeEndpoint is the container runtime socket the node's kubelet uses, as kubeadm wrote
// it: containerRuntimeEndpoint in /var/lib/kubelet/config.yaml, or --container-runtime-endpoint in
// /var/lib/kubelet/kubeadm-flags.env; "" when neither names a unix socket path.
func kubeletRuntimeEndpoint(env *Env) string {
	if b, err := env.Host.Files.ReadFile("/var/lib/kubelet/config.yaml"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "containerRuntimeEndpoint:"); ok {
				if s := unixSocketPath(v); s != "" {
					return s
				}
			}
		}
	}
	if b, err := env.Host.Files.ReadFile("/var/lib/kubelet/kubeadm-flags.env"); err == nil {
		for _, f := range strings.Fields(strings.NewReplacer(`"`, " ", "'", " ").Replace(string(b))) {
			if v, ok := strings.CutPrefix(f, "--container-runtime-endpoint="); ok {
				if s := unixSocketPath(v); s != "" {
					return s
				}
			}
		}
	}
	return ""
}

// unixSocketPath is the path of an endpoint such as unix:///run/containerd/containerd.sock.
func unixSocketPath(v string) string {
	s := strings.TrimPrefix(strings.Trim(strings.TrimSpace(v), `"'`), "unix://")
	if !strings.HasPrefix(s, "/") {
		return ""
	}
	return s
}
