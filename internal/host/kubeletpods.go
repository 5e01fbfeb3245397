package host

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"
)

// KubeletPodsSocket is the kubelet's Pods API (beta and on by default from v1.37, feature gate
// PodsAPI): the pods the kubelet runs, with the status the kubelet itself computes, answered on the
// node without the API server.
const KubeletPodsSocket = "/var/lib/kubelet/pods-api/pods-api.sock"

// kubeletPodsMaxAnswer bounds the size of the kubelet's list of pods.
const kubeletPodsMaxAnswer = 256 << 20

// kubeletPodsCallTimeout bounds one call: the socket is local, an answer takes milliseconds.
const kubeletPodsCallTimeout = 5 * time.Second

// ErrNoKubeletPodsAPI: the node's kubelet serves no Pods API (older than v1.37, or PodsAPI off).
var ErrNoKubeletPodsAPI = errors.New("the kubelet serves no Pods API (" + KubeletPodsSocket + " is not there)")

// ErrKubeletInitializing: the kubelet started and has not yet read all its pod sources (its static
// pod manifests and the API server's pods), so it cannot yet say which pods it runs.
var ErrKubeletInitializing = errors.New("the kubelet is starting and has not yet read its pods")

// KubeletPods reads pods from the kubelet of the node under Root through its Pods API.
type KubeletPods struct {
	Root string
}

// kubeletStartGrace: a kubelet with a Pods API opens it well within a second of its start (0.3 s
// on the real node); one that has run this long without it has none. By then a kubelet that
// replaces its static pods (new pod UIDs after a version change) did so seconds ago, and their
// mirror pods no longer pass for the old kubelet's running pods.
const kubeletStartGrace = 30 * time.Second

// Available says whether the kubelet serves its Pods API (the socket is there).
func (k *KubeletPods) Available() bool {
	return k != nil && (&FS{Root: k.Root}).Exists(KubeletPodsSocket)
}

// Serves says whether the running kubelet serves its Pods API, so that its answers, not a mirror
// pod's, say what it runs. It fails, and a wait asks again, while that is not known: no kubelet
// process runs (it is starting again, or crash-looping), or the kubelet started less than
// kubeletStartGrace ago and has not opened its own socket (one made after its start; the socket of
// a kubelet before it stays behind). Meanwhile a mirror pod may still show the old kubelet's last
// statuses of pods the new one is about to replace.
func (k *KubeletPods) Serves() (bool, error) {
	if k == nil {
		return false, nil
	}
	started, found := newestProcessStart(filepath.Join(k.Root, "proc"), "kubelet")
	if !found {
		return false, errors.New("no kubelet process runs on the node (starting again?)")
	}
	sock, err := (&FS{Root: k.Root}).Stat(KubeletPodsSocket)
	if err == nil && !sock.ModTime().Before(started) {
		return true, nil
	}
	if time.Since(started) < kubeletStartGrace {
		return false, fmt.Errorf("the kubelet started at %s has not opened its Pods API yet", started.UTC().Format(time.TimeOnly))
	}
	return false, nil
}

// Pod is the kubelet's pod namespace/name, with the status the kubelet computed for it; nil when
// the kubelet runs no such pod. It fails with ErrNoKubeletPodsAPI or ErrKubeletInitializing when
// the kubelet cannot answer.
func (k *KubeletPods) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	pods, err := k.Pods(ctx)
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if pods[i].Namespace == namespace && pods[i].Name == name {
			return &pods[i], nil
		}
	}
	return nil, nil
}

// Pods are every pod the kubelet runs, with the statuses it computed, in one answer. It fails with
// ErrNoKubeletPodsAPI or ErrKubeletInitializing when the kubelet cannot answer.
func (k *KubeletPods) Pods(ctx context.Context) ([]corev1.Pod, error) {
	if !k.Available() {
		return nil, ErrNoKubeletPodsAPI
	}
	ctx, cancel := context.WithTimeout(ctx, kubeletPodsCallTimeout)
	defer cancel()
	addr, done, err := ShortUnixPath(filepath.Join(k.Root, KubeletPodsSocket))
	if err != nil {
		return nil, fmt.Errorf("kubelet Pods API: %w", err)
	}
	defer done()
	conn, err := grpc.NewClient("passthrough:///kubelet-pods",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Every pod of the node in one answer, managedFields included: more than gRPC's 4 MiB default
		// on a busy node.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(kubeletPodsMaxAnswer)),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		return nil, fmt.Errorf("kubelet Pods API: %w", err)
	}
	defer func() { _ = conn.Close() }()
	resp, err := podsv1alpha1.NewPodsClient(conn).ListPods(ctx, &podsv1alpha1.ListPodsRequest{})
	if err != nil {
		if status.Code(err) == codes.FailedPrecondition {
			return nil, ErrKubeletInitializing
		}
		return nil, fmt.Errorf("kubelet Pods API %s: %w", KubeletPodsSocket, err)
	}
	pods := make([]corev1.Pod, len(resp.GetPods()))
	for i, raw := range resp.GetPods() {
		if err := pods[i].Unmarshal(raw); err != nil {
			return nil, fmt.Errorf("kubelet Pods API: a pod it sent does not decode: %w", err)
		}
	}
	return pods, nil
}

