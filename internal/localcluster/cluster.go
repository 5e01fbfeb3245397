package localcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/config"
	"github.com/nodeops/nodeops/internal/secretholder"
)

// Files nodeops-local writes in DIR besides logs/, nodes/, pki/ and etcd/.
const (
	PIDFile        = "nodeops-local.pid"
	KubeconfigFile = "kubeconfig"
	// ReadyPrefix starts the one line printed once every node is Ready.
	ReadyPrefix = "ready: kubeconfig="
)

const (
	pollInterval = 250 * time.Millisecond
	stopGrace    = 15 * time.Second
)

// Up runs a local cluster in the foreground until ctx ends, then stops every process it started and
// returns; DIR is left for inspection. Progress goes to out, ending with "ready: kubeconfig=DIR/kubeconfig".
func Up(ctx context.Context, o Options, out io.Writer) (retErr error) {
	if err := o.Validate(); err != nil {
		return err
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return fmt.Errorf("resolving --dir: %w", err)
	}
	o.Dir = dir
	if o.ComponentKubeconfig != "" {
		// Children run in DIR: a relative path would name another file there.
		if o.ComponentKubeconfig, err = filepath.Abs(o.ComponentKubeconfig); err != nil {
			return fmt.Errorf("resolving --component-kubeconfig: %w", err)
		}
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 10 * time.Minute
	}
	stages, err := checkBinaries(o)
	if err != nil {
		return err
	}
	if err := prepareDir(dir); err != nil {
		return err
	}
	if stages, err = kwokStages(dir, stages); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, PIDFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return fmt.Errorf("writing pid file: %w", err)
	}
	defer os.Remove(filepath.Join(dir, PIDFile))

	// Released after the deferred stop below (defers run last first): the components hold them till then.
	ports := newPortReservations()
	defer ports.release()

	start := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(out, "nodeops-local: [%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	sup := newSupervisor(dir, logf)
	defer func() {
		logf("stopping")
		sup.stopAll(stopGrace)
		logf("stopped; %s is left for inspection", dir)
	}()

	// A child that dies during start-up ends it, with what its log says (the supervisor first starts
	// one that crashed as a Go program does, or had run a few seconds, again once).
	startCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case err := <-sup.failed:
			cancel(err)
		case <-startCtx.Done():
		}
	}()
	startCtx, cancelTimeout := context.WithTimeoutCause(startCtx, o.ReadyTimeout,
		fmt.Errorf("the cluster was not ready within %s (logs in %s)", o.ReadyTimeout, filepath.Join(dir, "logs")))
	defer cancelTimeout()
	c, l, creds, err := bringUp(startCtx, o, sup, ports, stages, logf)
	if err == nil {
		err = startStandIns(ctx, startCtx, o, c, l.etcdURL(), logf)
	}
	if err == nil && creds != nil {
		go creds.run(ctx, logf)
	}
	if err == nil && o.jobMode() {
		rooted := rootedNodes(o)
		logf("agents run as the manager's Jobs (--agent-mode=Job): playing the kubelet of their pods on %d local nodes", len(rooted))
		go runAgentPods(ctx, c, sup, creds, o, rooted, logf)
	}
	if err != nil {
		if cause := context.Cause(startCtx); cause != nil && ctx.Err() == nil {
			return cause
		}
		return err
	}
	sup.setKeepAlive()
	if o.ControlPlanes > 0 {
		logf("following the first control plane's certificate authorities with kube-apiserver and kube-controller-manager (the local stand-in for their static pods)")
		go followFirstControlPlane(ctx, l, filepath.Join(dir, "nodes", "cp-1"), sup, creds, logf)
	}
	fmt.Fprintf(out, "%s%s\n", ReadyPrefix, filepath.Join(dir, KubeconfigFile))
	<-ctx.Done()
	return nil
}

