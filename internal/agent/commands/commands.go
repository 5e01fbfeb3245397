// Package commands runs one NodeTask command on its own node: each kind in its own file, each touching
// only its node (its host root, its Node object, its mirror pods; a drain it asks of the manager through
// Env.Drainer). A kind declares itself on its API type, its handler has one entry in Handlers, and
// TestEveryCommandKindIsComplete fails for a gap.
//
// A handler may not write a NodeTask's status (the agent records results), evict a pod (Env.Drainer asks
// the manager) or reach past its Env: the host only through Env.Host, the cluster only through Env.Client.
package commands

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/redact"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

// Env is what a command may use.
type Env struct {
	NodeName  string
	Operation string
	// Task and CommandIndex name the task and the command running, which the pod command names its pod after.
	Task         string
	CommandIndex int
	// TaskUID is the running task's: a script reads Secrets only from the holder pod it controls.
	TaskUID types.UID
	// Namespace is the agent's own, where the pod command creates its pod.
	Namespace string
	// ImagePullGrace is how long a pod command's image may fail to pull before the command fails;
	// zero for DefaultImagePullGrace.
	ImagePullGrace time.Duration
	// Owner is who the task cordons for (taskpolicy.OwnerOfTask); when empty, the operation by name.
	Owner string
	// DryRun: change nothing on the host or in the cluster; report what would be done. Run gives
	// handlers a Host and Client that do so, so handlers need not ask.
	DryRun bool
	Host   *host.Host
	// Client reads and writes the cluster directly (no cache): the node, its mirror pods.
	Client client.Client
	// API makes raw requests to the API server the agent uses (/readyz and an authorized read,
	// which write nothing and so are sent as they are in a DryRun too); nil when the agent has none.
	API  rest.Interface
	HTTP *http.Client
	// Out receives the command's output; its tail is reported in status.
	Out io.Writer
	// Arch is the node's architecture for binary downloads, such as amd64.
	Arch string
	// Poll is how often waiting commands look again; 2s when zero.
	Poll time.Duration
	// Drainer drains the node (the drain command, containerdRuntime's restart.drain); nil: no drain.
	Drainer Drainer
	// Prefetch holds what was downloaded for this command while the one before ran; nil for none.
	Prefetch *Prefetch
	// DownloadIdleTimeout fails a download whose server sends nothing for this long; zero for
	// DefaultDownloadIdleTimeout.
	DownloadIdleTimeout time.Duration
	// Secrets collects the secret values a command reads, which the agent redacts from everything
	// it records of the command; nil to keep none.
	Secrets *redact.Secrets
	// KubeletRootDir is the node's kubelet root directory, a host path: scripts read their Secrets
	// from the volumes the kubelet mounts there; empty for secretholder.DefaultKubeletRootDir.
	KubeletRootDir string
	// SecretMountWait bounds how long a script waits for its Secrets to be mounted; zero for
	// DefaultSecretMountWait.
	SecretMountWait time.Duration
	// Note shows what a running command waits for in the task's status (redacted by the caller);
	// nil: only in its output.
	Note func(message string)
	// CAServer serves a rotation's staged authorities to the operation's other control planes'
	// agents (generateCertificateAuthorities publishes it); nil when the agent runs none.
	CAServer CAServer
	// ServiceAccountToken is the agent's own token, which copyCertificateAuthorities shows the
	// generating agent; nil when the agent has none.
	ServiceAccountToken func() (string, error)
	// Waits adds up what the command waits for (a mirror pod, the control plane, the manager's
	// drain), which the agent records apart from the time the work ran; nil records nothing.
	Waits *Waits

	// acting is the Host that really changes things, set in a DryRun for kubeadm's own dry run,
	// which leaves files behind that must really be removed.
	acting *host.Host
}

