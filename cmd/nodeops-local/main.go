// Command nodeops-local runs a local Kubernetes cluster for nodeops development, demos and tests:
// a real control plane, kwok for the kubelets, local nodes with host-root directories, and the
// nodeops manager and agents, all as child processes.
//
//	nodeops-local up --dir DIR [--control-planes N] [--workers M] [--sim-nodes K] [--no-manager] [--managers N] [--no-agents] [--agent-credentials pod-bound|admin] [--agent-mode DaemonSet|Job]
//	nodeops-local down --dir DIR
//
// It turns flags into localcluster options, nothing else.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nodeops/nodeops/internal/localcluster"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "nodeops-local: %v\n", err)
		os.Exit(1)
	}
}

const usage = `usage:
  nodeops-local up --dir DIR [--control-planes N] [--workers M] [--sim-nodes K] [--no-manager] [--managers N] [--no-agents] [--agent-credentials pod-bound|admin] [--agent-mode DaemonSet|Job]
  nodeops-local down --dir DIR
`

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("a command is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "up":
		o, err := upOptions(args[1:], stderr)
		if err != nil {
			return err
		}
		return localcluster.Up(ctx, o, stdout)
	case "down":
		fs := flag.NewFlagSet("down", flag.ContinueOnError)
		fs.SetOutput(stderr)
		dir := fs.String("dir", "", "directory of the running instance")
		timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait for it to stop")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *dir == "" {
			return fmt.Errorf("--dir is required")
		}
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		if err := localcluster.Down(ctx, *dir); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "stopped nodeops-local in %s\n", *dir)
		return nil
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
}

func upOptions(args []string, stderr io.Writer) (localcluster.Options, error) {
	o := localcluster.Options{}
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Dir, "dir", "", "directory for everything the cluster writes (must be empty or absent)")
	fs.IntVar(&o.ControlPlanes, "control-planes", 1, "number of control-plane nodes cp-1..cp-N (with host roots)")
	fs.IntVar(&o.Workers, "workers", 2, "number of worker nodes worker-1..worker-M (with host roots)")
	fs.IntVar(&o.SimNodes, "sim-nodes", 0, "number of simulated nodes sim-1..sim-K (no host roots; for scale)")
	fs.BoolVar(&o.NoManager, "no-manager", false, "do not start bin/manager")
	fs.BoolVar(&o.NoAgents, "no-agents", false, "do not start bin/agent processes")
	fs.IntVar(&o.Managers, "managers", 1, "number of bin/manager processes: 1 runs without leader election; more run as manager-1..manager-N electing a leader with a Lease in nodeops-system")
	fs.StringVar(&o.KubernetesVersion, "kubernetes-version", localcluster.DefaultKubernetesVersion, "version kubeadm-config, node roots and kubelets report")
	fs.StringVar(&o.BinDir, "bin", "", "directory of the binaries (default $NODEOPS_BIN, else bin/ of the repository)")
	fs.DurationVar(&o.ReadyTimeout, "timeout", 10*time.Minute, "how long start-up may take")
	fs.StringVar(&o.ComponentKubeconfig, "component-kubeconfig", "", "kubeconfig for the manager and agents instead of DIR/kubeconfig (a fault proxy in front of the API server, as test/faults does); needs --agent-credentials=admin")
	fs.StringVar(&o.AgentCredentials, "agent-credentials", localcluster.CredentialsPodBound, "pod-bound: a real install's RBAC and admission policies, each local node's agent with a token bound to a stand-in pod on its node and the manager with its ServiceAccount's token (DIR/credentials); admin: both with DIR/kubeconfig and no nodeops RBAC or policies")
	fs.StringVar(&o.ManagerPprofAddress, "manager-pprof-address", "", "the manager's --pprof-bind-address (Go profiler, for make bench -profile); empty: none")
	fs.StringVar(&o.SimAgentPprofAddress, "sim-agent-pprof-address", "", "the sim nodes' agent's --pprof-bind-address (Go profiler, for make bench -profile); empty: none")
	fs.StringVar(&o.AgentMode, "agent-mode", localcluster.AgentModeDaemonSet, "DaemonSet: nodeops-local runs one agent process per local node, as config/agent's DaemonSet would; Job: the manager runs with --agent-mode=Job, making a Job per node with pending tasks in nodeops-system, and nodeops-local plays the kubelet of those Jobs' pods on the local nodes: for each it runs bin/agent with the pod's args and env on the node's root and a token bound to that pod (DIR/credentials/agent-<pod>.*, log DIR/logs/agent-<pod>.log), and writes the pod Running, then Succeeded or Failed with the agent's exit code; needs --agent-credentials=pod-bound, and no --sim-nodes, --no-manager or --no-agents")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.BinDir == "" {
		d, err := localcluster.DefaultBinDir()
		if err != nil {
			return o, err
		}
		o.BinDir = d
	}
	return o, nil
}
