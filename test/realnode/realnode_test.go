//go:build realnode

// Package realnode is the real-node end-to-end test: on the single-node kubeadm cluster that
// `make realnode` starts (real kubelet, containerd and runc; Kubernetes v1.36), it renews the
// certificates and upgrades the cluster to v1.37.2 through `kubectl nodeops`, then checks what an
// administrator would: versions, static pod images, kubelet, node readiness, certificates, a
// workload and the manager. Run it with `make e2e-realnode`, which also brings the node up and
// tears it down, even on failure.
package realnode

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// realnodePoll is how often the real-node test checks a condition: a real kubelet and upgrade take minutes.
const realnodePoll = 2 * time.Second

const (
	fromVersion = "v1.36.3"
	toVersion   = "v1.37.2"
	kubeconfig  = "/etc/kubernetes/admin.conf"
	apiCertFile = "/etc/kubernetes/pki/apiserver.crt"
	logDir      = "/var/lib/nodeops-realnode/logs"
	managerNS   = "nodeops-system"
	workloadNS  = "default"
	pauseImage  = "registry.k8s.io/pause:3.10.2"
)

type env struct {
	t      *testing.T
	ctx    context.Context
	c      client.Client
	disco  *discovery.DiscoveryClient
	bin    string // the checkout's bin/: kubectl, kubectl-nodeops and the v1.37.2 binaries
	node   string
	nodeIP string
}

func TestRealNodeRenewAndUpgrade(t *testing.T) {
	e := setup(t)
	t.Cleanup(func() {
		if t.Failed() {
			e.diagnose()
		}
	})

	step(t, "a workload created before the operations")
	workload := e.createWorkload()

	step(t, "renew certificates through kubectl nodeops")
	fileBefore := certNotBefore(t, framework.ParseCertificate(t, apiCertFile, []byte(framework.ReadFile(t, apiCertFile))))
	servedBefore := certNotBefore(t, e.servedCert())
	time.Sleep(2 * time.Second) // notBefore has second precision: a renewal must be seen to move it
	e.nodeops("plan", "renew-certs")
	e.operationSucceeded(e.runOperation("renew-certs"))
	fileAfterRenew := certNotBefore(t, framework.ParseCertificate(t, apiCertFile, []byte(framework.ReadFile(t, apiCertFile))))
	if !fileAfterRenew.After(fileBefore) {
		t.Fatalf("%s notBefore did not move: %s before, %s after renewCertificates", apiCertFile, fileBefore, fileAfterRenew)
	}
	t.Logf("certificates renewed: %s notBefore %s -> %s", apiCertFile, fileBefore, fileAfterRenew)

	step(t, "upgrade to "+toVersion+" through kubectl nodeops, binaries served locally")
	managerBefore := e.managerPodUID()
	// kubeadm upgrade's preflight fails on this machine's cgroup v1 unless SystemVerification is
	// skipped explicitly (kubeadm says so; the kubelet runs with failCgroupV1: false), and on the
	// CoreDNS checks, since the cluster runs without CoreDNS.
	source := e.serveBinaries()
	// The binaries are served over plain http on the node's address: allowed only when asked for.
	e.nodeops("plan", "upgrade", toVersion, "--binary-source", source, "--insecure-http")
	op := e.operationSucceeded(e.runOperation("upgrade", toVersion, "--binary-source", source, "--insecure-http",
		"--ignore-preflight-errors", "SystemVerification,CoreDNSUnsupportedPlugins,CoreDNSMigration"))

	step(t, "verify the upgraded node")
	e.verifyVersion()
	e.verifyStaticPods()
	e.verifyKubelet()
	servedAfter := certNotBefore(t, e.servedCert())
	if !servedAfter.After(servedBefore) {
		t.Errorf("the API server's served certificate notBefore did not move: %s before, %s after", servedBefore, servedAfter)
	} else {
		t.Logf("served API server certificate notBefore %s -> %s", servedBefore, servedAfter)
	}
	e.verifyWorkload(workload)
	e.verifyManager(managerBefore, op)
}

func step(t *testing.T, what string) {
	t.Helper()
	t.Logf("=== %s: %s", time.Now().Format(time.TimeOnly), what)
}

