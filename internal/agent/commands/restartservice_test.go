package commands

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
	"github.com/nodeops/nodeops/internal/testutil"
)

// TestOnlyANewMinorKubeletCountsAsRenamingStaticPods: the old runs of the static pods are stopped
// right after a kubelet restart only when the kubelet moves to another minor (or major) version,
// which names every static pod anew; a patch release or the same version keeps the UIDs, and a
// version that does not parse is never taken for a new one.
func TestOnlyANewMinorKubeletCountsAsRenamingStaticPods(t *testing.T) {
	for _, c := range []struct {
		from, to string
		want     bool
	}{
		{"v1.36.3", "v1.37.2", true},
		{"v1.37.2", "v2.0.0", true},
		{"v1.37.1", "v1.37.2", false},
		{"v1.37.2", "v1.37.2", false},
		{"", "v1.37.2", false},
		{"v1.36.3", "unknown", false},
	} {
		if got := newMinor(c.from, c.to); got != c.want {
			t.Errorf("newMinor(%q, %q) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
}

// versionRunner answers `kubelet --version` as a kubelet binary of version would, once after is
// closed where it is set; any other program fails.
type versionRunner struct {
	version string
	after   <-chan struct{}
}

func (v versionRunner) Run(ctx context.Context, c host.Cmd) error {
	if filepath.Base(c.Path) != "kubelet" || len(c.Args) != 1 || c.Args[0] != "--version" {
		return fmt.Errorf("unexpected program %s %v", c.Path, c.Args)
	}
	if v.after != nil {
		select {
		case <-v.after:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	_, err := fmt.Fprintf(c.Output, "Kubernetes %s\n", v.version)
	return err
}

// kubeletStarting records restarts in the local service table, and then does what the kubelet it
// started does, if anything.
type kubeletStarting struct {
	host.LocalServices
	started func()
}

func (k *kubeletStarting) Restart(ctx context.Context, name string) error {
	if err := k.LocalServices.Restart(ctx, name); err != nil {
		return err
	}
	if k.started != nil {
		k.started()
	}
	return nil
}

// TestKubeletRestartOntoANewMinorStopsTheStaticPodsOldRuns: restartService of the kubelet on a
// control plane stops, right after the restart, the processes of the static pods' runs under the UIDs
// the old kubelet gave them (read from their mirror pods), when the kubelet's binary was replaced
// by one of another minor version and the kubelet it started serves; a new kubelet that does not
// serve, a patch release, or the same binary (a restart for a configuration change) stops nothing.
// The new binary's `--version` is read beside the restart, never before it.
// No other process is touched. The processes are real; the host's /proc is a directory whose files
// say which pod each is in and which binary the kubelet runs.
func TestKubeletRestartOntoANewMinorStopsTheStaticPodsOldRuns(t *testing.T) {
	tenv, err := testutil.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tenv.Stop() })
	ctx := context.Background()
	c := tenv.Client
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp1"}}
	if err := c.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	node.Status.NodeInfo.KubeletVersion = "v1.36.3"
	if err := c.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	oldUIDs := map[string]string{"etcd": "5e0f0a0b0c0d0e0f1011121314151617", "kube-apiserver": "a90f0a0b0c0d0e0f1011121314151617"}
	for comp, uid := range oldUIDs {
		mirror := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: comp + "-cp1",
			Annotations: map[string]string{"kubernetes.io/config.hash": uid, "kubernetes.io/config.mirror": uid}},
			Spec: corev1.PodSpec{NodeName: "cp1", Containers: []corev1.Container{{Name: comp, Image: "registry.k8s.io/" + comp + ":v1.36.3"}}}}
		if err := c.Create(ctx, mirror); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		name     string
		version  string // what the binary on disk says
		replaced bool   // the running kubelet's binary is no longer /usr/bin/kubelet
		serves   bool   // the kubelet running after the restart serves its Pods API
		stops    bool
	}{
		{name: "a new minor version", version: "v1.37.2", replaced: true, serves: true, stops: true},
		// A new kubelet that does not come up would start nothing again: the old runs, the control
		// plane kubeadm upgraded, keep serving.
		{name: "a new minor version whose kubelet does not serve", version: "v1.37.2", replaced: true},
		{name: "a patch release", version: "v1.36.4", replaced: true, serves: true},
		{name: "the same binary", version: "v1.36.3", serves: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			files := &host.FS{Root: root}
			write := func(p, content string) {
				t.Helper()
				if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write(host.Manifest(host.ManifestsDir, "etcd"), "kind: Pod\n")
			write(host.Manifest(host.ManifestsDir, "kube-apiserver"), "kind: Pod\n")
			write("/usr/bin/kubelet", tc.version)
			write("/usr/bin/kubelet.nodeops-prev", "v1.36.3")
			fields := make([]string, 20)
			for i := range fields {
				fields[i] = "0"
			}
			write("/proc/stat", "btime "+strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10)+"\n")
			write("/proc/4321/cmdline", "/usr/bin/kubelet\x00--config=/var/lib/kubelet/config.yaml\x00")
			write("/proc/4321/stat", "4321 (kubelet) "+strings.Join(fields, " ")+"\n")
			exe := "/usr/bin/kubelet"
			if tc.replaced {
				exe = "/usr/bin/kubelet.nodeops-prev"
			}
			if err := os.Symlink(filepath.Join(root, exe), filepath.Join(root, "proc/4321/exe")); err != nil {
				t.Fatal(err)
			}

			start := func(podUID string) *exec.Cmd {
				t.Helper()
				cmd := exec.Command("sleep", "300")
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
				write("/proc/"+strconv.Itoa(cmd.Process.Pid)+"/cgroup", "12:pids:/kubepods/burstable/pod"+podUID+"/0a1b2c\n")
				return cmd
			}
			oldEtcd, oldAPIServer := start(oldUIDs["etcd"]), start(oldUIDs["kube-apiserver"])
			other := start("f00f0a0b0c0d0e0f1011121314151617") // another pod of the node

			var out bytes.Buffer
			services := &kubeletStarting{LocalServices: host.LocalServices{Files: files}}
			restarted := make(chan struct{})
			services.started = func() {
				close(restarted)
				if tc.serves {
					// The kubelet the restart starts opens its Pods API socket (after its process started).
					write(host.KubeletPodsSocket, "")
				}
			}
			// The new binary's version answers only after the restart: the restart does not wait for it
			// (it would wait out the read's 10 s bound and then stop nothing).
			h := &host.Host{Root: root, Exec: versionRunner{version: tc.version, after: restarted}, Files: files, Services: services,
				KubeletPods: &host.KubeletPods{Root: root}}
			env := &Env{NodeName: "cp1", Host: h, Client: c, Out: &out, Poll: 10 * time.Millisecond}
			res, err := runRestartService(ctx, env, &v1alpha1.RestartServiceCommand{Name: "kubelet"})
			if err != nil {
				t.Fatalf("restartService: %v (output %s)", err, out.String())
			}
			table := hosttest.ReadFile(t, root, host.LocalServiceLog)
			if !strings.Contains(table, "restart kubelet") {
				t.Errorf("the kubelet was not restarted: service table %q", table)
			}
			alive := func(cmd *exec.Cmd) bool {
				// A process that ended is a zombie until the test reaps it: state Z.
				b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/stat")
				if err != nil {
					return false
				}
				i := bytes.LastIndexByte(b, ')')
				return i > 0 && !bytes.HasPrefix(bytes.TrimSpace(b[i+1:]), []byte("Z"))
			}
			if tc.stops {
				want := "the kubelet went from v1.36.3 to v1.37.2, a new minor version, which starts every static pod again under a new UID: stopped the old runs of etcd, kube-apiserver at once (2 processes; the API server's with SIGKILL, the others' with SIGTERM)"
				if !strings.Contains(res.Message, want) {
					t.Errorf("message %q, want it to contain %q", res.Message, want)
				}
				if alive(oldEtcd) || alive(oldAPIServer) {
					t.Error("an old run of a static pod still runs after the kubelet of a new minor version started")
				}
				// The old API server is killed outright: told to stop, it would hold the new kubelet's
				// first requests while it drains against a stopping etcd.
				for _, c := range []struct {
					what string
					cmd  *exec.Cmd
					sig  syscall.Signal
				}{{"etcd's old run", oldEtcd, syscall.SIGTERM}, {"the API server's old run", oldAPIServer, syscall.SIGKILL}} {
					st, err := c.cmd.Process.Wait()
					if err != nil {
						t.Fatalf("%s: %v", c.what, err)
					}
					if ws := st.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != c.sig {
						t.Errorf("%s ended with %v, want %v", c.what, st, c.sig)
					}
				}
			} else {
				want := "kubelet restarted with local service table"
				if tc.replaced && !tc.serves {
					want += "; the kubelet went from v1.36.3 to v1.37.2, a new minor version, but the kubelet serves no Pods API (" +
						host.KubeletPodsSocket + " is not there): the static pods' old runs are left to its housekeeping"
				}
				if res.Message != want {
					t.Errorf("message %q, want %q", res.Message, want)
				}
				if !alive(oldEtcd) || !alive(oldAPIServer) {
					t.Errorf("a static pod's old run was stopped with %s", tc.name)
				}
			}
			if !alive(other) {
				t.Error("a process of another pod was stopped")
			}
		})
	}
}
