package host_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodeops/nodeops/internal/host"
)

const fakeContainerID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// procOf is a /proc in which this test process is the container fakeContainerID: its cgroup names
// the container, and its network tables, descriptors and namespaces are the process's own (the
// real ones, linked). With sockets given, the container's descriptors are those sockets alone (by
// inode), as if another process held every other.
func procOf(t *testing.T, sockets ...uint64) string {
	t.Helper()
	proc := t.TempDir()
	self := "/proc/" + strconv.Itoa(os.Getpid())
	dir := filepath.Join(proc, strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cgroup := "12:memory:/kubepods/burstable/pod1234/" + fakeContainerID + "\n0::/\n"
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"net", "ns"} {
		if err := os.Symlink(filepath.Join(self, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if sockets == nil {
		if err := os.Symlink(filepath.Join(self, "fd"), filepath.Join(dir, "fd")); err != nil {
			t.Fatal(err)
		}
	} else {
		if err := os.Mkdir(filepath.Join(dir, "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		for i, ino := range sockets {
			if err := os.Symlink(fmt.Sprintf("socket:[%d]", ino), filepath.Join(dir, "fd", strconv.Itoa(3+i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Another process, of another container.
	other := filepath.Join(proc, "1")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "cgroup"), []byte("0::/system.slice/containerd.service\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return proc
}

// probedPod is a static pod like kubeadm's: a running container with a startup and a readiness
// probe on a named port.
func probedPod(port int, path string, scheme corev1.URIScheme) *corev1.Pod {
	probe := func(p string) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Host: "127.0.0.1", Path: p, Port: intstr.FromString("probe-port"), Scheme: scheme}}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "etcd-vm"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:           "etcd",
			Ports:          []corev1.ContainerPort{{Name: "probe-port", ContainerPort: int32(port)}}, //nolint:gosec // a test port
			StartupProbe:   probe(path),
			ReadinessProbe: probe(path),
		}}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{
			Name: "etcd", ContainerID: "containerd://" + fakeContainerID,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
		}}},
	}
}

func serve(t *testing.T, tlsToo bool, h http.HandlerFunc) int {
	t.Helper()
	var srv *httptest.Server
	if tlsToo {
		srv = httptest.NewTLSServer(h)
	} else {
		srv = httptest.NewServer(h)
	}
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

func TestServingNowRunsTheProbesOfTheContainersOwnProcess(t *testing.T) {
	ready := false
	port := serve(t, true, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" || !ready {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprint(w, "ok")
	})
	p := &host.Prober{Proc: procOf(t)}
	pod := probedPod(port, "/readyz", corev1.URISchemeHTTPS)
	if err := p.ServingNow(context.Background(), pod, "etcd"); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("ServingNow while the component answers 503 = %v, want the 503 named", err)
	}
	ready = true
	if err := p.ServingNow(context.Background(), pod, "etcd"); err != nil {
		t.Fatalf("ServingNow once /readyz answers ok = %v, want nil", err)
	}

	// Not running yet, not listening yet, no HTTP probe to run.
	stopped := pod.DeepCopy()
	stopped.Status.ContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
	if err := p.ServingNow(context.Background(), stopped, "etcd"); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("ServingNow of a waiting container = %v, want not running", err)
	}
	free := pod.DeepCopy()
	free.Spec.Containers[0].Ports[0].ContainerPort = int32(unusedPort(t)) //nolint:gosec // a test port
	if err := p.ServingNow(context.Background(), free, "etcd"); err == nil || !strings.Contains(err.Error(), "does not listen") {
		t.Errorf("ServingNow on a port nobody listens on = %v, want does not listen", err)
	}
	named := pod.DeepCopy()
	named.Spec.Containers[0].StartupProbe.HTTPGet.Host = "localhost"
	if err := p.ServingNow(context.Background(), named, "etcd"); !errors.Is(err, host.ErrNoHTTPProbe) {
		t.Errorf("ServingNow with a probe naming a host = %v, want ErrNoHTTPProbe (only addresses are dialed)", err)
	}
	exec := pod.DeepCopy()
	exec.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
	if err := p.ServingNow(context.Background(), exec, "etcd"); !errors.Is(err, host.ErrNoHTTPProbe) {
		t.Errorf("ServingNow with an exec probe = %v, want ErrNoHTTPProbe", err)
	}
}

// TestServingNowRefusesAnAnswerFromAnEarlierRun: when another process (the earlier run of the
// component, not yet stopped) also listens where the probe connects, beside the container on the
// same port (SO_REUSEPORT, where the kernel spreads connections) or alone, its answer does not
// count for the new container.
func TestServingNowRefusesAnAnswerFromAnEarlierRun(t *testing.T) {
	reuse := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	newRun, err := reuse.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := newRun.Addr().(*net.TCPAddr).Port
	earlierRun, err := reuse.Listen(context.Background(), "tcp", newRun.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []net.Listener{newRun, earlierRun} {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprint(w, "ok") }), ReadHeaderTimeout: time.Second}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
	pod := probedPod(port, "/readyz", corev1.URISchemeHTTP)

	// The container holds the new run's socket only: the earlier run listens beside it.
	p := &host.Prober{Proc: procOf(t, inode(t, newRun))}
	if err := p.ServingNow(context.Background(), pod, "etcd"); err == nil || !strings.Contains(err.Error(), "another process listens") {
		t.Fatalf("ServingNow with an earlier run listening beside the container = %v, want it refused", err)
	}
	// The container holds no socket: only the earlier run listens.
	p = &host.Prober{Proc: procOf(t, inode(t, nil))}
	if err := p.ServingNow(context.Background(), pod, "etcd"); err == nil || !strings.Contains(err.Error(), "another process listens") {
		t.Fatalf("ServingNow with only an earlier run listening = %v, want it refused", err)
	}
	// Both sockets the container's own: its answer counts.
	p = &host.Prober{Proc: procOf(t, inode(t, newRun), inode(t, earlierRun))}
	if err := p.ServingNow(context.Background(), pod, "etcd"); err != nil {
		t.Fatalf("ServingNow with every listener the container's = %v, want nil", err)
	}
}

// inode is a listener's socket inode (0 for none: a descriptor of no listening socket).
func inode(t *testing.T, l net.Listener) uint64 {
	t.Helper()
	if l == nil {
		return 0
	}
	// Through the descriptor in place: File() would dup it and leave the listener blocking.
	raw, err := l.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = syscall.Fstat(int(fd), &st) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	return st.Ino
}

func unusedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	return port
}
