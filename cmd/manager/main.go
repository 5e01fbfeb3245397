// Command manager runs nodeops' controllers: NodeOperation, NodeTask recovery, NodeProfile and ClusterTarget,
// sharing one node lock table.
//
// It turns flags into the controllers' options and registers them, nothing else; it may not link the
// agent or its host layer (TestManagerDoesNotLinkTheAgent).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"
	_ "time/tzdata" // maintenance windows name IANA zones; the image may have no zoneinfo

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/agentjob"
	"github.com/nodeops/nodeops/internal/controller/clustertarget"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/controller/nodetask"
	"github.com/nodeops/nodeops/internal/kubeclient"
	"github.com/nodeops/nodeops/internal/metrics"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/secretholder"
	"github.com/nodeops/nodeops/internal/version"
)

// leaderElectionID names the Lease the managers elect their leader with.
const leaderElectionID = "nodeops-manager.nodeops.io"

type options struct {
	version          bool
	kubeconfig       string
	agentMode        string
	agentImage       string
	agentPullPolicy  string
	agentLostAfter   time.Duration
	qps              float64
	burst            int
	metricsAddr      string
	metricsCertDir   string
	probeAddr        string
	pprofAddr        string
	leaderElect      bool
	leaderElectionNS string
	// leaderElectionIdentity replaces the host name in the Lease holder's identity NAME_UUID.
	leaderElectionIdentity string
	leaseDuration          time.Duration
	renewDeadline          time.Duration
	retryPeriod            time.Duration
	// podName and podNamespace name the manager's own pod, which its drains leave; empty outside a pod.
	podName, podNamespace string
}