// startStandIns starts, for the life of ctx, what stands in for parts of a real cluster nodeops-local
// lacks: the binary source of upgrades, the kubelets' mirror pods (see MirrorPods), their
// version reporting after a kubelet restart (see runKubeletVersions) and their secret volumes (see
// SecretVolumes).
func startStandIns(ctx, startCtx context.Context, o Options, c client.Client, etcdURL string, logf func(string, ...any)) error {
	url, err := serveBinaries(ctx, o.BinDir, o.Dir)
	if err != nil {
		return err
	}
	logf("serving bin/{%s} as an upgrade binary source at %s", strings.Join(servedBinaries, ","), url)
	var cps []string
	for _, s := range NodeSpecs(o.ControlPlanes, 0, 0) {
		cps = append(cps, s.Name)
	}
	if err := WaitUntil(startCtx, pollInterval, func(ctx context.Context) (bool, error) {
		return true, syncMirrorPods(ctx, c, o.Dir, cps, etcdURL)
	}); err != nil {
		return fmt.Errorf("creating mirror pods: %w", err)
	}
	logf("mirroring the control planes' static pod manifests into kube-system (the local stand-in for their kubelets)")
	go runMirrorPods(ctx, c, o.Dir, cps, etcdURL, logf)
	go runKubeletVersions(ctx, c, o.Dir, rootedNodes(o), logf)
	if sims := simNodes(o); len(sims) > 0 && !o.NoAgents {
		logf("reporting the kubelet version a task installed and restarted on the %d simulated nodes (the local stand-in for their kubelets)", len(sims))
		go runSimKubelets(ctx, c, sims, logf)
	}
	logf("writing the secret volumes of pods on the local nodes into their roots (the local stand-in for their kubelets; it reads Secrets as the administrator)")
	go (&SecretVolumes{Client: c, Roots: nodeRoots(o)}).Run(ctx, logf)
	return nil
}

// rootedNodes names the control planes and workers, the nodes with host roots.
func rootedNodes(o Options) []string {
	var rooted []string
	for _, s := range NodeSpecs(o.ControlPlanes, o.Workers, 0) {
		rooted = append(rooted, s.Name)
	}
	return rooted
}

// simNodes names the simulated nodes, which have no root.
func simNodes(o Options) map[string]bool {
	sims := map[string]bool{}
	for _, s := range NodeSpecs(0, 0, o.SimNodes) {
		sims[s.Name] = true
	}
	return sims
}

// nodeRoots are the host roots of the rooted nodes, by node name.
func nodeRoots(o Options) map[string]string {
	roots := map[string]string{}
	for _, n := range rootedNodes(o) {
		roots[n] = filepath.Join(o.Dir, "nodes", n)
	}
	return roots
}

