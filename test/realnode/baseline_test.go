//go:build realnode

package realnode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// The figures issue 30 asks for (nodeops' renewal beside the manual procedure, the upgrade beside
// kubeadm's own commands) are printed as they are measured, each line starting "realnode: ", and
// again together once every test ran. They are figures, never pass or fail: speed targets live in
// printed figures and benchmarks, not in timed tests.
var figures struct {
	sync.Mutex
	lines []string
}

// figure prints one measured figure and keeps it for the summary.
func figure(format string, args ...any) {
	line := "realnode: " + fmt.Sprintf(format, args...)
	fmt.Println(line)
	figures.Lock()
	defer figures.Unlock()
	figures.lines = append(figures.lines, line)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if len(figures.lines) > 0 {
		fmt.Println("realnode: summary of the figures measured in this run:")
		for _, l := range figures.lines {
			fmt.Println("  " + l)
		}
	}
	os.Exit(code)
}

const (
	manifestsDir = "/etc/kubernetes/manifests"
	pkiDir       = "/etc/kubernetes/pki"
	// hostKubeadm is the node's own kubeadm (v1.36.3 before the upgrade), where a person runs it.
	hostKubeadm = "/usr/bin/kubeadm"
)

// staticPodComponents are the control-plane static pods kubeadm's documentation restarts after a
// renewal, in the order nodeops' restartStaticPods restarts them.
var staticPodComponents = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// manualRenewal renews the certificates the way kubeadm's documentation ("Certificate Management
// with kubeadm", manual certificate renewal) tells a person to: `kubeadm certs renew all`, then each
// control-plane static pod restarted by moving its manifest out of /etc/kubernetes/manifests until
// the kubelet stopped it, and back until it is Ready again. Where the documentation says to wait
// the kubelet's fileCheckFrequency (20 s) each time, the script waits for what a person would check
// instead: the component's container no longer running in the container runtime (`crictl ps`; here
// containerd's own ctr, as no crictl is installed), then the mirror pod Ready with a new container
// and, for the API server, /readyz. It polls every realnodePoll, as `watch` does and as nodeops'
// agent does. Every step is checked: each certificate's notAfter moved, each component came back,
// the API server and etcd serve their renewed certificates. It returns the wall time from
// `kubeadm certs renew all` to the control plane serving the cluster admin again.
func (e *env) manualRenewal() time.Duration {
	e.t.Helper()
	before := kubeadmCertificates(e.t)
	moved := filepath.Join("/etc/kubernetes", fmt.Sprintf("manual-renewal-%d", time.Now().UnixNano()))
	if err := os.Mkdir(moved, 0o700); err != nil {
		e.t.Fatal(err)
	}
	// A failed step must not leave the node without a component: every manifest goes back.
	e.t.Cleanup(func() {
		for _, comp := range staticPodComponents {
			if _, err := os.Stat(filepath.Join(moved, comp+".yaml")); err == nil {
				if err := os.Rename(filepath.Join(moved, comp+".yaml"), filepath.Join(manifestsDir, comp+".yaml")); err != nil {
					e.t.Errorf("putting the %s manifest back: %v", comp, err)
				}
			}
		}
		_ = os.Remove(moved)
	})

	begin := time.Now()
	out, err := exec.CommandContext(e.ctx, hostKubeadm, "certs", "renew", "all").CombinedOutput()
	renewed := time.Since(begin)
	fmt.Printf("--- %s certs renew all (%s, %s)\n%s\n", hostKubeadm, errText(err), renewed.Round(time.Millisecond), out)
	if err != nil {
		e.t.Fatalf("%s certs renew all: %v", hostKubeadm, err)
	}
	after := kubeadmCertificates(e.t)
	for name, notAfter := range before {
		if !after[name].After(notAfter) {
			e.t.Errorf("%s notAfter did not move: %s before, %s after kubeadm certs renew all", name, notAfter, after[name])
		}
	}
	if e.t.Failed() {
		e.t.FailNow()
	}
	e.t.Logf("kubeadm certs renew all renewed %d certificates in %s: %s", len(before), renewed.Round(time.Millisecond), strings.Join(sortedKeys(before), ", "))

	var steps []string
	for _, comp := range staticPodComponents {
		gone, back := e.restartStaticPodByHand(comp, moved)
		steps = append(steps, fmt.Sprintf("%s stopped %s, back %s", comp, gone.Round(100*time.Millisecond), back.Round(100*time.Millisecond)))
	}
	// The operation's Succeeded promises the restarted API server serves the cluster admin (rule
	// 13): the manual procedure ends at the same point.
	served := time.Now()
	testutil.EventuallyEvery(e.t, 2*time.Minute, realnodePoll, "the cluster admin served after the manual renewal", func(context.Context) error {
		if err := e.answers("get", "--raw", "/readyz"); err != nil {
			return err
		}
		return e.answers("auth", "can-i", "list", "nodes")
	})
	wall := time.Since(begin)
	figure("renewal by hand: kubeadm certs renew all %s; %s; the cluster admin served %s later; wall %s",
		renewed.Round(100*time.Millisecond), strings.Join(steps, "; "), time.Since(served).Round(100*time.Millisecond), wall.Round(100*time.Millisecond))

	// The restarts took: the API server and etcd present the renewed certificates.
	apiFile := framework.ParseCertificate(e.t, apiCertFile, []byte(framework.ReadFile(e.t, apiCertFile)))
	if s := e.servedCert(); !s.Equal(apiFile) {
		e.t.Errorf("after the manual renewal the API server serves a certificate with notAfter %s, not the renewed %s (notAfter %s)", s.NotAfter, apiCertFile, apiFile.NotAfter)
	}
	etcdFile := filepath.Join(pkiDir, "etcd", "server.crt")
	if s, f := e.etcdServedCert(), framework.ParseCertificate(e.t, etcdFile, []byte(framework.ReadFile(e.t, etcdFile))); !s.Equal(f) {
		e.t.Errorf("after the manual renewal etcd serves a certificate with notAfter %s, not the renewed %s (notAfter %s)", s.NotAfter, etcdFile, f.NotAfter)
	}
	e.t.Logf("the API server and etcd serve their renewed certificates")
	return wall
}

