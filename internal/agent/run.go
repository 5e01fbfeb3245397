package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	authenticationv1 "k8s.io/api/authentication/v1"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/cakeys"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/kubeclient"
	"github.com/nodeops/nodeops/internal/metrics"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

// DefaultShutdownGracePeriod is how long a running command may go on after SIGTERM: long enough for
// kubeadm upgrade apply, which waits up to 5 minutes for each static pod it replaces. The agent's
// pods (config/agent, the chart, agent Jobs) set terminationGracePeriodSeconds a little above it.
const DefaultShutdownGracePeriod = 10 * time.Minute

// Options configure an agent process.
type Options struct {
	// NodeName is the one node served; ignored with NodePrefix.
	NodeName string
	// NodePrefix, with Noop: serve every node whose name starts with it.
	NodePrefix string
	// HostRoot is the node's / as the agent sees it.
	HostRoot string
	// ServiceManager is auto, systemd, systemctl or local.
	ServiceManager string
	Noop           bool
	// Workers is how many tasks run at once (nodes served concurrently).
	Workers int
	// ExitWhenIdle: exit once no task of the served nodes needs the agent (Job mode).
	ExitWhenIdle bool
	Heartbeat    time.Duration
	Poll         time.Duration
	HTTP         *http.Client
	// ShutdownGracePeriod is how long a running command may go on once the agent is told to stop
	// (every command has a timeout, rule 12); zero stops it at once.
	ShutdownGracePeriod time.Duration
	// PodName and PodNamespace name the agent's own pod (the downward API's POD_NAME and
	// POD_NAMESPACE), which drain never evicts; empty outside a pod.
	PodName      string
	PodNamespace string
	// MetricsBindAddress serves the agent's metrics (plain HTTP) there; empty or "0": none.
	MetricsBindAddress string
	// PprofBindAddress serves the Go profiler's /debug/pprof there (benchmarks); empty or "0": none.
	PprofBindAddress string
	// DefaultTimeout is the timeout of a command that sets none; nil for its kind's own
	// (v1alpha1.CommandKind.DefaultTimeout). Tests shorten it.
	DefaultTimeout func(v1alpha1.CommandKind) time.Duration
	// CertificateCheckInterval is how often a control plane's agent reads its certificates'
	// expiry into its Node (CertificateReader); zero reads never.
	CertificateCheckInterval time.Duration
	// DriftCheckInterval is how often the agent asks kubeadm what it generates for its node and
	// records the node's drift (DriftReader); zero reads never. DriftFileCheck is how often it looks
	// whether the compared files changed; zero for DefaultDriftFileCheck.
	DriftCheckInterval time.Duration
	DriftFileCheck     time.Duration
	// Identity names the agent in the node lock files it writes, for a person reading them (a
	// pod's name); empty names its process.
	Identity string
	// LockDir, with Noop, holds the simulated nodes' lock files (<node>.lock), shared by every
	// agent that serves them; empty: a new directory of this process's. Other agents lock
	// NodeLockFile under HostRoot.
	LockDir string
	// ImagePullGrace: how long a pod command's image may fail to pull before the command fails;
	// zero for commands.DefaultImagePullGrace (tests shorten it).
	ImagePullGrace time.Duration
	// KubeletRootDir is the node's kubelet --root-dir as a host path, where scripts read their
	// Secrets (internal/secretholder); empty for /var/lib/kubelet.
	KubeletRootDir string
	// SecretMountWait bounds how long a script waits for the kubelet to mount its Secrets; zero for
	// commands.DefaultSecretMountWait (tests shorten it).
	SecretMountWait time.Duration
	// CAServerAddress is where the agent listens for other control planes' agents asking for a
	// rotation's new certificate authorities (internal/cakeys), such as :9444; empty: it serves none,
	// and generateCertificateAuthorities fails on its node.
	CAServerAddress string
	// CAServerAdvertise is the host:port the other agents reach that server at (the pod's IP and the
	// port), published in the generating task's status.
	CAServerAdvertise string
}

