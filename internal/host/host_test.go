package host_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
)

func TestChrootRunnerRunsInsideRootWithOnlyScriptEnv(t *testing.T) {
	t.Setenv("KUBECONFIG", "/secret/kubeconfig")
	root := hosttest.NewRoot(t, map[string]string{"/etc/marker": "inside\n"})
	r := &host.ChrootRunner{Root: root}
	var out strings.Builder
	env := host.ScriptEnv("node-a", "op-1", true, []v1alpha1.EnvVar{{Name: "FOO", Value: "bar"}, {Name: "NODEOPS_NODE_NAME", Value: "spoof"}})
	err := r.Run(context.Background(), host.Cmd{
		Path: "/bin/sh", Args: []string{"-c", "cat /etc/marker; env | sort; echo hi > /tmp-out"},
		Env: env, Output: &out,
	})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{"inside", "NODEOPS_NODE_NAME=node-a", "NODEOPS_OPERATION=op-1", "NODEOPS_DRY_RUN=true", "FOO=bar", "PATH=" + host.DefaultPath} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, bad := range []string{"KUBECONFIG", "spoof"} {
		if strings.Contains(got, bad) {
			t.Errorf("output has %q:\n%s", bad, got)
		}
	}
	if hosttest.ReadFile(t, root, "/tmp-out") != "hi\n" {
		t.Errorf("script did not write inside the root")
	}
}

func TestChrootRunnerExitCode(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	err := (&host.ChrootRunner{Root: root}).Run(context.Background(), host.Cmd{Path: "/bin/sh", Args: []string{"-c", "exit 7"}})
	if got := host.ExitCode(err); got != 7 {
		t.Fatalf("exit code = %d (%v), want 7", got, err)
	}
}

