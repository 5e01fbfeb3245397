package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/internal/localcluster"
)

// cluster is one running `nodeops-local up` with K simulated nodes.
type cluster struct {
	dir    string
	cfg    *rest.Config
	client client.WithWatch
	cmd    *exec.Cmd
	exited chan struct{}

	mu     sync.Mutex
	output strings.Builder
}

// startCluster runs nodeops-local up in dir with one control plane (it must have one), no workers and
// k sim nodes, and returns once it printed its ready line.
func startCluster(ctx context.Context, binDir, dir string, k int, logf func(string, ...any)) (*cluster, error) {
	args := []string{"up", "--dir", dir, "--control-planes=1", "--workers=0", "--sim-nodes=" + strconv.Itoa(k), "--timeout=30m"}
	cmd := exec.Command(filepath.Join(binDir, "nodeops-local"), args...)
	cmd.Env = append(os.Environ(), "NODEOPS_BIN="+binDir)
	// If the bench dies, nodeops-local is told to stop its children.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting nodeops-local: %w", err)
	}
	c := &cluster{dir: dir, cmd: cmd, exited: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			c.mu.Lock()
			c.output.WriteString(line + "\n")
			c.mu.Unlock()
			if strings.HasPrefix(line, localcluster.ReadyPrefix) {
				once.Do(func() { close(ready) })
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		_ = cmd.Wait()
		_ = pw.Close()
		close(c.exited)
	}()
	logf("K=%d: nodeops-local %s (pid %d)", k, strings.Join(args, " "), cmd.Process.Pid)
	select {
	case <-ready:
	case <-c.exited:
		return nil, fmt.Errorf("nodeops-local exited before it was ready:\n%s", c.out())
	case <-ctx.Done():
		c.stop()
		return nil, ctx.Err()
	}
	cfg, err := localcluster.RESTConfig(filepath.Join(dir, localcluster.KubeconfigFile))
	if err != nil {
		c.stop()
		return nil, err
	}
	scheme, err := localcluster.NewScheme()
	if err != nil {
		c.stop()
		return nil, err
	}
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("creating a client: %w", err)
	}
	c.cfg, c.client = cfg, wc
	return c, nil
}

func (c *cluster) out() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.output.String()
}

// stop sends SIGTERM to nodeops-local and waits for it (it stops its children first).
func (c *cluster) stop() {
	select {
	case <-c.exited:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(2 * time.Minute):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// pid returns the PID of a child of nodeops-local by its name (manager, agent-sim, kube-apiserver, etcd).
func (c *cluster) pid(name string) (int, error) {
	procs, err := localcluster.ReadProcesses(c.dir)
	if err != nil {
		return 0, err
	}
	pid, ok := procs[name]
	if !ok {
		return 0, fmt.Errorf("nodeops-local runs no %s (processes: %v)", name, procs)
	}
	return pid, nil
}