func main() {
	ctx := ctrl.SetupSignalHandler()
	err := run(ctx, os.Args[1:])
	var lost *leadershipLost
	if err != nil && ctx.Err() == nil && errors.As(err, &lost) {
		// Losing the Lease ends this process's leadership for good: nothing of it may act again. A
		// container that exited would be restarted by its kubelet only after a crash-loop back-off
		// (10 s, then 20, 40, ... 5 min): on a single control plane, whose API server every renewal and
		// upgrade restarts, the manager lost the Lease at each restart and an operation's last step
		// waited out the back-off. Replacing the process image instead ends every goroutine of this
		// leadership as an exit would and starts a candidate at once. It keeps its identity: no other
		// process has it (this one's image is gone), so if the Lease still names it (no standby took
		// it while the API server was away) it leads again at once instead of waiting a whole lease
		// duration for its own Lease to expire, and otherwise waits like any other candidate.
		fmt.Fprintf(os.Stderr, "manager: leader election lost; starting again in place as a candidate with the same identity (%s)\n", lost.identity)
		if exe, xerr := os.Executable(); xerr == nil {
			env := os.Environ()
			if stamp := processStamp(); stamp != "" {
				env = append(env, inheritedIdentityEnv+"="+stamp+" "+lost.identity)
			}
			xerr = syscall.Exec(exe, os.Args, env)
			err = fmt.Errorf("%w (starting again in place failed: %w)", err, xerr)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
}

// leadershipLost is run's error when the manager stopped because it lost the leader election Lease
// it held as identity.
type leadershipLost struct {
	identity string
	err      error
}

func (l *leadershipLost) Error() string { return l.err.Error() }
func (l *leadershipLost) Unwrap() error { return l.err }

// isLeadershipLost says whether the manager stopped because it lost the leader election Lease
// (controller-runtime returns this error, with no type of its own).
func isLeadershipLost(err error) bool {
	return strings.Contains(err.Error(), "leader election lost")
}

// inheritedIdentityEnv carries a Lease holder identity across the manager's start in place:
// "STAMP IDENTITY", honoured only by the process STAMP names (processStamp), so that neither a copied
// environment nor a child process can make two managers hold one identity.
const inheritedIdentityEnv = "NODEOPS_MANAGER_INHERITED_IDENTITY"

// inheritedIdentity returns the identity this very process held before it replaced its image, or
// "" (a new start); it removes the variable so that nothing the manager starts sees it.
func inheritedIdentity() string {
	v, ok := os.LookupEnv(inheritedIdentityEnv)
	if !ok {
		return ""
	}
	_ = os.Unsetenv(inheritedIdentityEnv)
	stamp, id, ok := strings.Cut(v, " ")
	if !ok || id == "" || stamp == "" || stamp != processStamp() {
		return ""
	}
	return id
}

// processStamp names this process for as long as it runs, across exec: its PID, its start time in
// clock ticks since boot (proc/self/stat's 22nd field, which exec keeps), and the boot's ID. It is
// "" where /proc cannot say.
func processStamp() string {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return ""
	}
	// The command name, field 2, is in parentheses and may hold spaces: fields count after its ")".
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return ""
	}
	fields := strings.Fields(string(stat[i+1:]))
	const startTime = 22 - 3 // fields[0] is field 3, the state
	if len(fields) <= startTime {
		return ""
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%d/%s/%s", os.Getpid(), fields[startTime], strings.TrimSpace(string(boot)))
}

// run runs the manager until ctx ends.
func run(ctx context.Context, args []string) error {
	var o options
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; in-cluster config when empty")
	fs.StringVar(&o.agentMode, "agent-mode", "DaemonSet", "how agents run: DaemonSet (deployed beside the manager) or Job (a Job per node with pending tasks)")
	fs.DurationVar(&o.agentLostAfter, "agent-lost-after", nodetask.DefaultAgentLostAfter, "a running command whose agent renewed no heartbeat for this long fails its task with reason AgentLost (the agent renews every 15s)")
	fs.StringVar(&o.podName, "pod-name", os.Getenv("POD_NAME"), "the manager's own pod, which the drains it makes never evict (default: $POD_NAME, from the downward API)")
	fs.StringVar(&o.podNamespace, "pod-namespace", os.Getenv("POD_NAMESPACE"), "the namespace of --pod-name (default: $POD_NAMESPACE)")
	fs.StringVar(&o.agentImage, "agent-image", "ghcr.io/nodeops/agent:latest", "the agent's image: agent Jobs (--agent-mode=Job) and the secret holder pods of tasks whose scripts take env from Secrets run it")
	fs.StringVar(&o.agentPullPolicy, "agent-image-pull-policy", "", "imagePullPolicy of the secret holder pods (Always, IfNotPresent or Never); empty for the API server's default")
	// Deliberately high: a 1,000-node operation needs about 1,000 creates in a second or two, and
	// client-go's defaults (5/10) would make the manager, not the API server, the bottleneck.
	fs.Float64Var(&o.qps, "kube-api-qps", 800, "client requests per second to the API server")
	fs.IntVar(&o.burst, "kube-api-burst", 1600, "client request burst to the API server")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", "address of the metrics endpoint (HTTPS; each scrape needs a token allowed to get the non-resource URL /metrics, as the ClusterRole nodeops-metrics-reader grants); 0 disables")
	fs.StringVar(&o.metricsCertDir, "metrics-cert-dir", "", "directory with tls.crt and tls.key for the metrics endpoint; a self-signed certificate when empty")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "health probe address; 0 disables")
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "0", "address of the Go profiler's /debug/pprof endpoints (benchmarks); 0 disables")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "elect a leader so that only one manager acts")
	fs.StringVar(&o.leaderElectionNS, "leader-election-namespace", "nodeops-system", "namespace of the leader election Lease")
	fs.StringVar(&o.leaderElectionIdentity, "leader-election-identity", "", "name at the start of this manager's Lease holder identity NAME_UUID (a new UUID each start, so a restarted manager waits for the Lease like any other; a start in place after a lost Lease keeps it); the host name (a pod's name) when empty")
	// controller-runtime's defaults; nodeops-local shortens them so a failover test is quick.
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a standby waits, after the leader's last renewal, before taking the Lease")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "how long the leader retries renewing before it gives up leadership and exits")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", 2*time.Second, "how often each manager tries to acquire or renew the Lease")
	fs.BoolVar(&o.version, "version", false, "print the manager's version and exit")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.version {
		fmt.Println(version.Get())
		return nil
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	if o.agentMode != "DaemonSet" && o.agentMode != "Job" {
		return fmt.Errorf("--agent-mode must be DaemonSet or Job, not %q", o.agentMode)
	}
	switch corev1.PullPolicy(o.agentPullPolicy) {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return fmt.Errorf("--agent-image-pull-policy must be Always, IfNotPresent or Never, not %q", o.agentPullPolicy)
	}
	if !(o.retryPeriod > 0 && o.retryPeriod < o.renewDeadline && o.renewDeadline < o.leaseDuration) {
		return fmt.Errorf("need 0 < --leader-elect-retry-period (%s) < --leader-elect-renew-deadline (%s) < --leader-elect-lease-duration (%s)",
			o.retryPeriod, o.renewDeadline, o.leaseDuration)
	}

	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(o.qps), o.burst
	cfg.UserAgent = "nodeops-manager"
	if cfg, err = kubeclient.TrustCAFileAtEachConnection(cfg); err != nil {
		return err
	}
	if err := waitForAPIServer(ctx, cfg, os.Stderr); err != nil {
		return err
	}

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("build scheme: %w", err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("build scheme: %w", err)
	}
	var lock resourcelock.Interface
	identity := inheritedIdentity()
	if o.leaderElect {
		if identity == "" {
			name := o.leaderElectionIdentity
			if name == "" {
				if name, err = os.Hostname(); err != nil {
					return fmt.Errorf("leader election identity: %w", err)
				}
			}
			identity = name + "_" + string(uuid.NewUUID())
		}
		if lock, err = leaseLock(cfg, o, identity); err != nil {
			return err
		}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		// Authenticated and authorized through the API server (TokenReview, SubjectAccessReview):
		// the series name every node, operation and certificate expiry of the cluster.
		Metrics: metricsserver.Options{
			BindAddress:    o.metricsAddr,
			SecureServing:  true,
			CertDir:        o.metricsCertDir,
			FilterProvider: filters.WithAuthenticationAndAuthorization,
		},
		// controller-runtime keeps controller names for the life of the process, not of the manager:
		// a process runs one manager, but tests run it again in one process (go test -count=2), as
		// the agent's controller says too.
		Controller:                    config.Controller{SkipNameValidation: ptr.To(true)},
		HealthProbeBindAddress:        o.probeAddr,
		PprofBindAddress:              o.pprofAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              leaderElectionID,
		LeaderElectionNamespace:       o.leaderElectionNS,
		LeaderElectionReleaseOnCancel: true,
		// The Lease lock controller-runtime would build, with an identity the manager chose.
		LeaderElectionResourceLockInterface: lock,
		LeaseDuration:                       &o.leaseDuration,
		RenewDeadline:                       &o.renewDeadline,
		RetryPeriod:                         &o.retryPeriod,
		Cache: cache.Options{
			// The caches catch up within half a second of the API server's return, not client-go's back-off.
			NewInformer: kubeclient.NewInformer,
			// Memory: thousands of nodes and tasks are cached; nothing reads managedFields or node images.
			DefaultTransform: cache.TransformStripManagedFields(),
			ByObject: map[client.Object]cache.ByObject{
				&corev1.Node{}: {Transform: stripNode},
				// Agent Jobs (--agent-mode=Job) live in nodeops-system, hook Jobs in nodeops-hooks.
				&batchv1.Job{}: {Namespaces: map[string]cache.Config{"nodeops-system": {}, v1alpha1.HookNamespace: {}}},
			},
		},
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if err := setup(ctx, mgr, o); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("add health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("add ready check: %w", err)
	}
	if err := mgr.Start(ctx); err != nil {
		if o.leaderElect && isLeadershipLost(err) {
			return &leadershipLost{identity: identity, err: err}
		}
		return err
	}
	return nil
}

// setup registers every controller with one node lock table.
func setup(ctx context.Context, mgr ctrl.Manager, o options) error {
	locks := nodelock.New()
	if err := locks.Start(ctx, mgr.GetCache()); err != nil {
		return err
	}
	// Budgets shared across operations and profiles hold across managers too (budgets are cluster-wide, rule 11).
	locks.UseLedger(nodelock.NewLedger(mgr, o.leaderElectionNS))
	if err := nodeoperation.SetupWithManager(mgr, locks); err != nil {
		return fmt.Errorf("set up the NodeOperation controller: %w", err)
	}
	if err := nodetask.SetupWithOptions(mgr, nodetask.Options{AgentLostAfter: o.agentLostAfter}); err != nil {
		return fmt.Errorf("set up the NodeTask controller: %w", err)
	}
	self := types.NamespacedName{Namespace: o.podNamespace, Name: o.podName}
	if err := nodetask.SetupDrainWithManager(mgr, nodetask.DrainOptions{Self: self}); err != nil {
		return fmt.Errorf("set up the drain controller: %w", err)
	}
	holders := secretholder.Options{Image: o.agentImage, PullPolicy: corev1.PullPolicy(o.agentPullPolicy)}
	if err := nodetask.SetupSecretHoldersWithManager(mgr, nodetask.SecretHolderOptions{Options: holders}); err != nil {
		return fmt.Errorf("set up the secret holder controller: %w", err)
	}
	if err := nodeprofile.SetupWithManager(mgr, locks); err != nil {
		return fmt.Errorf("set up the NodeProfile controller: %w", err)
	}
	if err := clustertarget.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the ClusterTarget controller: %w", err)
	}
	collector := metrics.NewManager(mgr.GetCache())
	if err := collector.Start(ctx, mgr.GetCache()); err != nil {
		return err
	}
	// controller-runtime serves its one registry; registering there is the only global state, and
	// it is undone when the manager stops, so that a manager started again in the same process (a
	// test run twice) registers its own.
	if err := ctrlmetrics.Registry.Register(collector); err != nil {
		return fmt.Errorf("register nodeops' metrics: %w", err)
	}
	context.AfterFunc(ctx, func() { ctrlmetrics.Registry.Unregister(collector) })
	if o.agentMode == "Job" {
		if err := agentjob.SetupWithManager(mgr, agentjob.Options{Image: o.agentImage}); err != nil {
			return fmt.Errorf("set up the agent Job controller: %w", err)
		}
	}
	return nil
}