func bringUp(ctx context.Context, o Options, sup *supervisor, reserved *portReservations, stages []string, logf func(string, ...any)) (client.Client, clusterLayout, *credentials, error) {
	bin := o.BinDir
	ports, err := reserved.take(3)
	if err != nil {
		return nil, clusterLayout{}, nil, err
	}
	l := clusterLayout{Dir: o.Dir, EtcdClientPort: ports[0], EtcdPeerPort: ports[1], APIPort: ports[2], ComponentKubeconfig: o.ComponentKubeconfig,
		PodBound: o.AgentCredentials == CredentialsPodBound, JobMode: o.jobMode(),
		ManagerPprof: o.ManagerPprofAddress, SimAgentPprof: o.SimAgentPprofAddress}
	if o.ControlPlanes > 0 {
		caPorts, err := reserved.take(o.ControlPlanes)
		if err != nil {
			return nil, clusterLayout{}, nil, err
		}
		l.CAServerPorts = map[string]int{}
		for i, s := range NodeSpecs(o.ControlPlanes, 0, 0) {
			l.CAServerPorts[s.Name] = caPorts[i]
		}
	}
	logf("making the cluster PKI with kubeadm (apiserver on https://%s)", l.endpoint())
	if err := makeClusterPKI(ctx, bin, l, o.KubernetesVersion); err != nil {
		return nil, clusterLayout{}, nil, err
	}
	if err := writeFollowedPKI(l); err != nil {
		return nil, clusterLayout{}, nil, err
	}
	specs := NodeSpecs(o.ControlPlanes, o.Workers, o.SimNodes)

	// Node roots need only the PKI and the apiserver's address: make them while the control plane starts.
	rootsDone := make(chan error, 1)
	go func() { rootsDone <- makeNodeRoots(ctx, bin, l, specs, o.KubernetesVersion) }()

	logf("starting etcd")
	if err := sup.start("etcd", filepath.Join(bin, "etcd"), l.etcdArgs()...); err != nil {
		return nil, clusterLayout{}, nil, err
	}
	if err := WaitUntil(ctx, pollInterval, func(ctx context.Context) (bool, error) { return etcdHealthy(ctx, l) }); err != nil {
		return nil, clusterLayout{}, nil, fmt.Errorf("waiting for etcd: %w", err)
	}
	logf("starting kube-apiserver")
	if err := sup.start("kube-apiserver", filepath.Join(bin, "kube-apiserver"), l.apiserverArgs()...); err != nil {
		return nil, clusterLayout{}, nil, err
	}
	cfg, c, err := Connect(l.kubeconfig())
	if err != nil {
		return nil, clusterLayout{}, nil, err
	}
	if err := waitAPIServer(ctx, cfg); err != nil {
		return nil, clusterLayout{}, nil, err
	}
	logf("installing kubeadm's configuration and the nodeops CRDs")
	caPEM, err := os.ReadFile(l.pki("ca.crt"))
	if err != nil {
		return nil, clusterLayout{}, nil, fmt.Errorf("reading CA: %w", err)
	}
	namespaces, err := config.Namespaces()
	if err != nil {
		return nil, clusterLayout{}, nil, err
	}
	var lastErr error
	if err := WaitUntil(ctx, pollInterval, func(ctx context.Context) (bool, error) {
		// kube-system and kube-public are created by the apiserver shortly after it is ready.
		// A real install's Namespaces (config/manager): nodeops-system holds the agents' node
		// Leases (exclusion that cannot be bypassed, rule 8), nodeops-hooks the hook Jobs and
		// their signing Secret.
		objs := KubeadmObjects(o.KubernetesVersion, l.endpoint(), caPEM)
		for _, ns := range namespaces {
			objs = append(objs, ns.DeepCopy())
		}
		lastErr = createAll(ctx, c, objs)
		return lastErr == nil, nil
	}); err != nil {
		return nil, clusterLayout{}, nil, fmt.Errorf("creating kubeadm objects: %w (last try: %w)", err, lastErr)
	}
	// CoreDNS as kubeadm init installs it: kubeadm upgrade's preflight refuses a cluster without it.
	// (kube-proxy is left out: its DaemonSet would put a pod on every simulated node.)
	if err := kubeadm(ctx, bin, "init", "phase", "addon", "coredns", "--config", filepath.Join(o.Dir, "kubeadm-config.yaml"), "--kubeconfig", l.kubeconfig()); err != nil {
		return nil, clusterLayout{}, nil, err
	}
	if err := installCRDs(ctx, c); err != nil {
		return nil, clusterLayout{}, nil, err
	}
	if l.PodBound {
		logf("installing a real install's RBAC (config/manager, config/rbac, config/agent) and admission policies (config/admission)")
		if err := installRealRBACAndAdmission(ctx, cfg, c); err != nil {
			return nil, clusterLayout{}, nil, err
		}
	} else {
		// What pod commands' pods and secret holder pods run as (config/agent), which the API
		// server's ServiceAccount admission wants to exist.
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: secretholder.ServiceAccount, Namespace: SystemNamespace}}
		if err := createAll(ctx, c, []client.Object{sa}); err != nil {
			return nil, clusterLayout{}, nil, err
		}
	}
	if !o.NoManager && o.Managers > 1 {
		// The managers' Lease lives there, as in a real install (charts/nodeops, config/default).
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ManagerLeaseNamespace}}
		if err := createAll(ctx, c, []client.Object{ns}); err != nil {
			return nil, clusterLayout{}, nil, err
		}
	}
	logf("starting kube-controller-manager, kube-scheduler and kwok")
	for _, p := range []struct {
		name string
		args []string
	}{
		{"kube-controller-manager", l.controllerManagerArgs()},
		{"kube-scheduler", l.schedulerArgs()},
		{"kwok", l.kwokArgs(stages)},
	} {
		if err := sup.start(p.name, filepath.Join(bin, p.name), p.args...); err != nil {
			return nil, clusterLayout{}, nil, err
		}
	}
	logf("creating %d nodes (%d control planes, %d workers, %d simulated)", len(specs), o.ControlPlanes, o.Workers, o.SimNodes)
	if err := createNodes(ctx, c, specs, o.KubernetesVersion); err != nil {
		return nil, clusterLayout{}, nil, err
	}
	select {
	case err := <-rootsDone:
		if err != nil {
			return nil, clusterLayout{}, nil, err
		}
	case <-ctx.Done():
		return nil, clusterLayout{}, nil, ctx.Err()
	}
	logf("node roots ready in %s", filepath.Join(o.Dir, "nodes"))
	var creds *credentials
	if l.PodBound {
		var agents []string
		for _, s := range specs {
			if s.HasRoot() && !o.NoAgents && !o.jobMode() {
				agents = append(agents, s.Name)
			}
		}
		if o.jobMode() {
			logf("minting tokens: the manager's ServiceAccount now, each agent Job pod's bound to that pod when it starts (in %s)", filepath.Join(o.Dir, CredentialsDir))
		} else {
			logf("minting tokens: the manager's ServiceAccount, and each agent's bound to its stand-in pod (in %s)", filepath.Join(o.Dir, CredentialsDir))
		}
		if creds, err = newCredentials(ctx, l, cfg, c, agents, !o.NoManager); err != nil {
			return nil, clusterLayout{}, nil, err
		}
	}
	if err := startNodeops(o, l, sup, specs); err != nil {
		return nil, clusterLayout{}, nil, err
	}
	logf("waiting for %d nodes to be Ready", len(specs))
	if err := waitNodesReady(ctx, c, len(specs)); err != nil {
		return nil, clusterLayout{}, nil, err
	}
	if err := WaitUntil(ctx, pollInterval, func(ctx context.Context) (bool, error) {
		// Pods are refused until the service-account controller made the namespace's default account.
		err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "default"}, &corev1.ServiceAccount{})
		return err == nil, client.IgnoreNotFound(err)
	}); err != nil {
		return nil, clusterLayout{}, nil, fmt.Errorf("waiting for the default service account: %w", err)
	}
	return c, l, creds, nil
}

