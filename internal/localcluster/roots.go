package localcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"k8s.io/client-go/tools/clientcmd"
)

// BusyboxPath is the static busybox (Debian's busybox-static) copied into every node root as /bin/sh and its applets.
const BusyboxPath = "/bin/busybox"

// kubeadmConfigInRoot is where a control-plane root keeps the configuration its PKI was made from.
const kubeadmConfigInRoot = "/etc/kubernetes/kubeadm-config.yaml"

// sharedPKI are the files every control plane of one kubeadm cluster has in common: the CAs and the
// service-account key pair. They are made once in DIR/pki, which the local apiserver uses too, so
// kubeconfigs in node roots work against the local apiserver.
var sharedPKI = []string{
	"ca.crt", "ca.key", "front-proxy-ca.crt", "front-proxy-ca.key",
	"etcd/ca.crt", "etcd/ca.key", "sa.key", "sa.pub",
}

// kubeadm runs bin/kubeadm with args, returning its output in the error when it fails.
func kubeadm(ctx context.Context, bin string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "kubeadm"), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("kubeadm %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	return nil
}

// makeClusterPKI creates DIR/pki with kubeadm (CAs, the apiserver's serving certificate with
// 127.0.0.1 among its names, service-account keys) and the admin kubeconfig DIR/kubeconfig
// (super-admin: group system:masters, which needs no RBAC binding).
func makeClusterPKI(ctx context.Context, bin string, l clusterLayout, version string) error {
	cfg := filepath.Join(l.Dir, "kubeadm-config.yaml")
	err := os.WriteFile(cfg, []byte(KubeadmConfig(kubeadmConfigParams{
		NodeName: "nodeops-local", AdvertiseAddress: clusterAddress, ControlPlane: true,
		KubernetesVersion: version, Endpoint: l.endpoint(), CertificatesDir: filepath.Join(l.Dir, "pki"),
	})), 0o644)
	if err != nil {
		return fmt.Errorf("writing %s: %w", cfg, err)
	}
	if err := kubeadm(ctx, bin, "init", "phase", "certs", "all", "--config", cfg); err != nil {
		return err
	}
	tmp := filepath.Join(l.Dir, "tmp-kubeconfig")
	if err := kubeadm(ctx, bin, "init", "phase", "kubeconfig", "super-admin", "--config", cfg, "--kubeconfig-dir", tmp); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(tmp, "super-admin.conf"), l.kubeconfig()); err != nil {
		return fmt.Errorf("moving the admin kubeconfig into place: %w", err)
	}
	return os.RemoveAll(tmp)
}

// makeNodeRoot builds DIR/nodes/<name>: a small Debian-like / with busybox, kubeadm, containerd and
// kubelet configuration, and /etc/kubernetes as kubeadm leaves it (control planes: full PKI, kubeconfigs
// and static pod manifests made by `kubeadm --rootfs`; workers: kubelet.conf and the CA certificate).
func makeNodeRoot(ctx context.Context, bin string, l clusterLayout, spec NodeSpec, version string) error {
	root := filepath.Join(l.Dir, "nodes", spec.Name)
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "usr/local/bin", "etc/kubernetes/manifests", "etc/kubernetes/pki",
		"etc/containerd", "var/lib/kubelet", "var/lib/nodeops-local", "run", "root", "dev", "proc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return fmt.Errorf("creating node root %s: %w", spec.Name, err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "tmp"), 0o755); err != nil {
		return fmt.Errorf("creating node root %s: %w", spec.Name, err)
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777|os.ModeSticky); err != nil {
		return fmt.Errorf("node root %s: %w", spec.Name, err)
	}
	if err := os.Symlink("../run", filepath.Join(root, "var/run")); err != nil {
		return fmt.Errorf("node root %s: %w", spec.Name, err)
	}
	if err := makeDevices(root); err != nil {
		return fmt.Errorf("node root %s: %w", spec.Name, err)
	}
	if err := installBusybox(root); err != nil {
		return fmt.Errorf("node root %s: %w", spec.Name, err)
	}
	if err := copyFile(filepath.Join(bin, "kubeadm"), filepath.Join(root, "usr/bin/kubeadm"), 0o755); err != nil {
		return fmt.Errorf("node root %s: %w", spec.Name, err)
	}
	files := map[string]string{
		"etc/os-release":                       OSRelease,
		"etc/debian_version":                   "13.1\n",
		"etc/hostname":                         spec.Name + "\n",
		"etc/hosts":                            "127.0.0.1 localhost\n" + spec.IP + " " + spec.Name + "\n",
		"etc/containerd/config.toml":           ContainerdConfig,
		"var/lib/kubelet/kubeadm-flags.env":    KubeadmFlagsEnv,
		"var/lib/kubelet/instance-config.yaml": KubeletInstanceConfig,
		"var/lib/kubelet/config.yaml":          NodeKubeletConfig(),
	}
	if spec.Role == RoleControlPlane {
		files[strings.TrimPrefix(kubeadmConfigInRoot, "/")] = KubeadmConfig(kubeadmConfigParams{
			NodeName: spec.Name, AdvertiseAddress: spec.IP, ControlPlane: true,
			KubernetesVersion: version, Endpoint: l.endpoint(), CertificatesDir: "/etc/kubernetes/pki",
		})
	}
	for rel, content := range files {
		if err := os.WriteFile(filepath.Join(root, rel), []byte(content), 0o644); err != nil {
			return fmt.Errorf("node root %s: %w", spec.Name, err)
		}
	}
	for _, b := range []string{"kubelet", "kubectl"} {
		if err := os.WriteFile(filepath.Join(root, "usr/bin", b), []byte(placeholderBinary(b, version)), 0o755); err != nil {
			return fmt.Errorf("node root %s: %w", spec.Name, err)
		}
	}
	if spec.Role == RoleControlPlane {
		return controlPlaneKubernetesDir(ctx, bin, l, root)
	}
	return workerKubernetesDir(ctx, bin, l, spec, root, version)
}

