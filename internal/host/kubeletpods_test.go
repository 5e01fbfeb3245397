package host_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"

	"github.com/nodeops/nodeops/internal/host"
)

// The kubelet's Pods API is read on the real node (test/realnode: the rotation's restarts follow
// it); these are its error paths, which decide between asking again and reading the mirror pod.

func TestKubeletPodsWithoutTheSocketSaysSo(t *testing.T) {
	k := &host.KubeletPods{Root: t.TempDir()}
	if k.Available() {
		t.Fatal("Available() with no socket under the root")
	}
	if _, err := k.Pod(context.Background(), "kube-system", "etcd-vm"); !errors.Is(err, host.ErrNoKubeletPodsAPI) {
		t.Fatalf("Pod() = %v, want ErrNoKubeletPodsAPI", err)
	}
	var none *host.KubeletPods
	if none.Available() {
		t.Fatal("a nil KubeletPods (a local node's) is Available")
	}
}

// initializingKubelet answers as a kubelet that has not yet read all its pod sources.
type initializingKubelet struct {
	podsv1alpha1.UnimplementedPodsServer
}

func (initializingKubelet) ListPods(context.Context, *podsv1alpha1.ListPodsRequest) (*podsv1alpha1.ListPodsResponse, error) {
	return nil, status.Error(codes.FailedPrecondition, "Kubelet is initializing")
}

func TestKubeletPodsWhileTheKubeletStartsAsksAgain(t *testing.T) {
	root := t.TempDir()
	socket := filepath.Join(root, host.KubeletPodsSocket)
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		t.Fatal(err)
	}
	addr, done, err := host.ShortUnixPath(socket)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", addr)
	done()
	if err != nil {
		t.Fatal(err)
	}
	// As a kubelet that was killed: its socket stays when it stops serving.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	srv := grpc.NewServer()
	podsv1alpha1.RegisterPodsServer(srv, initializingKubelet{})
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()

	k := &host.KubeletPods{Root: root}
	if !k.Available() {
		t.Fatal("not Available() with the socket there")
	}
	if _, err := k.Pod(context.Background(), "kube-system", "etcd-vm"); !errors.Is(err, host.ErrKubeletInitializing) {
		t.Fatalf("Pod() = %v, want ErrKubeletInitializing", err)
	}

	// A socket a killed kubelet left behind and nobody serves: an error to report and ask again, not a
	// kubelet without the API (whose mirror pods would then be read).
	srv.Stop()
	if _, err := k.Pod(context.Background(), "kube-system", "etcd-vm"); err == nil || errors.Is(err, host.ErrNoKubeletPodsAPI) || errors.Is(err, host.ErrKubeletInitializing) {
		t.Fatalf("Pod() on a socket nobody serves = %v, want a connection error", err)
	}
}