// AgentUser is the user an agent's ServiceAccount token authenticates as in namespace ns.
func AgentUser(ns string) string { return "system:serviceaccount:" + ns + ":nodeops-agent" }

// Scheme is the agent's own scheme: core, coordination, policy, authentication (the TokenReviews of
// its certificate authority server, cakeys.Server) and nodeops kinds.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, coordinationv1.AddToScheme, policyv1.AddToScheme,
		authenticationv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("building the scheme: %w", err)
		}
	}
	return s, nil
}

// TaskSelector selects the NodeTasks an agent caches: one node's by label, or (prefix mode) every
// task with a node label, filtered by prefix as events arrive.
func TaskSelector(o Options) (labels.Selector, error) {
	op, values := selection.Equals, []string{o.NodeName}
	if o.NodePrefix != "" {
		op, values = selection.Exists, nil
	}
	req, err := labels.NewRequirement(v1alpha1.LabelNode, op, values)
	if err != nil {
		return nil, fmt.Errorf("node selector: %w", err)
	}
	return labels.NewSelector().Add(*req), nil
}

func (o Options) validate() error {
	switch {
	case o.NodePrefix != "" && !o.Noop:
		return fmt.Errorf("--node-prefix serves many nodes and needs --noop-host")
	case o.NodePrefix == "" && o.NodeName == "":
		return fmt.Errorf("a node name is needed (--node-name or NODE_NAME)")
	case !o.Noop && o.HostRoot == "":
		return fmt.Errorf("a host root is needed (--host-root)")
	}
	return nil
}

// lockFile says where a node's lock file is (nodehold.go): on the node itself, or for simulated
// nodes in LockDir; cleanup removes a directory made for this process.
func (o Options) lockFile() (func(node string) string, func(), error) {
	if !o.Noop {
		path := filepath.Join(o.HostRoot, NodeLockFile)
		return func(string) string { return path }, func() {}, nil
	}
	dir, cleanup := o.LockDir, func() {}
	if dir == "" {
		d, err := os.MkdirTemp("", "nodeops-agent-locks-")
		if err != nil {
			return nil, nil, fmt.Errorf("a directory for the simulated nodes' locks: %w", err)
		}
		dir, cleanup = d, func() { _ = os.RemoveAll(d) }
	}
	return func(node string) string {
		if len(node) > 200 {
			// A file name has at most 255 bytes, a node name up to 253.
			sum := sha256.Sum256([]byte(node))
			node = hex.EncodeToString(sum[:])
		}
		return filepath.Join(dir, node+".lock")
	}, cleanup, nil
}

