package realnode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Up starts the node from the built binaries and images and installs nodeops on it. A node left
// by an earlier run is torn down first.
func Up(ctx context.Context, l Layout) error {
	if os.Geteuid() != 0 {
		return errors.New("the real node needs root")
	}
	if _, err := os.Stat(OwnedList); err == nil {
		Logf("a node from an earlier run is still here: tearing it down first")
		if err := Down(ctx); err != nil {
			return fmt.Errorf("tear down the earlier node: %w", err)
		}
	}
	if _, err := os.Stat("/etc/kubernetes"); err == nil {
		return errors.New("/etc/kubernetes exists and was not made by realnode: refusing to touch this machine's cluster")
	}
	for _, port := range []int{6443, 2379, 2380, 2381, 10250, 10257, 10259} {
		if err := portFree(port); err != nil {
			return err
		}
	}
	addr, err := nodeAddress()
	if err != nil {
		return err
	}
	nodeopsImages, err := ReadNodeopsImages(l.Images)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := recordOwned(); err != nil {
		return err
	}
	if err := shareRootMount(); err != nil {
		return err
	}
	if err := installFiles(l); err != nil {
		return err
	}
	if err := startSupervisor(l); err != nil {
		return err
	}
	if err := waitFor(ctx, "containerd", 60*time.Second, func() error {
		return run(ctx, io.Discard, filepath.Join(RuntimeBinDir, "ctr"), "--address", ContainerdSock, "version")
	}); err != nil {
		return err
	}
	if err := importImages(ctx, l); err != nil {
		return err
	}
	if err := importLayouts(ctx, l.Images, nodeopsImages); err != nil {
		return err
	}
	Logf("kubeadm init %s (advertise address %s)", FromVersion, addr)
	if err := os.WriteFile(KubeadmConf, []byte(KubeadmConfig(FromVersion, addr)), 0o644); err != nil {
		return fmt.Errorf("write kubeadm config: %w", err)
	}
	initLog, err := os.Create(filepath.Join(LogDir, "kubeadm-init.log"))
	if err != nil {
		return fmt.Errorf("kubeadm log: %w", err)
	}
	defer initLog.Close()
	if err := run(ctx, initLog, "/usr/bin/kubeadm", "init", "--config", KubeadmConf,
		"--ignore-preflight-errors="+strings.Join(InitIgnoredPreflightErrors, ",")); err != nil {
		tailFile(filepath.Join(LogDir, "kubeadm-init.log"), 30)
		return fmt.Errorf("kubeadm init: %w (log %s)", err, initLog.Name())
	}
	if err := waitFor(ctx, "node Ready", 3*time.Minute, func() error {
		return kubectl(ctx, io.Discard, "wait", "--for=condition=Ready", "node", "--all", "--timeout=10s")
	}); err != nil {
		return err
	}
	Logf("cluster %s up in %s", FromVersion, time.Since(start).Round(time.Second))
	if err := InstallNodeops(ctx, l, addr, nodeopsImages); err != nil {
		return err
	}
	Logf("ready: kubeconfig=%s (up in %s)", KubeconfigPath, time.Since(start).Round(time.Second))
	return nil
}

// shareRootMount makes the host's / a shared mount, as systemd makes it on any systemd host: the
// agent mounts / at /host with HostToContainer propagation, which containerd refuses on a private
// mount. Only / itself changes (not its submounts); `down` makes it private again.
func shareRootMount() error {
	opt, err := mountOptionalFields("/")
	if err != nil {
		return err
	}
	if strings.Contains(opt, "shared:") || strings.Contains(opt, "master:") {
		return nil
	}
	if err := os.WriteFile(RootMadeShared, nil, 0o644); err != nil {
		return fmt.Errorf("record mount change: %w", err)
	}
	if err := syscall.Mount("none", "/", "", syscall.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make / a shared mount: %w", err)
	}
	Logf("made / a shared mount (as systemd does), for the agent's /host with HostToContainer propagation")
	return nil
}

// mountOptionalFields returns the optional fields (shared:N, master:N) of the mount at path.
func mountOptionalFields(path string) (string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("read mounts: %w", err)
	}
	found, opt := false, ""
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 7 || unescapeMount(f[4]) != path {
			continue
		}
		found, opt = true, ""
		for _, x := range f[6:] {
			if x == "-" {
				break
			}
			opt += x + " "
		}
	}
	if !found {
		return "", fmt.Errorf("no mount at %s", path)
	}
	return opt, nil
}