// fakeKubelet makes root a host whose /proc shows a kubelet process started at started, and, when
// socketAt is not zero, the kubelet's Pods API socket made at socketAt.
func fakeKubelet(t *testing.T, started, socketAt time.Time) string {
	t.Helper()
	root := t.TempDir()
	proc := filepath.Join(root, "proc")
	boot := started.Add(-time.Hour).Truncate(time.Second)
	ticks := started.Sub(boot) * 100 / time.Second
	fields := make([]string, 20)
	for i := range fields {
		fields[i] = "0"
	}
	fields[19] = strconv.FormatInt(int64(ticks), 10)
	for path, content := range map[string]string{
		"stat":         "cpu  1 2 3\nbtime " + strconv.FormatInt(boot.Unix(), 10) + "\nprocesses 9\n",
		"4321/cmdline": "/usr/bin/kubelet\x00--config=/var/lib/kubelet/config.yaml\x00",
		"4321/stat":    "4321 (kubelet) " + strings.Join(fields, " ") + "\n",
		"77/cmdline":   "/usr/bin/containerd\x00",
		"77/stat":      "77 (containerd) S 1\n",
	} {
		p := filepath.Join(proc, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !socketAt.IsZero() {
		socket := filepath.Join(root, host.KubeletPodsSocket)
		if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(socket, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(socket, socketAt, socketAt); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestKubeletPodsServesOnlyOnceTheRunningKubeletOpenedIt: right after a kubelet restart, a socket
// the earlier kubelet left (or none yet) must not send a wait to the mirror pods, which still show
// the earlier kubelet's statuses of pods the new one may be about to replace (rule 13).
func TestKubeletPodsServesOnlyOnceTheRunningKubeletOpenedIt(t *testing.T) {
	now := time.Now()
	// No kubelet runs: between its restarts, or while it crash-loops after its binary was replaced.
	noKubelet := fakeKubelet(t, now.Add(-time.Minute), now.Add(-30*time.Second))
	if err := os.RemoveAll(filepath.Join(noKubelet, "proc", "4321")); err != nil {
		t.Fatal(err)
	}
	if serves, err := (&host.KubeletPods{Root: noKubelet}).Serves(); err == nil || !strings.Contains(err.Error(), "no kubelet process runs") {
		t.Fatalf("Serves() with no kubelet process = %v, %v; want it not known", serves, err)
	}
	for _, c := range []struct {
		name              string
		started, socketAt time.Time
		serves            bool
		notYet            bool
	}{
		{name: "just started, the earlier kubelet's socket", started: now.Add(-time.Second), socketAt: now.Add(-time.Hour), notYet: true},
		{name: "just started, no socket yet", started: now.Add(-time.Second), notYet: true},
		{name: "just started, its own socket", started: now.Add(-time.Second), socketAt: now.Add(-700 * time.Millisecond), serves: true},
		{name: "running 20 s, no socket yet", started: now.Add(-20 * time.Second), notYet: true},
		{name: "running a minute without a socket: no Pods API", started: now.Add(-time.Minute)},
		{name: "running a minute, a socket older than it: no Pods API", started: now.Add(-time.Minute), socketAt: now.Add(-time.Hour)},
		{name: "running a minute with its socket", started: now.Add(-time.Minute), socketAt: now.Add(-59 * time.Second), serves: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			serves, err := (&host.KubeletPods{Root: fakeKubelet(t, c.started, c.socketAt)}).Serves()
			if c.notYet {
				if err == nil || !strings.Contains(err.Error(), "has not opened its Pods API yet") {
					t.Fatalf("Serves() = %v, %v; want it not known yet", serves, err)
				}
				return
			}
			if err != nil || serves != c.serves {
				t.Fatalf("Serves() = %v, %v; want %v", serves, err, c.serves)
			}
		})
	}
}

// testBinaryInit is about when this test process started (its package variables are set first).
var testBinaryInit = time.Now()

// TestProcessStartFromTheRealProc reads this test process's own start from the machine's /proc: the
// newest process of this test binary's name started no earlier than this one (btime is whole
// seconds, and starting the binary takes a moment), and not in the future.
func TestProcessStartFromTheRealProc(t *testing.T) {
	started, ok := host.NewestProcessStart("/proc", filepath.Base(os.Args[0]))
	if !ok {
		t.Fatalf("no process named %s in /proc", filepath.Base(os.Args[0]))
	}
	if now := time.Now(); started.Before(testBinaryInit.Add(-5*time.Second)) || started.After(now.Add(time.Second)) {
		t.Fatalf("this process started at %s by /proc; its package was initialized at %s, now is %s", started, testBinaryInit, now)
	}
}

// TestKubeletBinaryReplacedSaysWhetherARestartRunsAnotherKubelet: the upgrade replaces the kubelet
// binary before restarting it (the running process then runs the file kept aside, as the kernel's
// /proc/PID/exe names it): only then may the restart name the static pods anew, so only then does
// restartService look for replaced pods. A restart for a configuration change runs the same file.
func TestKubeletBinaryReplacedSaysWhetherARestartRunsAnotherKubelet(t *testing.T) {
	root := fakeKubelet(t, time.Now().Add(-time.Minute), time.Time{})
	bin := filepath.Join(root, "usr/bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exe := filepath.Join(root, "proc/4321/exe")
	runs := func(name string) {
		_ = os.Remove(exe)
		if err := os.Symlink(filepath.Join(bin, name), exe); err != nil {
			t.Fatal(err)
		}
	}
	k := &host.KubeletPods{Root: root}
	write("kubelet", "v1.36.3")
	runs("kubelet")
	if path, replaced, err := k.BinaryReplaced(); err != nil || replaced || path != "/usr/bin/kubelet" {
		t.Errorf("the kubelet runs /usr/bin/kubelet itself: BinaryReplaced() = %q, %v, %v; want /usr/bin/kubelet, false", path, replaced, err)
	}
	// A kubelet installed as a symlink (/usr/bin/kubelet -> /opt/kubernetes/kubelet) runs the link's
	// target: the same file, not a replaced one.
	opt := filepath.Join(root, "opt/kubernetes")
	if err := os.MkdirAll(opt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(bin, "kubelet"), filepath.Join(opt, "kubelet")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/opt/kubernetes/kubelet", filepath.Join(bin, "kubelet")); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(exe)
	if err := os.Symlink(filepath.Join(opt, "kubelet"), exe); err != nil {
		t.Fatal(err)
	}
	if _, replaced, err := k.BinaryReplaced(); err != nil || replaced {
		t.Errorf("the kubelet runs its symlink's target: replaced = %v, %v; want false", replaced, err)
	}
	if err := os.Remove(filepath.Join(bin, "kubelet")); err != nil {
		t.Fatal(err)
	}
	write("kubelet", "v1.36.3")
	runs("kubelet")
	// installBinaries keeps the old binary as kubelet.nodeops-prev and puts the new one in place.
	if err := os.Rename(filepath.Join(bin, "kubelet"), filepath.Join(bin, "kubelet.nodeops-prev")); err != nil {
		t.Fatal(err)
	}
	write("kubelet", "v1.37.2")
	runs("kubelet.nodeops-prev")
	if _, replaced, err := k.BinaryReplaced(); err != nil || !replaced {
		t.Errorf("the kubelet's binary was replaced: replaced = %v, %v; want true", replaced, err)
	}
	if err := os.Remove(filepath.Join(bin, "kubelet")); err != nil {
		t.Fatal(err)
	}
	if _, replaced, err := k.BinaryReplaced(); err != nil || !replaced {
		t.Errorf("the kubelet's binary was removed: replaced = %v, %v; want true", replaced, err)
	}
	if _, _, err := (&host.KubeletPods{Root: t.TempDir()}).BinaryReplaced(); err == nil {
		t.Error("with no kubelet process BinaryReplaced did not fail")
	}
}