// leaseLock is the Lease lock controller-runtime's leaderelection.NewResourceLock builds, held as
// id: NAME_UUID, NAME the host name or --leader-election-identity (two managers on one host,
// nodeops-local, are told apart by name in the Lease's holderIdentity), or the identity this
// process held before it started again in place.
func leaseLock(cfg *rest.Config, o options, id string) (resourcelock.Interface, error) {
	cfg = rest.AddUserAgent(rest.CopyConfig(cfg), "leader-election")
	// As controller-runtime: one hung request must not outlast the renew deadline.
	cfg.Timeout = max(o.renewDeadline/2, time.Second)
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("leader election client: %w", err)
	}
	coord, err := coordinationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("leader election client: %w", err)
	}
	// No EventRecorder: the Lease's holderIdentity and the log say who leads.
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, o.leaderElectionNS, leaderElectionID, core, coord,
		resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return nil, fmt.Errorf("leader election lock: %w", err)
	}
	return lock, nil
}

func stripNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		n.ManagedFields = nil
		n.Status.Images = nil
	}
	return obj, nil
}

// waitForAPIServer waits until the API server answers /version. Building the manager needs it (the
// cache asks the API server which kinds are namespaced) and fails at once without it; a manager that
// starts while the API server restarts (a single control plane's renewal or upgrade, or a start in
// place after the Lease was lost) waits for it instead of exiting into the kubelet's crash-loop
// back-off. It says what it waits for every ten seconds; the liveness probe bounds the wait.
func waitForAPIServer(ctx context.Context, cfg *rest.Config, out io.Writer) error {
	dc, err := discovery.NewDiscoveryClientForConfig(rest.CopyConfig(cfg))
	if err != nil {
		return fmt.Errorf("discovery client: %w", err)
	}
	start := time.Now()
	var said time.Time
	for {
		_, err := dc.ServerVersion()
		if err == nil {
			if !said.IsZero() {
				fmt.Fprintf(out, "manager: the API server answers after %s\n", time.Since(start).Round(time.Second))
			}
			return nil
		}
		if said.IsZero() || time.Since(said) >= 10*time.Second {
			fmt.Fprintf(out, "manager: waiting for the API server (%s so far): %v\n", time.Since(start).Round(time.Second), err)
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the API server: %w (last: %w)", ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}
