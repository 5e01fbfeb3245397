// Package commands runs one NodeTask command on its own node: each kind in its own file, each touching
// only its node (its host root, its Node object and the pods on it).
package commands

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// Env is what a command may use.
type Env struct {
	NodeName  string
	Operation string
	// DryRun: change nothing on the host or in the cluster; report what would be done.
	DryRun bool
	Host   *host.Host
	// Client reads and writes the cluster directly (no cache): the node, its pods, evictions.
	Client client.Client
	HTTP   *http.Client
	// Out receives the command's output; its tail is reported in status.
	Out io.Writer
	// Arch is the node's architecture for binary downloads, such as amd64.
	Arch string
	// Poll is how often waiting commands look again; 2s when zero.
	Poll time.Duration
}

func (e *Env) poll() time.Duration {
	if e.Poll > 0 {
		return e.Poll
	}
	return 2 * time.Second
}

func (e *Env) printf(format string, args ...any) {
	if e.Out != nil {
		_, _ = fmt.Fprintf(e.Out, format, args...)
	}
}

// Result is what a command reports besides its output.
type Result struct {
	Message      string
	Certificates []v1alpha1.CertificateExpiry
}

// Run runs one command. An error fails the command; host.ExitCode(err) is its exit code.
func Run(ctx context.Context, env *Env, c *v1alpha1.Command) (Result, error) {
	switch {
	case c.Script != nil:
		return runScript(ctx, env, c.Script)
	case c.Wait != nil:
		return runWait(ctx, env, c.Wait)
	case c.Cordon != nil:
		return runCordon(ctx, env)
	case c.Uncordon != nil:
		return runUncordon(ctx, env)
	case c.Drain != nil:
		return runDrain(ctx, env, c.Drain)
	case c.WaitNodeReady != nil:
		return runWaitNodeReady(ctx, env, c.WaitNodeReady)
	case c.InstallFile != nil:
		return runInstallFile(ctx, env, c.InstallFile)
	case c.ContainerdRuntime != nil:
		return runContainerdRuntime(ctx, env, c.ContainerdRuntime)
	case c.RestartService != nil:
		return runRestartService(ctx, env, c.RestartService)
	case c.InstallBinaries != nil:
		return runInstallBinaries(ctx, env, c.InstallBinaries)
	case c.Preflight != nil:
		return runPreflight(ctx, env, c.Preflight)
	case c.KubeadmUpgradePlan != nil:
		return runKubeadmUpgradePlan(ctx, env, c.KubeadmUpgradePlan)
	case c.KubeadmUpgradeApply != nil:
		return runKubeadmUpgradeApply(ctx, env, c.KubeadmUpgradeApply)
	case c.KubeadmUpgradeNode != nil:
		return runKubeadmUpgradeNode(ctx, env, c.KubeadmUpgradeNode)
	case c.KubeadmRenewCertificates != nil:
		return runKubeadmRenewCertificates(ctx, env, c.KubeadmRenewCertificates)
	case c.RestartStaticPods != nil:
		return runRestartStaticPods(ctx, env, c.RestartStaticPods)
	}
	return Result{}, fmt.Errorf("command %q has no kind this agent knows", c.DisplayName())
}
