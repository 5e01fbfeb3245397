package framework

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeops/nodeops/internal/localcluster"
	"github.com/nodeops/nodeops/internal/testutil"
)

// Deadlines used by StartLocal and Stop.
const (
	StartTimeout = 10 * time.Minute
	StopTimeout  = 2 * time.Minute
)

var loggerOnce sync.Once

// Local is a running nodeops-local.
type Local struct {
	Dir        string
	Kubeconfig string
	BinDir     string
	Client     client.Client
	RESTConfig *rest.Config

	up *localcluster.UpProcess
}

// LocalPreflightIgnores are the kubeadm preflight checks that cannot pass in a local node root: it
// has no container runtime, /proc, kernel config or images (see docs/development/local-cluster.md).
var LocalPreflightIgnores = []string{"SystemVerification", "ContainerRuntimeVersion", "ImagePull"}

// BinDir is the directory of the binaries ($NODEOPS_BIN, or bin/ of the repository); it fails t
// when one of names is not there.
func BinDir(t testing.TB, names ...string) string {
	t.Helper()
	bin, err := localcluster.DefaultBinDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		exe := filepath.Join(bin, name)
		if _, err := os.Stat(exe); err != nil {
			t.Fatalf("%s is missing: run `make build` first (%v)", exe, err)
		}
	}
	return bin
}

// StartLocal starts `nodeops-local up` with args and returns once it printed its ready line.
// See the package documentation.
func StartLocal(t testing.TB, args ...string) *Local {
	t.Helper()
	bin := BinDir(t, "nodeops-local")
	dir := flagValue(args, "dir")
	if dir == "" {
		dir = t.TempDir()
		args = append([]string{"--dir", dir}, args...)
	}
	l := &Local{
		Dir:        dir,
		Kubeconfig: filepath.Join(dir, localcluster.KubeconfigFile),
		BinDir:     bin,
	}
	up, err := localcluster.StartUpProcess(bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	l.up = up
	t.Cleanup(func() {
		if err := l.Stop(); err != nil {
			t.Errorf("stopping nodeops-local: %v", err)
		}
		if t.Failed() {
			l.logDiagnostics(t)
		}
	})
	t.Logf("nodeops-local up %s (pid %d)", strings.Join(args, " "), up.PID())
	start := time.Now()
	ctx, cancel := context.WithTimeoutCause(context.Background(), StartTimeout, fmt.Errorf("not ready within %s", StartTimeout))
	defer cancel()
	kc, err := up.Ready(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if kc != l.Kubeconfig {
		t.Fatalf("nodeops-local printed kubeconfig %s, expected %s", kc, l.Kubeconfig)
	}
	t.Logf("nodeops-local ready in %s, kubeconfig %s", time.Since(start).Round(100*time.Millisecond), l.Kubeconfig)
	loggerOnce.Do(func() {
		// controller-runtime's client logs through this; without it, it prints a stack trace instead.
		ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	})
	cfg, c, err := localcluster.Connect(l.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	l.RESTConfig, l.Client = cfg, c
	return l
}

// PID is nodeops-local's own process ID.
func (l *Local) PID() int { return l.up.PID() }

// NodeRoot is the host-root directory of a control-plane or worker node.
func (l *Local) NodeRoot(node string) string { return filepath.Join(l.Dir, "nodes", node) }

// BinarySourceURL is the base URL of the binary source nodeops-local serves (kubeadm, kubelet,
// kubectl and their .sha256 files), as upgrades download from it.
func (l *Local) BinarySourceURL(t testing.TB) string {
	t.Helper()
	return strings.TrimSpace(ReadFile(t, filepath.Join(l.Dir, localcluster.BinarySourceURLFile)))
}

// Processes returns name -> PID of the processes nodeops-local started.
func (l *Local) Processes() (map[string]int, error) { return localcluster.ReadProcesses(l.Dir) }

// apiServerPID is the kube-apiserver's process ID (0 when the process table cannot be read): it
// changes when nodeops-local restarts it.
func (l *Local) apiServerPID() int {
	procs, _ := l.Processes()
	return procs["kube-apiserver"]
}

// Output is what nodeops-local printed so far.
func (l *Local) Output() string { return l.up.Output() }

// Stop sends SIGTERM to nodeops-local and waits until it exited, killing it after StopTimeout.
// It returns nodeops-local's exit error; calling it again returns the same.
func (l *Local) Stop() error { return l.up.Stop(StopTimeout) }

// Exited is closed once the nodeops-local process has exited (for example after `nodeops-local down`).
func (l *Local) Exited() <-chan struct{} { return l.up.Exited() }

// Kubectl runs bin/kubectl against the cluster and returns its standard output.
func (l *Local) Kubectl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(l.BinDir, "kubectl"), append([]string{"--kubeconfig", l.Kubeconfig}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// MustKubectl is Kubectl failing t on error.
func (l *Local) MustKubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := l.Kubectl(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// WaitNodesReady waits until at least n nodes are Ready and free of the not-ready taint.
func (l *Local) WaitNodesReady(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	testutil.EventuallyEvery(t, timeout, PollInterval, fmt.Sprintf("%d nodes Ready", n), func(ctx context.Context) error {
		var nodes corev1.NodeList
		if err := l.Client.List(ctx, &nodes); err != nil {
			return err
		}
		ready := 0
		for i := range nodes.Items {
			if localcluster.NodeReady(&nodes.Items[i]) {
				ready++
			}
		}
		if ready < n {
			return fmt.Errorf("%d of %d nodes Ready", ready, n)
		}
		return nil
	})
}

func (l *Local) logDiagnostics(t testing.TB) {
	t.Logf("nodeops-local output:\n%s", l.up.Output())
	logs, _ := filepath.Glob(filepath.Join(l.Dir, "logs", "*.log"))
	sort.Strings(logs)
	for _, f := range logs {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 20 {
			lines = lines[len(lines)-20:]
		}
		t.Logf("last lines of %s:\n%s", f, strings.Join(lines, "\n"))
	}
}

// flagValue finds --name VALUE or --name=VALUE (or one dash) in args.
func flagValue(args []string, name string) string {
	for i, a := range args {
		trimmed := strings.TrimLeft(a, "-")
		if trimmed == name && i+1 < len(args) && a != trimmed {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(trimmed, name+"="); ok && a != trimmed {
			return v
		}
	}
	return ""
}