// ServingNow runs, for each container of the kubelet's pod, its HTTP startup and readiness probes
// now (Prober.ServingNow), reading the host's processes under Root/proc. It fails with
// ErrNoHTTPProbe when a container has none to run.
func (k *KubeletPods) ServingNow(ctx context.Context, pod *corev1.Pod) error {
	p := &Prober{Proc: filepath.Join(k.Root, "proc")}
	for _, c := range pod.Spec.Containers {
		if err := p.ServingNow(ctx, pod, c.Name); err != nil {
			return err
		}
	}
	return nil
}

// clockTicks is USER_HZ, the unit of a process's start time in /proc/PID/stat: 100 on every
// architecture Linux runs Kubernetes on.
const clockTicks = 100

// newestProcessStart is when the most recently started process whose program is named program
// (argv[0]'s base name) started, read from proc (a /proc).
func newestProcessStart(proc, program string) (time.Time, bool) {
	_, _, start, ok := newestProcess(proc, program)
	return start, ok
}

// newestProcess is the most recently started process whose program is named program (argv[0]'s
// base name), read from proc (a /proc): its PID, argv[0] and start.
func newestProcess(proc, program string) (pid int, argv0 string, start time.Time, found bool) {
	boot, ok := bootTime(proc)
	if !ok {
		return 0, "", time.Time{}, false
	}
	entries, err := os.ReadDir(proc)
	if err != nil {
		return 0, "", time.Time{}, false
	}
	var newest time.Time
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join(proc, e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		arg0, _, _ := strings.Cut(string(cmdline), "\x00")
		if filepath.Base(arg0) != program {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(proc, e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The fields after the command's name, which is in parentheses and may hold spaces:
		// starttime is field 22 of the line, the 20th after the name.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat)[i+1:])
		if len(fields) < 20 {
			continue
		}
		ticks, err := strconv.ParseUint(fields[19], 10, 64)
		if err != nil {
			continue
		}
		began := boot.Add(time.Duration(ticks) * (time.Second / clockTicks)) //nolint:gosec // ticks since boot fit in int64
		if !found || began.After(newest) {
			newest, found, pid, argv0 = began, true, n, arg0
		}
	}
	return pid, argv0, newest, found
}

// BinaryReplaced says whether the running kubelet runs another file than the one it was started as,
// path (its argv[0], under Root): the binary was replaced since, so a restart runs another kubelet.
// It fails when no kubelet runs or its files cannot be read.
func (k *KubeletPods) BinaryReplaced() (path string, replaced bool, err error) {
	proc := filepath.Join(k.Root, "proc")
	pid, argv0, _, found := newestProcess(proc, "kubelet")
	if !found {
		return "", false, errors.New("no kubelet process runs on the node")
	}
	if !filepath.IsAbs(argv0) {
		return "", false, fmt.Errorf("the running kubelet was started as %q, not by its path", argv0)
	}
	running, err := os.Stat(filepath.Join(proc, strconv.Itoa(pid), "exe"))
	if err != nil {
		return argv0, false, fmt.Errorf("the running kubelet's binary: %w", err)
	}
	onDisk, err := (&FS{Root: k.Root}).Stat(argv0)
	if errors.Is(err, os.ErrNotExist) {
		return argv0, true, nil
	}
	if err != nil {
		return argv0, false, err
	}
	return argv0, !os.SameFile(running, onDisk), nil
}

// bootTime is when the machine booted, from proc/stat's btime.
func bootTime(proc string) (time.Time, bool) {
	b, err := os.ReadFile(filepath.Join(proc, "stat"))
	if err != nil {
		return time.Time{}, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, false
			}
			return time.Unix(sec, 0), true
		}
	}
	return time.Time{}, false
}