// nodeAddress is the address of the interface holding the default route, which kubeadm would
// pick too; it is written into the configuration so nothing depends on that choice.
func nodeAddress() (string, error) {
	data, err := os.ReadFile("/proc/net/route")
	if err != nil {
		return "", fmt.Errorf("read routes: %w", err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[1] != "00000000" {
			continue
		}
		ifc, err := net.InterfaceByName(f[0])
		if err != nil {
			return "", fmt.Errorf("default route interface %s: %w", f[0], err)
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return "", fmt.Errorf("addresses of %s: %w", f[0], err)
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String(), nil
			}
		}
	}
	return "", errors.New("no IPv4 default route: kubeadm needs one to choose the node's address")
}

func portFree(port int) error {
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		return fmt.Errorf("port %d is in use: the node's control plane needs it: %w", port, err)
	}
	return ln.Close()
}

// recordOwned writes the list of candidate paths that do not exist yet: `down` removes those.
func recordOwned() error {
	var owned []string
	for _, p := range OwnedCandidates {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			owned = append(owned, p)
		}
	}
	for _, d := range []string{StateDir, LogDir, BackupDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("state dir: %w", err)
		}
	}
	if err := os.WriteFile(OwnedList, []byte(strings.Join(owned, "\n")+"\n"), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", OwnedList, err)
	}
	return nil
}

// installFiles puts the runtime, the CNI plugins and their configuration in the state directory,
// and kubeadm, kubelet, kubectl (v1.36) and the systemctl stand-in on the host, keeping originals.
func installFiles(l Layout) error {
	for _, d := range []string{RuntimeBinDir, CNIBinDir, CNIConfDir, RunDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", d, err)
		}
	}
	for _, n := range []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc"} {
		if err := copyFile(filepath.Join(l.RuntimeOut(), n), filepath.Join(RuntimeBinDir, n), 0o755); err != nil {
			return err
		}
	}
	for _, n := range []string{"bridge", "host-local", "loopback"} {
		if err := copyFile(filepath.Join(l.CNIOut(), n), filepath.Join(CNIBinDir, n), 0o755); err != nil {
			return err
		}
	}
	pause := "registry.k8s.io/pause:3.10.2"
	if specs, err := AllImageSpecs(context.Background(), l); err == nil {
		for _, s := range specs {
			if strings.HasSuffix(s.Path, "/pause") {
				pause = s.Ref
			}
		}
	}
	if err := backup(ContainerdConf); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(ContainerdConf), 0o755); err != nil {
		return fmt.Errorf("containerd config: %w", err)
	}
	if err := os.WriteFile(ContainerdConf, []byte(ContainerdConfig(pause)), 0o644); err != nil {
		return fmt.Errorf("containerd config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(CNIConfDir, "10-realnode.conflist"), []byte(CNIConfig()), 0o644); err != nil {
		return fmt.Errorf("CNI config: %w", err)
	}
	src := map[string]string{
		"/usr/bin/kubeadm": filepath.Join(l.KubeDir(FromVersion), "kubeadm"),
		"/usr/bin/kubelet": filepath.Join(l.KubeDir(FromVersion), "kubelet"),
		"/usr/bin/kubectl": filepath.Join(l.KubeDir(FromVersion), "kubectl"),
		ShimPath:           filepath.Join(l.ToolOut(), "systemctl"),
	}
	for _, dst := range HostBinaries {
		if err := backup(dst); err != nil {
			return err
		}
		if err := copyFile(src[dst], dst, 0o755); err != nil {
			return err
		}
	}
	Logf("installed containerd %s, runc %s, CNI plugins %s; kubeadm, kubelet, kubectl %s in /usr/bin; systemctl stand-in at %s",
		ContainerdVersion, RuncVersion, CNIVersion, FromVersion, ShimPath)
	return nil
}