// Run runs the agent until ctx ends (or, with ExitWhenIdle, until it has nothing left to do). When
// ctx ends no command starts any more; a running one may finish within o.ShutdownGracePeriod and
// have its result recorded, after which its context is cancelled (every command has a timeout, rule 12).
func Run(ctx context.Context, cfg *rest.Config, o Options) error {
	if err := o.validate(); err != nil {
		return err
	}
	scheme, err := Scheme()
	if err != nil {
		return err
	}
	sel, err := TaskSelector(o)
	if err != nil {
		return err
	}
	serveMetrics := o.MetricsBindAddress != "" && o.MetricsBindAddress != "0"
	if !serveMetrics {
		o.MetricsBindAddress = "0"
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: o.MetricsBindAddress},
		HealthProbeBindAddress: "0",
		PprofBindAddress:       o.PprofBindAddress,
		Cache: cache.Options{
			// The task cache catches up within a second of the API server's return.
			NewInformer: kubeclient.NewAgentInformer,
			ByObject: map[client.Object]cache.ByObject{
				&v1alpha1.NodeTask{}: {Label: sel},
			}},
	})
	if err != nil {
		return fmt.Errorf("creating the agent's manager: %w", err)
	}
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	api, err := rest.RESTClientFor(rawConfig(cfg))
	if err != nil {
		return fmt.Errorf("creating a REST client: %w", err)
	}
	if o.HTTP == nil {
		o.HTTP = commands.NewHTTPClient()
	}
	r := &Reconciler{
		Client:    mgr.GetClient(),
		Direct:    direct,
		API:       api,
		Serves:    NodeServer(o.NodeName, o.NodePrefix),
		Noop:      o.Noop,
		Heartbeat: o.Heartbeat,
		HTTP:      o.HTTP,
		Poll:      o.Poll,

		DefaultTimeout:  o.DefaultTimeout,
		AgentPod:        types.NamespacedName{Namespace: o.PodNamespace, Name: o.PodName},
		Identity:        o.Identity,
		Namespace:       o.PodNamespace,
		ImagePullGrace:  o.ImagePullGrace,
		KubeletRootDir:  o.KubeletRootDir,
		SecretMountWait: o.SecretMountWait,
	}
	lockFile, cleanup, err := o.lockFile()
	if err != nil {
		return err
	}
	defer cleanup()
	r.LockFile = lockFile
	if !o.Noop {
		h, err := host.Open(o.ServiceManager, o.HostRoot)
		if err != nil {
			return err
		}
		r.HostFor = func(string) *host.Host { return h }
		if o.ServiceManager == host.ServiceManagerLocal {
			// No containerd runs on a local node: the stand-in socket answers the preflight.
			sock, err := host.ServeLocalRuntimeSocket(o.HostRoot)
			if err != nil {
				log.FromContext(ctx).Error(err, "the preflight's container runtime check will fail on this node")
			} else {
				defer func() { _ = sock.Close() }()
			}
		}
		r.ServiceAccountToken = bearerToken(cfg)
		if o.CAServerAddress != "" {
			srv := &cakeys.Server{Node: o.NodeName, Files: h.Files, Client: direct, AgentUser: AgentUser(o.PodNamespace),
				Advertise: o.CAServerAdvertise, Log: func(m string) { log.FromContext(ctx).Info(m) }}
			r.CAServer = srv
			if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
				l, err := net.Listen("tcp", o.CAServerAddress)
				if err != nil {
					return fmt.Errorf("the certificate authority server: %w", err)
				}
				return srv.Serve(ctx, l)
			})); err != nil {
				return fmt.Errorf("adding the certificate authority server: %w", err)
			}
		}
		if o.CertificateCheckInterval > 0 {
			certs := &CertificateReader{Client: direct, Node: o.NodeName, Host: h, Interval: o.CertificateCheckInterval}
			if err := mgr.Add(certs); err != nil {
				return fmt.Errorf("adding the certificate reader: %w", err)
			}
		}
		if o.DriftCheckInterval > 0 {
			drift := &DriftReader{Client: direct, Node: o.NodeName, Host: h, Interval: o.DriftCheckInterval, FileCheck: o.DriftFileCheck, Busy: r.Busy, Worked: r.Worked}
			if err := mgr.Add(drift); err != nil {
				return fmt.Errorf("adding the drift reader: %w", err)
			}
		}
	}
	if err := r.SetupWithManager(mgr, o.Workers); err != nil {
		return err
	}
	if serveMetrics {
		// controller-runtime serves its one registry; registering there is the only global state.
		c := metrics.NewAgent(mgr.GetCache(), r.Serves)
		if err := ctrlmetrics.Registry.Register(c); err != nil {
			return fmt.Errorf("registering the agent's metrics: %w", err)
		}
		// The collector reads this run's cache: it goes with it, so that a later run in the same
		// process (a test run again) registers its own.
		defer ctrlmetrics.Registry.Unregister(c)
	}
	// The manager, and with it every reconcile and command, runs in work, which outlives ctx by
	// the grace period: ctx's end only closes stopping.
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopping := make(chan struct{})
	r.Stopping = stopping
	go func() {
		select {
		case <-work.Done():
			return
		case <-ctx.Done():
		}
		close(stopping)
		drain(work, r, o.ShutdownGracePeriod)
		cancel()
	}()
	if o.ExitWhenIdle {
		if err := mgr.Add(&idleExit{r: r, cache: mgr.GetClient(), cancel: cancel}); err != nil {
			return fmt.Errorf("adding the idle watcher: %w", err)
		}
	}
	log.FromContext(ctx).Info("agent starting", "node", o.NodeName, "prefix", o.NodePrefix, "root", o.HostRoot, "noop", o.Noop)
	err = mgr.Start(work)
	if !r.Busy() {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		r.releaseHolds(rctx)
		rcancel()
	}
	return err
}

