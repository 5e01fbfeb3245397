// Command agent executes NodeTasks on a node: `agent --node-name N --host-root DIR`, or, for simulated
// nodes, `agent --noop-host --node-prefix sim-`, one process serving every node with that prefix.
//
// It turns flags into agent.Options and calls agent.Run, nothing else: what the agent does lives in
// internal/agent.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/kubeclient"
	"github.com/nodeops/nodeops/internal/secretholder"
	"github.com/nodeops/nodeops/internal/version"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		o            agent.Options
		kubeconfig   string
		qps          float64
		burst        int
		printVersion bool
		hold         bool
	)
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "node whose NodeTasks to execute (default: $NODE_NAME, set from the downward API)")
	fs.StringVar(&o.PodName, "pod-name", os.Getenv("POD_NAME"), "the agent's own pod, which drain never evicts (default: $POD_NAME, from the downward API)")
	fs.StringVar(&o.PodNamespace, "pod-namespace", os.Getenv("POD_NAMESPACE"), "the namespace of the agent's own pod (default: $POD_NAMESPACE, from the downward API)")
	fs.StringVar(&o.Identity, "identity", os.Getenv("POD_NAME"), "names this agent in its nodes' lock files, for a person reading them (default: $POD_NAME; empty names the process)")
	fs.StringVar(&o.LockDir, "lock-dir", "", "with --noop-host: the directory of the simulated nodes' lock files (<node>.lock), shared by every agent serving them; empty makes one for this process. Other agents lock "+agent.NodeLockFile+" under --host-root")
	fs.StringVar(&o.HostRoot, "host-root", "/host", "the node's / as the agent sees it")
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; in-cluster config when empty")
	fs.StringVar(&o.ServiceManager, "service-manager", host.ServiceManagerAuto, "auto, systemd, systemctl or local (the nodeops-local service table)")
	fs.BoolVar(&o.Noop, "noop-host", false, "record every command and succeed without touching anything (simulated nodes)")
	fs.StringVar(&o.NodePrefix, "node-prefix", "", "with --noop-host: serve every node whose name starts with this prefix")
	fs.IntVar(&o.Workers, "workers", 0, "tasks run at once (default 1, or 64 with --node-prefix)")
	fs.BoolVar(&o.ExitWhenIdle, "exit-when-idle", false, "exit once no task of the node needs the agent (Job mode)")
	fs.DurationVar(&o.Heartbeat, "heartbeat", agent.DefaultHeartbeat, "how often status.agentHeartbeat is renewed while a command runs")
	fs.DurationVar(&o.CertificateCheckInterval, "certificate-check-interval", agent.DefaultCertificateCheckInterval, "on a kubeadm control plane, how often to read the certificates' expiry (kubeadm certs check-expiration) into the Node's nodeops.io/certificates annotation, jittered by up to a fifth; written only when it changed; 0 never reads")
	fs.DurationVar(&o.DriftCheckInterval, "drift-check-interval", agent.DefaultDriftCheckInterval, "how often to compare the node's static pod manifests and kubelet configuration with what kubeadm generates from the cluster's kubeadm-config and kubelet-config (kubeadm upgrade node phase ... --dry-run) into the Node's nodeops.io/drift annotation, jittered by up to a fifth; written only when it changed; 0 never compares")
	fs.DurationVar(&o.DriftFileCheck, "drift-file-check", agent.DefaultDriftFileCheck, "how often to look whether the compared files changed (a digest, no kubeadm); a change is compared at once")
	fs.DurationVar(&o.ShutdownGracePeriod, "shutdown-grace-period", agent.DefaultShutdownGracePeriod, "on SIGTERM, how long a running command may go on to finish (no new one starts); keep the pod's terminationGracePeriodSeconds above it")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", "0", "address of the agent's metrics (plain HTTP: nodeops_agent_commands by kind and result, the last result's time, Go and client metrics); 0 disables")
	fs.StringVar(&o.PprofBindAddress, "pprof-bind-address", "0", "address of the Go profiler's /debug/pprof endpoints (benchmarks); 0 disables")
	fs.Float64Var(&qps, "kube-api-qps", 500, "client requests per second to the API server")
	fs.IntVar(&burst, "kube-api-burst", 1000, "client request burst to the API server")
	fs.StringVar(&o.KubeletRootDir, "kubelet-root-dir", secretholder.DefaultKubeletRootDir, "the node's kubelet --root-dir, as a host path: scripts read their Secrets from the volumes it mounts there for their task's secret holder pod")
	fs.StringVar(&o.CAServerAddress, "ca-server-address", "", "where to serve a certificate authority rotation's new authorities to the other control planes' agents (TLS, each asker's token reviewed), such as :9444; empty serves none and generateCertificateAuthorities fails")
	fs.StringVar(&o.CAServerAdvertise, "ca-server-advertise", "", "host:port the other agents reach --ca-server-address at, published in the generating task's status (default: $POD_IP and its port)")
	fs.BoolVar(&printVersion, "version", false, "print the agent's version and exit")
	fs.BoolVar(&hold, "hold", false, "do nothing until SIGTERM: the container of a task's secret holder pod, whose kubelet mounts the task's Secrets for its agent (internal/secretholder)")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if printVersion {
		fmt.Println(version.Get())
		return nil
	}
	if hold {
		// No cluster client: the holder has no token, and needs none.
		<-ctrl.SetupSignalHandler().Done()
		return nil
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	if o.CAServerAddress != "" && o.CAServerAdvertise == "" {
		_, port, err := net.SplitHostPort(o.CAServerAddress)
		if err != nil || os.Getenv("POD_IP") == "" {
			return fmt.Errorf("--ca-server-address %q: set --ca-server-advertise, or POD_IP (the downward API's status.podIP) and a port", o.CAServerAddress)
		}
		o.CAServerAdvertise = net.JoinHostPort(os.Getenv("POD_IP"), port)
	}
	if o.Workers == 0 {
		o.Workers = 1
		if o.NodePrefix != "" {
			o.Workers = 64
		}
	}
	if o.NodePrefix != "" {
		o.NodeName = ""
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 15 * time.Second
	}

	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(qps), burst
	cfg.UserAgent = "nodeops-agent"
	if cfg, err = kubeclient.TrustCAFileAtEachConnection(cfg); err != nil {
		return err
	}
	return agent.Run(ctrl.SetupSignalHandler(), cfg, o)
}