// forRun is the Env a handler gets: in a DryRun its host reports changes instead of making them and
// its cluster writes are server-side dry runs.
func (e *Env) forRun() *Env {
	if !e.DryRun {
		return e
	}
	d := *e
	d.acting = e.Host
	d.Host = e.Host.DryRun(e.out())
	if e.Client != nil {
		d.Client = client.NewDryRunClient(e.Client)
	}
	return &d
}

// actingFiles are the host's files as they really are, even in a DryRun.
func (e *Env) actingFiles() host.Files {
	if e.acting != nil {
		return e.acting.Files
	}
	return e.Host.Files
}

func (e *Env) owner() string {
	if e.Owner != "" {
		return e.Owner
	}
	return taskpolicy.Owner("NodeOperation", e.Operation, "")
}

func (e *Env) out() io.Writer {
	if e.Out != nil {
		return e.Out
	}
	return io.Discard
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
	// CAServer is where the agent serves the authorities generateCertificateAuthorities made: an
	// address and a certificate fingerprint, never a key (rule 15).
	CAServer *v1alpha1.CertificateAuthorityServer
}

// Handler runs one command of one kind; spec is that kind's own type, such as *v1alpha1.ScriptCommand.
type Handler func(ctx context.Context, env *Env, spec v1alpha1.CommandKind) (Result, error)

// Handlers is the one table from command kind to the code that runs it. A test walks Command's
// fields and fails for a kind missing here.
func Handlers() map[string]Handler {
	return byKind(
		handle(runKubeadmUpgradeApply),
		handle(runKubeadmUpgradeNode),
		handle(runKubeadmUpgradePlan),
		handle(runKubeadmRenewCertificates),
		handle(runRestartStaticPods),
		handle(runInstallBinaries),
		handle(runInstallPackages),
		handle(runRestartService),
		handle(runCordon),
		handle(runDrain),
		handle(runUncordon),
		handle(runWaitNodeReady),
		handle(runPreflight),
		handle(runInstallFile),
		handle(runContainerdRuntime),
		handle(runScript),
		handle(runWait),
		handle(runPod),
		handle(runKubeadmUpdateConfig),
		handle(runKubeadmReconfigureNode),
		handle(runKubeadmReissueAPIServerCertificate),
		handle(runGenerateCertificateAuthorities),
		handle(runCopyCertificateAuthorities),
		handle(runTrustCertificateAuthorities),
		handle(runPublishCertificateAuthorities),
		handle(runReissueCertificates),
	)
}

type entry struct {
	kind string
	run  Handler
}

// handle files run under its kind's name, taken from the kind's type so the two cannot disagree.
func handle[T any, P interface {
	*T
	v1alpha1.CommandKind
}](run func(context.Context, *Env, P) (Result, error)) entry {
	return entry{kind: P(new(T)).KindName(), run: func(ctx context.Context, env *Env, spec v1alpha1.CommandKind) (Result, error) {
		return run(ctx, env, spec.(P))
	}}
}

func byKind(entries ...entry) map[string]Handler {
	m := make(map[string]Handler, len(entries))
	for _, e := range entries {
		m[e.kind] = e.run
	}
	return m
}

// Run runs one command. An error fails the command; host.ExitCode(err) is its exit code.
func Run(ctx context.Context, env *Env, c *v1alpha1.Command) (Result, error) {
	spec := c.Spec()
	if spec == nil {
		return Result{}, fmt.Errorf("command %q sets no command kind", c.DisplayName())
	}
	run, ok := Handlers()[spec.KindName()]
	if !ok {
		return Result{}, fmt.Errorf("command %q is of kind %s, which this agent has no handler for", c.DisplayName(), spec.KindName())
	}
	res, err := run(ctx, env.forRun(), spec)
	// Like kubectl's "(dry run)": the same message, marked, so it is never taken for a change made.
	if env.DryRun && res.Message != "" && !strings.HasPrefix(res.Message, "dry run") {
		res.Message = "dry run: " + res.Message
	}
	return res, err
}