func controlPlaneKubernetesDir(ctx context.Context, bin string, l clusterLayout, root string) error {
	for _, f := range sharedPKI {
		if err := copyFile(filepath.Join(l.Dir, "pki", f), filepath.Join(root, "etc/kubernetes/pki", f), 0o600); err != nil {
			return err
		}
	}
	for _, phase := range [][]string{
		{"certs", "all"}, {"kubeconfig", "all"}, {"control-plane", "all"}, {"etcd", "local"},
	} {
		args := append([]string{"--rootfs", root, "init", "phase"}, phase...)
		if err := kubeadm(ctx, bin, append(args, "--config", kubeadmConfigInRoot)...); err != nil {
			return err
		}
	}
	return pointKubeconfigsAt(filepath.Join(root, "etc/kubernetes"), "https://"+l.endpoint())
}

// pointKubeconfigsAt makes every kubeconfig in dir talk to server: kubeadm points the kubelet's,
// controller-manager's and scheduler's at the node's own advertise address, where nothing listens.
func pointKubeconfigsAt(dir, server string) error {
	confs, err := filepath.Glob(filepath.Join(dir, "*.conf"))
	if err != nil {
		return fmt.Errorf("listing kubeconfigs in %s: %w", dir, err)
	}
	for _, f := range confs {
		cfg, err := clientcmd.LoadFromFile(f)
		if err != nil {
			return fmt.Errorf("loading %s: %w", f, err)
		}
		for _, c := range cfg.Clusters {
			c.Server = server
		}
		if err := clientcmd.WriteToFile(*cfg, f); err != nil {
			return fmt.Errorf("writing %s: %w", f, err)
		}
	}
	return nil
}

// workerKubernetesDir gives a worker what `kubeadm join` leaves: kubelet.conf with a client
// certificate for system:node:<name> from the cluster CA (kubeadm upgrade node reads the node's name
// from it) and the CA certificate.
func workerKubernetesDir(ctx context.Context, bin string, l clusterLayout, spec NodeSpec, root, version string) error {
	tmp, err := os.MkdirTemp(l.Dir, "kubelet-conf-")
	if err != nil {
		return fmt.Errorf("node root %s: %w", spec.Name, err)
	}
	defer os.RemoveAll(tmp)
	cfg := filepath.Join(tmp, "kubeadm-config.yaml")
	err = os.WriteFile(cfg, []byte(KubeadmConfig(kubeadmConfigParams{
		NodeName: spec.Name, AdvertiseAddress: spec.IP,
		KubernetesVersion: version, Endpoint: l.endpoint(), CertificatesDir: filepath.Join(l.Dir, "pki"),
	})), 0o644)
	if err != nil {
		return fmt.Errorf("node root %s: %w", spec.Name, err)
	}
	if err := kubeadm(ctx, bin, "init", "phase", "kubeconfig", "kubelet", "--config", cfg, "--kubeconfig-dir", tmp); err != nil {
		return err
	}
	if err := copyFile(filepath.Join(tmp, "kubelet.conf"), filepath.Join(root, "etc/kubernetes/kubelet.conf"), 0o600); err != nil {
		return err
	}
	if err := pointKubeconfigsAt(filepath.Join(root, "etc/kubernetes"), "https://"+l.endpoint()); err != nil {
		return err
	}
	return copyFile(filepath.Join(l.Dir, "pki", "ca.crt"), filepath.Join(root, "etc/kubernetes/pki/ca.crt"), 0o644)
}

// makeDevices creates /dev/null, /dev/zero, /dev/random and /dev/urandom: programs run in the root
// need them (Go's os/exec opens /dev/null for a command without stdin). Without the privilege to make
// device nodes (not root) the root is left without them; chroot needs that privilege anyway.
func makeDevices(root string) error {
	for _, d := range []struct {
		name         string
		major, minor int
	}{{"null", 1, 3}, {"zero", 1, 5}, {"random", 1, 8}, {"urandom", 1, 9}} {
		path := filepath.Join(root, "dev", d.name)
		err := syscall.Mknod(path, syscall.S_IFCHR|0o666, d.major<<8|d.minor)
		if errors.Is(err, syscall.EPERM) {
			return nil
		}
		if err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("creating %s: %w", path, err)
		}
		// mknod applies the umask.
		if err := os.Chmod(path, 0o666); err != nil {
			return fmt.Errorf("chmod %s: %w", path, err)
		}
	}
	return nil
}

// installBusybox copies the static busybox to /bin/busybox and links every applet to it, /bin/sh included.
func installBusybox(root string) error {
	if err := copyFile(BusyboxPath, filepath.Join(root, "bin/busybox"), 0o755); err != nil {
		return fmt.Errorf("%w (install Debian's busybox-static: hack/install-deps.sh)", err)
	}
	out, err := exec.Command(BusyboxPath, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("listing busybox applets: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		link := filepath.Join(root, applet)
		if applet == "bin/busybox" {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", filepath.Dir(link), err)
		}
		if err := os.Symlink("/bin/busybox", link); err != nil && !os.IsExist(err) {
			return fmt.Errorf("linking busybox applet %s: %w", applet, err)
		}
	}
	return nil
}
