// Package localcluster runs nodeops-local: a real Kubernetes control plane (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler) with kwok playing the kubelets, local nodes that have a
// host-root directory each, simulated nodes for scale, and optionally the nodeops manager and agents,
// all as child processes of one foreground process.
//
// It is for development, demos and tests: no binary a cluster runs links it.
package localcluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// DefaultKubernetesVersion is the version the local cluster pretends to run before any upgrade:
// kubeadm-config, node roots and the nodes' kubelet versions all say it.
const DefaultKubernetesVersion = "v1.36.4"

// Options configure one local cluster.
type Options struct {
	// Dir holds everything the cluster writes; it must be empty or absent.
	Dir string
	// BinDir holds etcd, kube-apiserver, ..., kwok, kwok-stages/, manager and agent.
	BinDir string
	// ControlPlanes, Workers and SimNodes are the node counts (cp-*, worker-*, sim-*).
	ControlPlanes, Workers, SimNodes int
	// NoManager and NoAgents skip starting bin/manager and bin/agent.
	NoManager, NoAgents bool
	// Managers is how many manager processes run: one (or zero, the same) runs without leader
	// election as "manager"; more run as manager-1..manager-N electing a leader (see ManagerLease).
	Managers int
	// KubernetesVersion is the cluster's version as kubeadm sees it (kubeadm-config, node roots, kubelet versions).
	KubernetesVersion string
	// ReadyTimeout bounds the start-up, from the first process to every node Ready.
	ReadyTimeout time.Duration
	// ComponentKubeconfig, when set, is the kubeconfig the manager and agents use instead of
	// DIR/kubeconfig: the fault suite (test/faults) points it at a fault proxy in front of the API server.
	ComponentKubeconfig string
	// AgentCredentials is CredentialsAdmin (also when empty) or CredentialsPodBound: what the
	// manager and the local nodes' agents authenticate as, and whether a real install's RBAC and
	// admission policies are installed.
	AgentCredentials string
	// AgentMode is AgentModeDaemonSet (also when empty) or AgentModeJob: whether nodeops-local runs
	// one agent per local node, or the manager runs with --agent-mode=Job and nodeops-local plays the
	// kubelet of the agent Jobs' pods (see runAgentJobPods).
	AgentMode string
	// ManagerPprofAddress and SimAgentPprofAddress, when set, are the manager's and the sim nodes'
	// agent's --pprof-bind-address (make bench -profile).
	ManagerPprofAddress, SimAgentPprofAddress string
}

// Options.AgentMode values, the manager's --agent-mode.
const (
	AgentModeDaemonSet = "DaemonSet"
	AgentModeJob       = "Job"
)

// jobMode reports whether the manager runs agents as Jobs.
func (o *Options) jobMode() bool { return o.AgentMode == AgentModeJob }

// Validate reports the first problem with o.
func (o *Options) Validate() error {
	switch {
	case o.Dir == "":
		return errors.New("--dir is required")
	case o.ControlPlanes < 1:
		return fmt.Errorf("--control-planes must be at least 1, not %d", o.ControlPlanes)
	case o.ControlPlanes > 100 || o.Workers > 100:
		return fmt.Errorf("at most 100 control planes and 100 workers (they have host roots); use --sim-nodes for scale")
	case o.Workers < 0 || o.SimNodes < 0:
		return errors.New("--workers and --sim-nodes must not be negative")
	case o.Managers < 0 || o.Managers > 10:
		return fmt.Errorf("--managers must be between 1 and 10, not %d", o.Managers)
	case o.AgentCredentials != "" && o.AgentCredentials != CredentialsAdmin && o.AgentCredentials != CredentialsPodBound:
		return fmt.Errorf("--agent-credentials must be %s or %s, not %q", CredentialsPodBound, CredentialsAdmin, o.AgentCredentials)
	case o.AgentCredentials == CredentialsPodBound && o.ComponentKubeconfig != "":
		// A proxy behind that kubeconfig (test/faults') talks to the API server as an administrator,
		// whatever token reaches it.
		return fmt.Errorf("--component-kubeconfig needs --agent-credentials=%s", CredentialsAdmin)
	case o.AgentMode != "" && o.AgentMode != AgentModeDaemonSet && o.AgentMode != AgentModeJob:
		return fmt.Errorf("--agent-mode must be %s or %s, not %q", AgentModeDaemonSet, AgentModeJob, o.AgentMode)
	case o.jobMode() && o.AgentCredentials != CredentialsPodBound:
		// Each Job pod's agent runs with a token bound to that pod, as in a cluster.
		return fmt.Errorf("--agent-mode=%s needs --agent-credentials=%s", AgentModeJob, CredentialsPodBound)
	case o.jobMode() && (o.SimNodes > 0 || o.NoManager || o.NoAgents):
		// The manager makes the agents' Jobs; simulated nodes have no root to run their pods' agents on.
		return fmt.Errorf("--agent-mode=%s runs without --sim-nodes, --no-manager and --no-agents", AgentModeJob)
	case !strings.HasPrefix(o.KubernetesVersion, "v"):
		return fmt.Errorf("--kubernetes-version %q must look like v1.36.4", o.KubernetesVersion)
	}
	return nil
}

// DefaultBinDir returns $NODEOPS_BIN, or else the bin/ directory beside the go.mod found by walking
// up from the working directory and then from the running executable.
func DefaultBinDir() (string, error) {
	if d := os.Getenv("NODEOPS_BIN"); d != "" {
		return filepath.Abs(d)
	}
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	for _, start := range starts {
		for d := start; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				return filepath.Join(d, "bin"), nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	return "", errors.New("cannot find bin/: set NODEOPS_BIN or run inside the nodeops repository")
}