// restartStaticPodByHand moves the component's manifest out, waits until the kubelet stopped its
// container, moves it back and waits until the mirror pod is Ready with a new container (and, for
// the API server, /readyz answers ok). It returns the two waits.
func (e *env) restartStaticPodByHand(comp, moved string) (gone, back time.Duration) {
	e.t.Helper()
	name := comp + "-" + e.node
	// The container a person sees running (`crictl ps`), as the mirror pod names it; the status may
	// lag a container the kubelet restarted (the API server's liveness probe fails while etcd is away).
	old := ""
	testutil.EventuallyEvery(e.t, 2*time.Minute, realnodePoll, name+" naming its running container", func(ctx context.Context) error {
		var p corev1.Pod
		if err := e.getMirrorPod(ctx, name, &p); err != nil {
			return err
		}
		if old = containerID(&p); old == "" || !e.containerRunning(old) {
			return fmt.Errorf("mirror pod names container %q, which the runtime does not run", old)
		}
		return nil
	})
	manifest := filepath.Join(manifestsDir, comp+".yaml")
	start := time.Now()
	if err := os.Rename(manifest, filepath.Join(moved, comp+".yaml")); err != nil {
		e.t.Fatal(err)
	}
	testutil.EventuallyEvery(e.t, 3*time.Minute, realnodePoll, "the kubelet stopped "+comp+" (container "+old+")", func(context.Context) error {
		if e.containerRunning(old) {
			return fmt.Errorf("container %s still running", old)
		}
		return nil
	})
	gone = time.Since(start)
	start = time.Now()
	if err := os.Rename(filepath.Join(moved, comp+".yaml"), manifest); err != nil {
		e.t.Fatal(err)
	}
	testutil.EventuallyEvery(e.t, 5*time.Minute, realnodePoll, name+" Ready again with a new container", func(ctx context.Context) error {
		var p corev1.Pod
		if err := e.getMirrorPod(ctx, name, &p); err != nil {
			return err
		}
		if id := containerID(&p); id == "" || id == old || !podReady(&p) || p.Status.ContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("container %q ready %v", id, podReady(&p))
		}
		if comp == "kube-apiserver" {
			return e.answers("get", "--raw", "/readyz")
		}
		return nil
	})
	back = time.Since(start)
	e.t.Logf("by hand: %s stopped %s after its manifest moved out, Ready again %s after it moved back", comp, gone.Round(100*time.Millisecond), back.Round(100*time.Millisecond))
	return gone, back
}