// backup moves an existing host file (or symlink) aside, once.
func backup(path string) error {
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	dst := filepath.Join(BackupDir, path)
	if _, err := os.Lstat(dst); err == nil {
		return os.Remove(path)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("backup dir: %w", err)
	}
	if err := os.Rename(path, dst); err != nil {
		return fmt.Errorf("back up %s: %w", path, err)
	}
	return nil
}

// copyFile writes src to dst through a temporary file and a rename, so a running binary at dst
// is replaced, not overwritten.
func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	tmp := dst + ".realnode-tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return fmt.Errorf("copy to %s: %w", dst, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy to %s: %w", dst, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("copy to %s: %w", dst, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("copy to %s: %w", dst, err)
	}
	return nil
}

// startSupervisor starts `realnode supervise` in its own session, so it outlives this command,
// and waits for its socket.
func startSupervisor(l Layout) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find realnode binary: %w", err)
	}
	// The supervisor runs from the state directory, so it never depends on the checkout.
	bin := filepath.Join(RuntimeBinDir, "realnode")
	if err := copyFile(self, bin, 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(LogDir, "supervisor.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("supervisor log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "supervise")
	cmd.Env = hostEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start supervisor: %w", err)
	}
	if err := os.WriteFile(SupervisorPID, []byte(fmt.Sprintf("%d\n", cmd.Process.Pid)), 0o644); err != nil {
		return fmt.Errorf("supervisor pid file: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(20 * time.Second)
	for {
		if _, err := Call(SupervisorSock, "list", "", 5*time.Second); err == nil {
			Logf("node supervisor (stand-in for systemd) runs containerd and the kubelet; pid %d, log %s", cmd.Process.Pid, logf.Name())
			return nil
		}
		select {
		case err := <-exited:
			tailFile(logf.Name(), 20)
			return fmt.Errorf("node supervisor exited: %w", err)
		case <-deadline:
			return errors.New("node supervisor did not open its socket in 20s")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// importImages loads the tarball of every image built here into containerd's k8s.io namespace,
// where the CRI finds them (only those: a tarball left by an older build is not imported).
func importImages(ctx context.Context, l Layout) error {
	start := time.Now()
	specs, err := AllImageSpecs(ctx, l)
	if err != nil {
		return err
	}
	for _, s := range specs {
		f := filepath.Join(l.ImageOut(), TarballName(s.Ref))
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("image %s: %w: run `realnode build` first", s.Ref, err)
		}
		if err := run(ctx, io.Discard, filepath.Join(RuntimeBinDir, "ctr"), "--address", ContainerdSock,
			"-n", "k8s.io", "images", "import", "--local", f); err != nil {
			return fmt.Errorf("import %s: %w", filepath.Base(f), err)
		}
	}
	Logf("imported %d images in %s", len(specs), time.Since(start).Round(time.Second))
	return nil
}

// run runs a command with its output to w, and in the error when it fails.
func run(ctx context.Context, w io.Writer, name string, args ...string) error {
	return runIn(ctx, w, nil, name, args...)
}

// runIn is run with stdin.
func runIn(ctx context.Context, w io.Writer, stdin io.Reader, name string, args ...string) error {
	var buf strings.Builder
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = stdin
	cmd.Env = hostEnv()
	cmd.Stdout = io.MultiWriter(w, &buf)
	cmd.Stderr = io.MultiWriter(w, &buf)
	if err := cmd.Run(); err != nil {
		out := buf.String()
		if len(out) > 2000 {
			out = "..." + out[len(out)-2000:]
		}
		return fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(out))
	}
	return nil
}

// HostPath is the PATH of the node's own programs (systemd's default). The checkout's bin/, first in
// make's PATH, must not leak in: kubeadm would check the v1.37.2 kubelet there, not the node's.
const HostPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func hostEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	return append(env, "PATH="+HostPath)
}

// kubectl runs the host's kubectl against the node.
func kubectl(ctx context.Context, w io.Writer, args ...string) error {
	return run(ctx, w, "/usr/bin/kubectl", append([]string{"--kubeconfig", KubeconfigPath}, args...)...)
}

// waitFor retries check until it succeeds or the timeout passes.
func waitFor(ctx context.Context, what string, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not reached in %s: %w", what, timeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

func tailFile(path string, n int) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	fmt.Fprintf(os.Stderr, "--- last lines of %s\n%s\n", path, strings.Join(lines, "\n"))
}