func setup(t *testing.T) *env {
	t.Helper()
	bin := os.Getenv("NODEOPS_BIN")
	if bin == "" {
		t.Fatal("NODEOPS_BIN must name the checkout's bin/ (make e2e-realnode sets it)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("no real node (run make realnode first): %v", err)
	}
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := nodeopsv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx, c: c, disco: disco, bin: bin}
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil || len(nodes.Items) != 1 {
		t.Fatalf("want exactly one node: %d, %v", len(nodes.Items), err)
	}
	e.node = nodes.Items[0].Name
	for _, a := range nodes.Items[0].Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			e.nodeIP = a.Address
		}
	}
	if v := nodes.Items[0].Status.NodeInfo.KubeletVersion; v != fromVersion {
		t.Fatalf("the node's kubelet is %s, want %s before the upgrade", v, fromVersion)
	}
	return e
}

// nodeops runs `kubectl nodeops ARGS...` as a user would, printing its output, and returns it.
func (e *env) nodeops(args ...string) string {
	e.t.Helper()
	out, code, err := e.nodeopsCode(args...)
	if err != nil || code != 0 {
		e.t.Fatalf("kubectl nodeops %s failed: exit %d %v", strings.Join(args, " "), code, err)
	}
	return out
}

func (e *env) nodeopsCode(args ...string) (string, int, error) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 25*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"nodeops"}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+e.bin+":"+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig)
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(os.Stdout, &out)
	cmd.Stderr = io.MultiWriter(os.Stdout, &out)
	start := time.Now()
	err := cmd.Run()
	e.t.Logf("kubectl nodeops %s: %v after %s", strings.Join(args, " "), errText(err), time.Since(start).Round(time.Second))
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), ee.ExitCode(), nil
	}
	return out.String(), 0, err
}

// runOperation starts an operation with `kubectl nodeops ARGS... --watch` and follows it to its
// end. The API server restarts during these operations (the node is its only control plane): the
// watch rides that out by itself, as a person's would. Any exit but 0 fails the test.
func (e *env) runOperation(args ...string) string {
	e.t.Helper()
	out, code, err := e.nodeopsCode(append(args, "--watch")...)
	if err != nil {
		e.t.Fatal(err)
	}
	m := regexp.MustCompile(`nodeoperation[^/]*/([a-z0-9.-]+) created`).FindStringSubmatch(out)
	if m == nil {
		e.t.Fatalf("kubectl nodeops %s did not say what it created", strings.Join(args, " "))
	}
	if code != 0 {
		e.t.Fatalf("operation %s did not succeed: kubectl nodeops watch exit code %d", m[1], code)
	}
	return m[1]
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// operationSucceeded requires the operation Succeeded, as the API reports it.
func (e *env) operationSucceeded(name string) *nodeopsv1.NodeOperation {
	e.t.Helper()
	op := &nodeopsv1.NodeOperation{}
	testutil.EventuallyEvery(e.t, time.Minute, realnodePoll, "reading operation "+name, func(context.Context) error {
		return e.c.Get(e.ctx, client.ObjectKey{Name: name}, op)
	})
	if op.Status.Phase != nodeopsv1.OperationSucceeded {
		e.t.Fatalf("operation %s is %s, want Succeeded", op.Name, op.Status.Phase)
	}
	return op
}

func (e *env) createWorkload() *appsv1.Deployment {
	e.t.Helper()
	labels := map[string]string{"app": "realnode-workload"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "realnode-workload", Namespace: workloadNS},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](2),
					Containers:                    []corev1.Container{{Name: "app", Image: pauseImage, ImagePullPolicy: corev1.PullNever}},
				},
			},
		},
	}
	if err := e.c.Create(e.ctx, d); err != nil {
		e.t.Fatal(err)
	}
	pod := e.waitRunningPod(workloadNS, labels, 3*time.Minute)
	e.t.Logf("workload pod %s runs (uid %s)", pod.Name, pod.UID)
	return d
}