func startNodeops(o Options, l clusterLayout, sup *supervisor, specs []NodeSpec) error {
	if !o.NoManager {
		names := ManagerNames(o.Managers)
		for _, name := range names {
			if err := sup.start(name, filepath.Join(o.BinDir, "manager"), l.managerArgs(name, len(names) > 1)...); err != nil {
				return err
			}
		}
	}
	if o.NoAgents || o.jobMode() {
		return nil // in Job mode runAgentPods starts them
	}
	for _, s := range specs {
		if s.HasRoot() {
			if err := sup.start("agent-"+s.Name, filepath.Join(o.BinDir, "agent"), l.agentArgs(s.Name)...); err != nil {
				return err
			}
		}
	}
	if o.SimNodes > 0 {
		return sup.start("agent-sim", filepath.Join(o.BinDir, "agent"), l.simAgentArgs()...)
	}
	return nil
}

// makeNodeRoots builds the host roots two at a time (kubeadm is CPU-bound).
func makeNodeRoots(ctx context.Context, bin string, l clusterLayout, specs []NodeSpec, version string) error {
	sem := make(chan struct{}, 2)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, s := range specs {
		if !s.HasRoot() {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := makeNodeRoot(ctx, bin, l, s, version); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("node root %s: %w", s.Name, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// checkBinaries names every binary the options need that bin/ lacks, and returns kwok's stage files.
func checkBinaries(o Options) ([]string, error) {
	need := []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubeadm"}
	if !o.NoManager {
		need = append(need, "manager")
	}
	if !o.NoAgents && o.ControlPlanes+o.Workers+o.SimNodes > 0 {
		need = append(need, "agent")
	}
	var missing []string
	for _, n := range need {
		if st, err := os.Stat(filepath.Join(o.BinDir, n)); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, filepath.Join(o.BinDir, n))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("missing binaries: %s (run `make tools build`, or pass --no-manager/--no-agents)", strings.Join(missing, ", "))
	}
	if _, err := os.Stat(BusyboxPath); err != nil && o.ControlPlanes+o.Workers > 0 {
		return nil, fmt.Errorf("node roots need a static busybox at %s: install Debian's busybox-static (hack/install-deps.sh)", BusyboxPath)
	}
	stages, err := filepath.Glob(filepath.Join(o.BinDir, "kwok-stages", "*.yaml"))
	if err != nil || len(stages) == 0 {
		return nil, fmt.Errorf("no kwok stage configs in %s (kwok refuses to start without them; run `make tools`)", filepath.Join(o.BinDir, "kwok-stages"))
	}
	return stages, nil
}

// prepareDir creates dir, which must be absent or empty: node roots and kubeconfigs name one instance's ports.
func prepareDir(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return os.MkdirAll(dir, 0o755)
	case err != nil:
		return fmt.Errorf("reading --dir: %w", err)
	case len(entries) > 0:
		return fmt.Errorf("--dir %s is not empty; use a new directory for each instance", dir)
	}
	return nil
}

// RESTConfig loads a kubeconfig with client limits fit for hundreds of nodes.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	return cfg, nil
}

// Connect is a client of the cluster behind kubeconfig with Kubernetes', apiextensions' and
// nodeops' kinds (NewScheme), and its REST configuration for other clients.
func Connect(kubeconfig string) (*rest.Config, client.WithWatch, error) {
	cfg, err := RESTConfig(kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, nil, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, nil, fmt.Errorf("creating client: %w", err)
	}
	return cfg, c, nil
}

func etcdHealthy(ctx context.Context, l clusterLayout) (bool, error) {
	cert, err := tls.LoadX509KeyPair(l.pki("etcd/healthcheck-client.crt"), l.pki("etcd/healthcheck-client.key"))
	if err != nil {
		return false, fmt.Errorf("loading etcd client certificate: %w", err)
	}
	caPEM, err := os.ReadFile(l.pki("etcd/ca.crt"))
	if err != nil {
		return false, fmt.Errorf("reading etcd CA: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.etcdURL()+"/health", nil)
	if err != nil {
		return false, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"true"`), nil
}

func waitAPIServer(ctx context.Context, cfg *rest.Config) error {
	rc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return fmt.Errorf("building HTTP client: %w", err)
	}
	err = WaitUntil(ctx, pollInterval, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/readyz", nil)
		if err != nil {
			return false, err
		}
		resp, err := rc.Do(req)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-apiserver /readyz: %w", err)
	}
	return nil
}

func waitNodesReady(ctx context.Context, c client.Client, want int) error {
	ready := 0
	// Listing thousands of nodes is not free: poll less often the more there are.
	interval := time.Second + time.Duration(want/1000)*time.Second
	err := WaitUntil(ctx, interval, func(ctx context.Context) (bool, error) {
		var nodes corev1.NodeList
		if err := c.List(ctx, &nodes); err != nil {
			return false, err
		}
		ready = 0
		for i := range nodes.Items {
			if NodeReady(&nodes.Items[i]) {
				ready++
			}
		}
		return ready >= want, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for nodes: %d of %d Ready: %w", ready, want, err)
	}
	return nil
}

// Down stops the nodeops-local running in dir: SIGTERM to the PID in DIR/nodeops-local.pid, then
// waits until it exited (it stops its children first).
func Down(ctx context.Context, dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, PIDFile))
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no nodeops-local is running in %s (no %s)", dir, PIDFile)
	}
	if err != nil {
		return fmt.Errorf("reading pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return fmt.Errorf("bad pid file %s: %q", filepath.Join(dir, PIDFile), data)
	}
	// The PID may have been reused since: signal it only while it is still nodeops-local.
	isOurs := func() bool {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		return err == nil && strings.Contains(string(cmdline), "nodeops-local")
	}
	if !isOurs() {
		return fmt.Errorf("nodeops-local (pid %d) in %s is not running", pid, dir)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("signalling nodeops-local (pid %d): %w", pid, err)
	}
	err = WaitUntil(ctx, pollInterval, func(context.Context) (bool, error) { return !isOurs(), nil })
	if err != nil {
		return fmt.Errorf("waiting for nodeops-local (pid %d) to stop: %w", pid, err)
	}
	return nil
}
