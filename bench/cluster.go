package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
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
	up     *localcluster.UpProcess
	// pprof is the Go profiler's address by process, when the bench takes profiles.
	pprof map[string]string
	// profile, when set, starts the CPU profiles of a run and returns a wait for them.
	profile func(scenario string) (wait func() error)
}

// startCluster runs nodeops-local up in dir with one control plane (it must have one), no workers and
// k sim nodes, and returns once it printed its ready line.
func startCluster(ctx context.Context, binDir, dir string, k int, profile bool, logf func(string, ...any)) (*cluster, error) {
	// As an administrator: the raw-limit workload creates NodeTasks itself, which the NodeTask
	// creation policy of pod-bound credentials refuses, and earlier results ran without policies.
	args := []string{"--dir", dir, "--control-planes=1", "--workers=0", "--sim-nodes=" + strconv.Itoa(k), "--timeout=30m", "--agent-credentials=admin"}
	var pprof map[string]string
	if profile {
		more, addrs, err := profileArgs()
		if err != nil {
			return nil, err
		}
		args, pprof = append(args, more...), addrs
	}
	up, err := localcluster.StartUpProcess(binDir, args...)
	if err != nil {
		return nil, err
	}
	c := &cluster{dir: dir, up: up, pprof: pprof}
	logf("K=%d: nodeops-local up %s (pid %d)", k, strings.Join(args, " "), up.PID())
	if _, err := up.Ready(ctx); err != nil {
		c.stop()
		return nil, err
	}
	cfg, wc, err := localcluster.Connect(filepath.Join(dir, localcluster.KubeconfigFile))
	if err != nil {
		c.stop()
		return nil, err
	}
	c.cfg, c.client = cfg, wc
	return c, nil
}

// stop sends SIGTERM to nodeops-local and waits for it (it stops its children first).
func (c *cluster) stop() { _ = c.up.Stop(2 * time.Minute) }

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