// waitRunningPod waits for a Running, Ready pod with the labels.
func (e *env) waitRunningPod(ns string, labels map[string]string, timeout time.Duration) *corev1.Pod {
	e.t.Helper()
	var found *corev1.Pod
	testutil.EventuallyEvery(e.t, timeout, realnodePoll, fmt.Sprintf("a running pod %v in %s", labels, ns), func(context.Context) error {
		var pods corev1.PodList
		if err := e.c.List(e.ctx, &pods, client.InNamespace(ns), client.MatchingLabels(labels)); err != nil {
			return err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && podReady(p) {
				found = p
				return nil
			}
		}
		return fmt.Errorf("%d pods, none running and ready", len(pods.Items))
	})
	return found
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (e *env) managerPodUID() string {
	e.t.Helper()
	var pods corev1.PodList
	if err := e.c.List(e.ctx, &pods, client.InNamespace(managerNS)); err != nil {
		e.t.Fatal(err)
	}
	for _, p := range pods.Items {
		if isManagerPod(&p) {
			return string(p.UID)
		}
	}
	e.t.Fatal("no manager pod before the upgrade")
	return ""
}

func isManagerPod(p *corev1.Pod) bool {
	for _, r := range p.OwnerReferences {
		if r.Kind == "ReplicaSet" {
			return true
		}
	}
	return false
}

// serveBinaries serves the v1.37.2 kubeadm, kubelet and kubectl the way BinarySource names them
// ({baseURL}/{version}/bin/linux/amd64/{name} and {name}.sha256) on the node's address, where the
// agent's pod reaches it. It stops with the test.
func (e *env) serveBinaries() string {
	e.t.Helper()
	root := e.t.TempDir()
	dir := filepath.Join(root, toVersion, "bin", "linux", "amd64")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	for _, n := range []string{"kubeadm", "kubelet", "kubectl"} {
		src := filepath.Join(e.bin, n)
		versionArgs := map[string][]string{"kubeadm": {"version", "-o", "short"}, "kubelet": {"--version"}, "kubectl": {"version", "--client"}}[n]
		out, err := exec.Command(src, versionArgs...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), toVersion) {
			e.t.Fatalf("%s is not %s: %s %v", src, toVersion, out, err)
		}
		if err := os.Symlink(src, filepath.Join(dir, n)); err != nil {
			e.t.Fatal(err)
		}
		sum := framework.FileSHA256(e.t, src)
		if err := os.WriteFile(filepath.Join(dir, n+".sha256"), []byte(sum+"\n"), 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(e.nodeIP, "0"))
	if err != nil {
		e.t.Fatal(err)
	}
	srv := &http.Server{Handler: logRequests(e.t, http.FileServer(http.Dir(root))), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	e.t.Cleanup(func() { _ = srv.Close() })
	url := "http://" + ln.Addr().String()
	e.t.Logf("serving %s binaries at %s", toVersion, url)
	return url
}

func logRequests(t *testing.T, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Logf("binary server: GET %s from %s", r.URL.Path, r.RemoteAddr)
		h.ServeHTTP(w, r)
	})
}

func (e *env) verifyVersion() {
	e.t.Helper()
	testutil.EventuallyEvery(e.t, 2*time.Minute, realnodePoll, "the API server at "+toVersion, func(context.Context) error {
		v, err := e.disco.ServerVersion()
		if err != nil {
			return err
		}
		if v.GitVersion != toVersion {
			return fmt.Errorf("/version says %s", v.GitVersion)
		}
		return nil
	})
	e.t.Logf("API server /version: %s", toVersion)
}

// verifyStaticPods checks that each control-plane static pod runs the image kubeadm v1.37.2 lists.
func (e *env) verifyStaticPods() {
	e.t.Helper()
	out, err := exec.Command(filepath.Join(e.bin, "kubeadm"), "config", "images", "list", "--kubernetes-version", toVersion).Output()
	if err != nil {
		e.t.Fatalf("kubeadm config images list: %v", err)
	}
	want := map[string]string{}
	for _, ref := range strings.Fields(string(out)) {
		repo := ref[:strings.LastIndex(ref, ":")]
		want[repo[strings.LastIndex(repo, "/")+1:]] = ref
	}
	for _, comp := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		image := want[comp]
		name := comp + "-" + e.node
		testutil.EventuallyEvery(e.t, 3*time.Minute, realnodePoll, name+" running "+image, func(context.Context) error {
			var p corev1.Pod
			if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: "kube-system", Name: name}, &p); err != nil {
				return err
			}
			if got := p.Spec.Containers[0].Image; got != image {
				return fmt.Errorf("spec image %s", got)
			}
			if len(p.Status.ContainerStatuses) == 0 {
				return fmt.Errorf("no container status")
			}
			cs := p.Status.ContainerStatuses[0]
			if cs.Image != image || !cs.Ready || cs.State.Running == nil {
				return fmt.Errorf("container status image %s ready %v running %v", cs.Image, cs.Ready, cs.State.Running != nil)
			}
			return nil
		})
		e.t.Logf("%s runs %s", name, image)
	}
}