func TestFSPathStaysInsideRoot(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	if err := os.Symlink("/etc", filepath.Join(root, "abs-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../..", filepath.Join(root, "etc/up-link")); err != nil {
		t.Fatal(err)
	}
	fs := &host.FS{Root: root}
	tests := []struct {
		in, want string
		err      bool
	}{
		{in: "/etc/os-release", want: "/etc/os-release"},
		{in: "/abs-link/os-release", want: "/etc/os-release"},
		{in: "/etc/up-link/etc/passwd", want: "/etc/passwd"},
		{in: "/etc/../../etc/passwd", err: true},
		{in: "relative/path", err: true},
	}
	for _, tt := range tests {
		got, err := fs.Path(tt.in)
		if tt.err {
			if err == nil {
				t.Errorf("Path(%q) = %q, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got != filepath.Join(root, tt.want) {
			t.Errorf("Path(%q) = %q, %v; want %q", tt.in, got, err, filepath.Join(root, tt.want))
		}
	}
}

func TestWriteFileAtomicAndKeepPrevious(t *testing.T) {
	root := hosttest.NewRoot(t, map[string]string{"/usr/bin/tool": "old"})
	fs := &host.FS{Root: root}
	if err := fs.KeepPrevious("/usr/bin/tool", "/usr/bin/tool.nodeops-prev"); err != nil {
		t.Fatal(err)
	}
	if err := fs.WriteFileAtomic("/usr/bin/tool", []byte("new"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := hosttest.ReadFile(t, root, "/usr/bin/tool"); got != "new" {
		t.Errorf("tool = %q", got)
	}
	if got := hosttest.ReadFile(t, root, "/usr/bin/tool.nodeops-prev"); got != "old" {
		t.Errorf("prev = %q", got)
	}
	fi, err := os.Stat(filepath.Join(root, "usr/bin/tool"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("mode = %v, %v", fi.Mode(), err)
	}
	entries, _ := os.ReadDir(filepath.Join(root, "usr/bin"))
	for _, e := range entries {
		if strings.Contains(e.Name(), "nodeops-tmp") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
	if err := fs.WriteFileAtomic("/new/dir/file", []byte("x"), 0o600); err != nil {
		t.Fatalf("write into a new directory: %v", err)
	}
}

func TestDetectOS(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  host.OSInfo
	}{
		{
			name:  "debian with systemd and apt",
			files: map[string]string{"/usr/lib/systemd/systemd": "", "/usr/bin/apt-get": ""},
			want:  host.OSInfo{ID: "debian", VersionID: "12", Family: "debian", InitSystem: "systemd", PackageManager: "apt"},
		},
		{
			name:  "rocky via ID_LIKE with dnf",
			files: map[string]string{"/etc/os-release": "ID=\"rocky\"\nID_LIKE=\"rhel centos fedora\"\nVERSION_ID=\"9.3\"\n", "/usr/bin/dnf": "", "/lib/systemd/systemd": ""},
			want:  host.OSInfo{ID: "rocky", VersionID: "9.3", Family: "rhel", InitSystem: "systemd", PackageManager: "dnf"},
		},
		{
			name:  "alpine with openrc",
			files: map[string]string{"/etc/os-release": "ID=alpine\nVERSION_ID=3.20.0\n", "/sbin/openrc": "", "/sbin/apk": ""},
			want:  host.OSInfo{ID: "alpine", VersionID: "3.20.0", Family: "alpine", InitSystem: "openrc", PackageManager: "apk"},
		},
		{
			name:  "ubuntu via ID_LIKE",
			files: map[string]string{"/etc/os-release": "ID=ubuntu\nID_LIKE=debian\nVERSION_ID=\"24.04\"\n"},
			want:  host.OSInfo{ID: "ubuntu", VersionID: "24.04", Family: "debian", InitSystem: "unknown", PackageManager: "unknown"},
		},
		{
			name:  "unknown",
			files: map[string]string{"/etc/os-release": "ID=plan9\n"},
			want:  host.OSInfo{ID: "plan9", Family: "unknown", InitSystem: "unknown", PackageManager: "unknown"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := hosttest.NewRoot(t, tt.files)
			if got := host.DetectOS(&host.FS{Root: root}); got != tt.want {
				t.Errorf("DetectOS = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestLocalServicesRecordsRestarts(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	h, err := host.Open(host.ServiceManagerLocal, root)
	if err != nil {
		t.Fatal(err)
	}
	sm := h.Services
	for _, s := range []string{"kubelet", "containerd"} {
		if err := sm.Restart(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSpace(hosttest.ReadFile(t, root, host.LocalServiceLog)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "restart kubelet ") || !strings.HasPrefix(lines[1], "restart containerd ") {
		t.Fatalf("service table = %q", lines)
	}
}

func TestSystemctlRunsInsideRoot(t *testing.T) {
	// A stand-in systemctl inside the temporary root records its arguments, showing the call shape.
	root := hosttest.NewRoot(t, nil)
	hosttest.WriteFile(t, root, "/bin/systemctl", "#!/bin/sh\necho \"$@\" >> /systemctl.log\n", 0o755)
	sm, err := host.NewServiceManager(host.ServiceManagerAuto, root, &host.ChrootRunner{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if sm.Name() != "systemctl" {
		t.Fatalf("auto without a systemd socket chose %s", sm.Name())
	}
	if err := sm.Restart(context.Background(), "containerd"); err != nil {
		t.Fatal(err)
	}
	if got := hosttest.ReadFile(t, root, "/systemctl.log"); got != "restart -- containerd.service\n" {
		t.Fatalf("systemctl called with %q", got)
	}
	// A name that looks like an option stays a unit name (admission refuses it; the agent too guards).
	if err := sm.Restart(context.Background(), "--force"); err != nil {
		t.Fatal(err)
	}
	if got := hosttest.ReadFile(t, root, "/systemctl.log"); !strings.HasSuffix(got, "restart -- --force.service\n") {
		t.Fatalf("systemctl called with %q", got)
	}
}

func TestSystemdDBusFallsBackWithoutSocket(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	hosttest.WriteFile(t, root, "/bin/systemctl", "#!/bin/sh\necho \"$@\" >> /systemctl.log\n", 0o755)
	sm, err := host.NewServiceManager(host.ServiceManagerSystemd, root, &host.ChrootRunner{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if err := sm.Restart(context.Background(), "kubelet"); err != nil {
		t.Fatal(err)
	}
	if got := hosttest.ReadFile(t, root, "/systemctl.log"); got != "restart -- kubelet.service\n" {
		t.Fatalf("systemctl called with %q", got)
	}
}

func TestKubeadmRunsWithRootfs(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	// A script standing in for kubeadm, run directly (not chrooted): it records its arguments.
	log := filepath.Join(t.TempDir(), "args")
	hosttest.WriteFile(t, root, "/usr/bin/kubeadm", "#!/bin/sh\necho \"$@\" > "+log+"\n", 0o755)
	var out strings.Builder
	if err := (&host.KubeadmRunner{Root: root}).Kubeadm(context.Background(), &out, "certs", "renew", "all"); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	b, _ := os.ReadFile(log)
	if got, want := strings.TrimSpace(string(b)), "--rootfs "+root+" certs renew all"; got != want {
		t.Fatalf("kubeadm args = %q, want %q", got, want)
	}
}

// every command has a timeout (rule 12): host programs run in a process group of their own, so a SIGTERM
// to the agent's group (nodeops-local stops its children so) leaves them to finish in the grace period.
func TestSafetyRule12_HostProgramsRunInTheirOwnProcessGroup(t *testing.T) {
	root := hosttest.NewRoot(t, nil)
	pgid := func(out string) string {
		fields := strings.Fields(out)
		if len(fields) < 5 {
			t.Fatalf("no /proc stat line in %q", out)
		}
		return fields[4]
	}
	agentGroup := strconv.Itoa(syscall.Getpgrp())
	// Scripts (ChrootRunner) have always had their own group; kubeadm runs outside the chroot.
	hosttest.WriteFile(t, root, "/usr/bin/kubeadm", "#!/bin/sh\ncat /proc/$$/stat\n", 0o755)
	var kubeadm strings.Builder
	if err := (&host.KubeadmRunner{Root: root}).Kubeadm(context.Background(), &kubeadm, "version"); err != nil {
		t.Fatalf("%v: %s", err, kubeadm.String())
	}
	lines := strings.Split(strings.TrimSpace(kubeadm.String()), "\n")
	if g := pgid(lines[len(lines)-1]); g == agentGroup {
		t.Errorf("kubeadm runs in the agent's process group %s", g)
	}
}