// getMirrorPod reads the mirror pod with a short deadline: while etcd is away the API server holds a
// read until its own timeout, and the scripted person looks again instead.
func (e *env) getMirrorPod(ctx context.Context, name string, p *corev1.Pod) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return e.c.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: name}, p)
}

// answers is nil when `kubectl ARGS...` (/readyz, or auth can-i) answers as a served control plane
// does: ok, or yes.
func (e *env) answers(args ...string) error {
	out, err := e.kubectlOnce(args...)
	if err != nil {
		return fmt.Errorf("kubectl %s: %w", strings.Join(args, " "), err)
	}
	if out != "ok" && out != "yes" {
		return fmt.Errorf("kubectl %s answered %q", strings.Join(args, " "), out)
	}
	return nil
}

// containerID is the runtime's ID of the pod's first container ("" when none is reported).
func containerID(p *corev1.Pod) string {
	if len(p.Status.ContainerStatuses) == 0 {
		return ""
	}
	_, id, _ := strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://")
	return id
}

// containerRunning says whether containerd runs the container's task, as `ctr tasks ls` lists it
// (the container ID is its task's ID).
func (e *env) containerRunning(id string) bool {
	e.t.Helper()
	out, err := exec.CommandContext(e.ctx, ctrBinary, "--address", containerdSocket, "-n", "k8s.io", "tasks", "ls").Output()
	if err != nil {
		e.t.Fatalf("ctr tasks ls: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == id {
			return f[2] == "RUNNING"
		}
	}
	return false
}

// kubeadmCertificates is the notAfter of every certificate `kubeadm certs renew all` renews: each
// leaf certificate under /etc/kubernetes/pki and each client certificate embedded in a kubeconfig
// in /etc/kubernetes (kubelet.conf names the kubelet's own rotated file instead, which kubeadm does
// not renew). It fails the test when one that kubeadm renews is missing.
func kubeadmCertificates(t *testing.T) map[string]time.Time {
	t.Helper()
	certs := map[string]time.Time{}
	for _, pattern := range []string{pkiDir + "/*.crt", pkiDir + "/etcd/*.crt"} {
		files, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if c := framework.ParseCertificate(t, f, []byte(framework.ReadFile(t, f))); !c.IsCA {
				certs[strings.TrimPrefix(f, pkiDir+"/")] = c.NotAfter
			}
		}
	}
	confs, err := filepath.Glob("/etc/kubernetes/*.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range confs {
		cfg, err := clientcmd.LoadFromFile(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, a := range cfg.AuthInfos {
			if len(a.ClientCertificateData) > 0 {
				certs[filepath.Base(f)] = framework.ParseCertificate(t, f, a.ClientCertificateData).NotAfter
			}
		}
	}
	for _, want := range []string{"apiserver.crt", "apiserver-etcd-client.crt", "apiserver-kubelet-client.crt", "front-proxy-client.crt",
		"etcd/healthcheck-client.crt", "etcd/peer.crt", "etcd/server.crt", "admin.conf", "controller-manager.conf", "scheduler.conf"} {
		if _, ok := certs[want]; !ok {
			t.Fatalf("no %s among the node's certificates %v", want, sortedKeys(certs))
		}
	}
	return certs
}

func sortedKeys(m map[string]time.Time) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// etcdServedCert is the certificate etcd presents on the node's client port, reached as the API
// server reaches it (with apiserver-etcd-client).
func (e *env) etcdServedCert() *x509.Certificate {
	e.t.Helper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(pkiDir, "apiserver-etcd-client.crt"), filepath.Join(pkiDir, "apiserver-etcd-client.key"))
	if err != nil {
		e.t.Fatal(err)
	}
	var cert *x509.Certificate
	testutil.EventuallyEvery(e.t, 2*time.Minute, realnodePoll, "etcd's certificate", func(context.Context) error {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", net.JoinHostPort(e.nodeIP, "2379"),
			&tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true}) // only the certificate is compared
		if err != nil {
			return err
		}
		defer conn.Close()
		cert = conn.ConnectionState().PeerCertificates[0]
		return nil
	})
	return cert
}