func (e *env) verifyKubelet() {
	e.t.Helper()
	testutil.EventuallyEvery(e.t, 3*time.Minute, realnodePoll, "the kubelet at "+toVersion+" and the node Ready", func(context.Context) error {
		var n corev1.Node
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: e.node}, &n); err != nil {
			return err
		}
		if v := n.Status.NodeInfo.KubeletVersion; v != toVersion {
			return fmt.Errorf("kubelet reports %s", v)
		}
		if n.Spec.Unschedulable {
			return fmt.Errorf("node still cordoned")
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("node not Ready")
	})
	out, err := exec.Command("/usr/bin/kubelet", "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), toVersion) {
		e.t.Errorf("the host's /usr/bin/kubelet is not %s: %s %v", toVersion, out, err)
	}
	e.t.Logf("node %s Ready, schedulable, kubelet %s (host binary replaced)", e.node, toVersion)
}

func (e *env) verifyWorkload(d *appsv1.Deployment) {
	e.t.Helper()
	pod := e.waitRunningPod(d.Namespace, d.Spec.Selector.MatchLabels, 3*time.Minute)
	e.t.Logf("workload runs again: pod %s (uid %s)", pod.Name, pod.UID)
}

func (e *env) verifyManager(before string, op *nodeopsv1.NodeOperation) {
	e.t.Helper()
	var pods corev1.PodList
	if err := e.c.List(e.ctx, &pods, client.InNamespace(managerNS)); err != nil {
		e.t.Fatal(err)
	}
	for _, p := range pods.Items {
		if !isManagerPod(&p) || p.DeletionTimestamp != nil {
			continue
		}
		if p.Status.Phase != corev1.PodRunning || !podReady(&p) {
			e.t.Errorf("manager pod %s is %s, not running and ready", p.Name, p.Status.Phase)
		}
		if string(p.UID) != before {
			e.t.Logf("the manager was replaced during the upgrade (drained) and came back as %s, which finished %s", p.Name, op.Name)
		} else {
			e.t.Logf("the manager pod %s ran through the upgrade and finished %s", p.Name, op.Name)
		}
		return
	}
	e.t.Error("no manager pod after the upgrade")
}

// servedCert is the certificate the API server presents now.
func (e *env) servedCert() *x509.Certificate {
	e.t.Helper()
	var cert *x509.Certificate
	testutil.EventuallyEvery(e.t, 2*time.Minute, realnodePoll, "the API server's certificate", func(context.Context) error {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", net.JoinHostPort(e.nodeIP, "6443"),
			&tls.Config{InsecureSkipVerify: true}) // only the certificate's dates are read
		if err != nil {
			return err
		}
		defer conn.Close()
		cert = conn.ConnectionState().PeerCertificates[0]
		return nil
	})
	return cert
}

func certNotBefore(_ *testing.T, c *x509.Certificate) time.Time { return c.NotBefore }

// diagnose prints what a person would look at after a failure.
func (e *env) diagnose() {
	run := func(name string, args ...string) {
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), "PATH="+e.bin+":"+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig)
		out, err := cmd.CombinedOutput()
		fmt.Printf("--- %s %s (%v)\n%s\n", name, strings.Join(args, " "), errText(err), out)
	}
	run("kubectl", "nodeops", "get")
	var ops nodeopsv1.NodeOperationList
	if err := e.c.List(context.Background(), &ops); err == nil {
		for _, op := range ops.Items {
			run("kubectl", "nodeops", "describe", op.Name)
		}
	}
	run("kubectl", "get", "nodes,pods", "-A", "-o", "wide")
	run("kubectl", "get", "nodetasks", "-o", "yaml")
	run("kubectl", "-n", managerNS, "logs", "-l", "app.kubernetes.io/name=nodeops-manager", "--tail=80", "--all-containers")
	run("kubectl", "-n", managerNS, "logs", "-l", "app.kubernetes.io/name=nodeops-agent", "--tail=80", "--all-containers")
	run("kubectl", "get", "events", "-A", "--sort-by=.lastTimestamp")
	for _, f := range []string{"supervisor.log", "kubelet.log"} {
		run("tail", "-n", "60", filepath.Join(logDir, f))
	}
}