// bearerToken reads the agent's own token as its client sends it: the projected ServiceAccount
// token file (re-read each time, as the kubelet rotates it), else a fixed token.
func bearerToken(cfg *rest.Config) func() (string, error) {
	return func() (string, error) {
		if cfg.BearerTokenFile != "" {
			data, err := os.ReadFile(cfg.BearerTokenFile)
			return strings.TrimSpace(string(data)), err
		}
		if cfg.BearerToken != "" {
			return cfg.BearerToken, nil
		}
		return "", errors.New("the agent authenticates with no ServiceAccount token")
	}
}

// drain waits, up to grace, until no task is being worked on.
func drain(ctx context.Context, r *Reconciler, grace time.Duration) {
	logger := log.FromContext(ctx)
	if !r.Busy() {
		return
	}
	logger.Info("stopping: no new command starts; waiting for the running one", "gracePeriod", grace)
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	for r.Busy() {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			logger.Info("stopping: the grace period ran out; cancelling the running command", "gracePeriod", grace)
			return
		case <-poll.C:
		}
	}
	logger.Info("stopping: the running command ended and its result is recorded")
}

// SetupWithManager registers the reconciler for the NodeTasks of the nodes it serves.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, workers int) error {
	if workers <= 0 {
		workers = 1
	}
	serves := predicate.NewPredicateFuncs(func(obj client.Object) bool {
		t, ok := obj.(*v1alpha1.NodeTask)
		return ok && r.Serves(t.Spec.NodeName)
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodetask-agent").
		For(&v1alpha1.NodeTask{}, builder.WithPredicates(serves, predicate.Funcs{DeleteFunc: func(event.DeleteEvent) bool { return false }})).
		// Tests run several agents in one process; a real one has one controller.
		WithOptions(controller.Options{MaxConcurrentReconciles: workers, SkipNameValidation: ptr.To(true)}).
		Complete(r)
}

// idleExit ends the agent once, after the cache synced, no served task needs it for a few seconds.
type idleExit struct {
	r      *Reconciler
	cache  client.Reader
	cancel context.CancelFunc
}

func (i *idleExit) Start(ctx context.Context) error {
	quiet := 0
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		tasks := &v1alpha1.NodeTaskList{}
		if err := i.cache.List(ctx, tasks); err != nil {
			quiet = 0
			continue
		}
		idle := !i.r.Busy()
		for k := range tasks.Items {
			if i.r.Serves(tasks.Items[k].Spec.NodeName) && taskpolicy.NeedsAgent(&tasks.Items[k]) {
				idle = false
				break
			}
		}
		if !idle {
			quiet = 0
			continue
		}
		if quiet++; quiet >= 3 {
			log.FromContext(ctx).Info("no task needs the agent; exiting")
			i.cancel()
			return nil
		}
	}
}

// rawConfig is cfg for raw requests by absolute path (/readyz, the node), sent as JSON.
func rawConfig(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &schema.GroupVersion{}
	c.APIPath = "/"
	c.NegotiatedSerializer = clientgoscheme.Codecs.WithoutConversion()
	c.ContentType = "application/json"
	return c
}