// timeBreakdown prints where an operation's wall time, from begin to end, went: every command the
// node ran, in order, with the gap since the previous one ended (or since begin), the time it took,
// the part its own work ran and its waits by kind (status.commands[].waits); then the totals. It
// returns the spans the figures name: kubeadm's commands, and each restart until healthy again.
func (e *env) timeBreakdown(what, op string, begin, end time.Time) spans {
	e.t.Helper()
	var tasks nodeopsv1.NodeTaskList
	if err := e.c.List(e.ctx, &tasks, client.MatchingLabels{nodeopsv1.LabelOperation: op}); err != nil {
		e.t.Fatal(err)
	}
	type row struct {
		node, kind string
		start, end time.Time
		waits      []nodeopsv1.CommandWait
	}
	var rows []row
	for _, t := range tasks.Items {
		for i, c := range t.Status.Commands {
			if c.StartTime == nil || c.CompletionTime == nil {
				continue
			}
			kind := c.Name
			if i < len(t.Spec.Commands) {
				kind = t.Spec.Commands[i].Kind()
				if n := t.Spec.Commands[i].DisplayName(); n != kind {
					kind += " (" + n + ")"
				}
			}
			rows = append(rows, row{node: t.Spec.NodeName, kind: kind, start: c.StartTime.Time, end: c.CompletionTime.Time, waits: c.Waits})
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].start.Before(rows[j].start) })

	var b strings.Builder
	fmt.Fprintf(&b, "realnode: %s %s, time per command in the order the node ran them (gap: since the previous command ended, or since the operation was asked for):\n", what, op)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  NODE\tCOMMAND\tGAP\tTOOK\tRAN\tWAITED FOR")
	prev := begin
	var gaps, took, ran time.Duration
	var out spans
	waited := map[nodeopsv1.WaitFor]time.Duration{}
	restarted := map[string]time.Time{}
	for _, r := range rows {
		gap := max(r.start.Sub(prev), 0)
		d := r.end.Sub(r.start)
		var w time.Duration
		var each []string
		for _, x := range r.waits {
			w += x.Duration.Duration
			waited[x.For] += x.Duration.Duration
			each = append(each, fmt.Sprintf("%s %s", x.For, x.Duration.Round(100*time.Millisecond)))
		}
		w = min(w, d)
		gaps, took, ran = gaps+gap, took+d, ran+d-w
		if strings.HasPrefix(r.kind, "kubeadm") {
			out.kubeadm += d
		}
		if strings.HasPrefix(r.kind, "restartService") {
			restarted[r.node] = r.start
		} else if at, ok := restarted[r.node]; ok && strings.HasPrefix(r.kind, "waitNodeReady") {
			out.restartToHealthy += r.end.Sub(at)
			delete(restarted, r.node)
		}
		if len(each) == 0 {
			each = []string{"-"}
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", r.node, r.kind, gap.Round(time.Millisecond), d.Round(time.Millisecond), (d - w).Round(time.Millisecond), strings.Join(each, ", "))
		if r.end.After(prev) {
			prev = r.end
		}
	}
	_ = tw.Flush()
	var kinds []string
	for f, d := range waited {
		kinds = append(kinds, fmt.Sprintf("%s %s", f, d.Round(100*time.Millisecond)))
	}
	sort.Strings(kinds)
	fmt.Fprintf(&b, "  wall %s = gaps %s + commands %s (their work %s; waits %s) + after the last command until the watch saw Succeeded %s\n",
		end.Sub(begin).Round(100*time.Millisecond), gaps.Round(100*time.Millisecond), took.Round(100*time.Millisecond), ran.Round(100*time.Millisecond),
		orNone(strings.Join(kinds, ", ")), max(end.Sub(prev), 0).Round(100*time.Millisecond))
	fmt.Print(b.String())
	out.lastEnd = prev
	return out
}

// spans are parts of an operation's wall time, summed over its nodes.
type spans struct {
	// kubeadm is the time kubeadm's own commands took.
	kubeadm time.Duration
	// restartToHealthy runs from a restartService's start to the end of the waitNodeReady after it:
	// the restarted kubelet starting the control plane again (on a new minor version, every static
	// pod under a new name) and the components becoming ready, with nodeops' restart and checks.
	restartToHealthy time.Duration
	// lastEnd is when the operation's last command ended, on the node's clock.
	lastEnd time.Time
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
