//go:build realnode

package realnode

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// authorityFiles are the three certificate authorities under /etc/kubernetes/pki, as kubeadm's
// `certs check-expiration` names them.
var authorityFiles = []struct{ file, kubeadmName string }{
	{"ca.crt", "ca"}, {"etcd/ca.crt", "etcd-ca"}, {"front-proxy-ca.crt", "front-proxy-ca"},
}

// rotationPhases are the rotation's four phases, each the groups whose names start with its prefix.
var rotationPhases = []struct{ name, prefix string }{
	{"prepare", "ca-prepare-"}, {"trust-both", "ca-trust-both-"}, {"re-issue", "ca-reissue-"}, {"complete", "ca-complete-"},
}

// TestRealNode6RotateCertificateAuthorities is issue 29's must-show on the real node: a
// rotateCertificateAuthorities NodeOperation (all three authorities, the service-account key,
// completion Manual) runs through the manager and agent the chart installed; the test approves the
// gate complete-rotation once the operation waits at it, as `kubectl nodeops approve` does. Then
// every certificate under /etc/kubernetes/pki and every kubeconfig's client certificate chains to
// the new authorities and none to the old, the API server serves a certificate of the new CA, the
// new admin.conf is served and the old one refused, a ServiceAccount token minted before is
// accepted until phase complete and refused after, the node is Ready, workloads run, nodeops'
// pods ran through, and the host's `kubeadm certs check-expiration` shows the new authorities'
// expiry. It runs after the other scenarios (it changes the node's authorities) and needs nothing
// they leave.
func TestRealNode6RotateCertificateAuthorities(t *testing.T) {
	e := setup(t)
	e.rotateCertificateAuthorities()
}

func (e *env) rotateCertificateAuthorities() {
	t := e.t
	t.Helper()
	step(t, "before the rotation: the old authorities, admin.conf, a token, a workload, nodeops' pods")
	oldCAs := readAuthorities(t)
	oldSAPub := framework.ReadFile(t, filepath.Join(pkiDir, "sa.pub"))
	oldAdmin := filepath.Join(t.TempDir(), "admin.conf")
	if err := os.WriteFile(oldAdmin, []byte(framework.ReadFile(t, kubeconfig)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.clientCertificateAccepted(oldAdmin); err != nil {
		t.Fatalf("before the rotation the admin's client certificate is refused: %v", err)
	}
	token := e.serviceAccountToken()
	if err := e.tokenAccepted(token); err != nil {
		t.Fatalf("a ServiceAccount token minted just now is refused: %v", err)
	}
	ranThrough := e.rotationWorkload()
	nodeopsBefore := e.nodeopsPods()

	step(t, "the rotation, completion Manual")
	begin := time.Now()
	op := e.createOperation("rotate-cas-", nodeopsv1.NodeOperationSpec{
		RotateCertificateAuthorities: &nodeopsv1.RotateCertificateAuthoritiesOperation{
			Authorities:       []string{nodeopsv1.AuthorityCluster, nodeopsv1.AuthorityEtcd, nodeopsv1.AuthorityFrontProxy},
			ServiceAccountKey: true,
			Completion:        nodeopsv1.CompletionManual,
		}})
	e.followRotation(op, 25*time.Minute, func(got *nodeopsv1.NodeOperation) error {
		if got.Status.Phase.Finished() || got.Status.Phase == nodeopsv1.OperationBlocked {
			return fmt.Errorf("%w: %s before the gate %s", errStop, got.Status.Phase, plan.GateCompleteRotation)
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, nodeopsv1.ConditionProgressing); c != nil &&
			c.Reason == nodeoperation.ReasonWaitingForGate && strings.Contains(c.Message, plan.GateCompleteRotation) {
			return nil
		}
		return errors.New("not at the gate")
	})
	atGate := time.Now()
	e.t.Logf("the rotation waits at gate %s after %s", plan.GateCompleteRotation, atGate.Sub(begin).Round(100*time.Millisecond))

	// What a person checks before approving: everything still trusts the old authorities too.
	if err := e.tokenAccepted(token); err != nil {
		t.Errorf("at the gate, the token minted before the rotation is refused: %v", err)
	}
	if err := e.clientCertificateAccepted(oldAdmin); err != nil {
		t.Errorf("at the gate, the old admin.conf's client certificate is refused: %v", err)
	}
	if out, err := e.kubectlOnce("get", "nodes"); err != nil {
		t.Errorf("at the gate, kubectl with the re-issued admin.conf: %v\n%s", err, out)
	}
	approved := time.Now()
	e.nodeops("approve", op, "--gate", plan.GateCompleteRotation)
	e.followRotation(op, 20*time.Minute, func(got *nodeopsv1.NodeOperation) error {
		switch got.Status.Phase {
		case nodeopsv1.OperationSucceeded:
			return nil
		case nodeopsv1.OperationBlocked, nodeopsv1.OperationFailed, nodeopsv1.OperationAborted:
			return fmt.Errorf("%w: %s", errStop, got.Status.Phase)
		}
		return fmt.Errorf("phase %s", got.Status.Phase)
	})
	end := time.Now()
	e.controlPlaneServesAtOnce("the rotation " + op + " Succeeded")
	e.nodeops("describe", op)
	e.timeBreakdown("rotation", op, begin, end)
	e.rotationFigures(op, begin, end, approved.Sub(atGate))
	e.restartsFollowedTheKubelet(op)

	step(t, "after the rotation")
	newCAs := readAuthorities(t)
	for name, c := range newCAs {
		if c.Equal(oldCAs[name]) {
			t.Errorf("%s is still the old authority after the rotation", name)
		}
	}
	if framework.ReadFile(t, filepath.Join(pkiDir, "sa.pub")) == oldSAPub {
		t.Errorf("%s is still the old service-account key after the rotation", filepath.Join(pkiDir, "sa.pub"))
	}
	if _, err := os.Stat("/etc/kubernetes/pki-rotation"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the staging directory /etc/kubernetes/pki-rotation is left: %v", err)
	}
	e.certificatesChainToNew(oldCAs, newCAs)
	e.servesNewCA(oldCAs, newCAs)
	if out, err := e.kubectlOnce("get", "nodes"); err != nil {
		t.Errorf("kubectl with the new %s: %v\n%s", kubeconfig, err, out)
	} else {
		t.Logf("kubectl get nodes with the new %s:\n%s", kubeconfig, out)
	}
	e.oldAdminRefused(oldAdmin)
	if err := e.tokenAccepted(token); !apierrors.IsUnauthorized(err) {
		t.Errorf("after phase complete the token minted before the rotation: %v, want 401 Unauthorized", err)
	} else {
		t.Logf("the ServiceAccount token minted before the rotation is refused: %v", err)
	}
	if err := e.tokenAccepted(e.serviceAccountToken()); err != nil {
		t.Errorf("a token minted after the rotation is refused: %v", err)
	}
	e.rootCAConfigMapHoldsNewOnly(oldCAs["ca.crt"], newCAs["ca.crt"])
	e.nodeReady()
	e.workloadsRun(ranThrough)
	e.nodeopsRanThrough(nodeopsBefore)
	e.checkExpirationShows(oldCAs, newCAs)
}

// errStop ends followRotation at once: waiting longer cannot help.
var errStop = errors.New("stopped")

// followRotation polls the operation until done says yes, logging each change of its phase and
// Progressing condition. Each poll reads through a client made again from the node's admin.conf:
// the rotation re-issues that file and changes the certificate authority the API server's serving
// certificate chains to, so a client that read the file before trusts a server that is gone.
func (e *env) followRotation(op string, timeout time.Duration, done func(*nodeopsv1.NodeOperation) error) {
	e.t.Helper()
	last := ""
	testutil.EventuallyEvery(e.t, timeout, realnodePoll, "operation "+op, func(ctx context.Context) error {
		if err := e.reconnect(); err != nil {
			return err
		}
		got := &nodeopsv1.NodeOperation{}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := e.c.Get(rctx, client.ObjectKey{Name: op}, got); err != nil {
			return err
		}
		now := string(got.Status.Phase)
		if c := meta.FindStatusCondition(got.Status.Conditions, nodeopsv1.ConditionProgressing); c != nil {
			now += " " + c.Reason + ": " + c.Message
		}
		if now != last {
			e.t.Logf("%s: %s", op, now)
			last = now
		}
		err := done(got)
		if errors.Is(err, errStop) {
			e.t.Fatalf("operation %s: %v", op, err)
		}
		return err
	})
}

// reconnect makes the test's client again from the node's admin.conf as it is now.
func (e *env) reconnect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: e.c.Scheme()})
	if err != nil {
		return err
	}
	e.c = c
	return nil
}

// rotationFigures prints the rotation's wall time and each phase's: from its first task's start
// to its last task's end, as the tasks' status records them. The gate's wait is the test's own
// checks before approving.
func (e *env) rotationFigures(op string, begin, end time.Time, gate time.Duration) {
	e.t.Helper()
	var tasks nodeopsv1.NodeTaskList
	if err := e.c.List(e.ctx, &tasks, client.MatchingLabels{nodeopsv1.LabelOperation: op}); err != nil {
		e.t.Fatal(err)
	}
	var phases []string
	for _, p := range rotationPhases {
		var first, last time.Time
		var groups []string
		for _, task := range tasks.Items {
			if !strings.HasPrefix(task.Spec.Group, p.prefix) || task.Status.StartTime == nil || task.Status.CompletionTime == nil {
				continue
			}
			groups = append(groups, task.Spec.Group)
			if s := task.Status.StartTime.Time; first.IsZero() || s.Before(first) {
				first = s
			}
			if c := task.Status.CompletionTime.Time; c.After(last) {
				last = c
			}
		}
		if first.IsZero() {
			e.t.Errorf("phase %s of %s ran no task", p.name, op)
			continue
		}
		sort.Strings(groups)
		phases = append(phases, fmt.Sprintf("%s %s (%s)", p.name, last.Sub(first).Round(100*time.Millisecond), strings.Join(groups, ", ")))
	}
	wall := end.Sub(begin)
	figure("rotation of the three authorities and the service-account key on one control plane: wall %s, of which %s at the gate %s while the test checked; phases: %s",
		wall.Round(100*time.Millisecond), gate.Round(100*time.Millisecond), plan.GateCompleteRotation, strings.Join(phases, "; "))
}

// restartsFollowedTheKubelet: on this v1.37 kubelet, which serves its Pods API, every
// restartStaticPods of the rotation followed the static pods through the kubelet's own answers
// (not the mirror pods, which lag the containers by minutes after the API server restarted).
func (e *env) restartsFollowedTheKubelet(op string) {
	e.t.Helper()
	var tasks nodeopsv1.NodeTaskList
	if err := e.c.List(e.ctx, &tasks, client.MatchingLabels{nodeopsv1.LabelOperation: op}); err != nil {
		e.t.Fatal(err)
	}
	restarts := 0
	for _, task := range tasks.Items {
		for i, c := range task.Status.Commands {
			if i >= len(task.Spec.Commands) || task.Spec.Commands[i].RestartStaticPods == nil {
				continue
			}
			restarts++
			if !strings.HasSuffix(c.Message, "followed through the kubelet's Pods API") {
				e.t.Errorf("task %s, command %d (restartStaticPods) did not follow the static pods through the kubelet's Pods API: %q; its output:\n%s", task.Name, i+1, c.Message, c.OutputTail)
			}
		}
	}
	if restarts == 0 {
		e.t.Errorf("the rotation %s ran no restartStaticPods", op)
	}
	e.t.Logf("%d restartStaticPods of the rotation followed the static pods through the kubelet's Pods API", restarts)
}

// readAuthorities reads the three authorities' certificates under /etc/kubernetes/pki, by file.
func readAuthorities(t *testing.T) map[string]*x509.Certificate {
	t.Helper()
	out := map[string]*x509.Certificate{}
	for _, a := range authorityFiles {
		p := filepath.Join(pkiDir, a.file)
		out[a.file] = framework.ParseCertificate(t, p, []byte(framework.ReadFile(t, p)))
	}
	return out
}

func pool(cas map[string]*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range cas {
		p.AddCert(c)
	}
	return p
}

// chainsTo is nil when c verifies against the authorities (any key usage: server, client, peer).
func chainsTo(c *x509.Certificate, cas map[string]*x509.Certificate) error {
	_, err := c.Verify(x509.VerifyOptions{Roots: pool(cas), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

// certificatesChainToNew: every certificate under /etc/kubernetes/pki and every kubeconfig's client
// certificate (the kubelet's through the file kubelet.conf names) chains to the new authorities and
// to none of the old; every kubeconfig trusts the new cluster CA alone.
func (e *env) certificatesChainToNew(oldCAs, newCAs map[string]*x509.Certificate) {
	t := e.t
	t.Helper()
	certs := map[string]*x509.Certificate{}
	err := filepath.WalkDir(pkiDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".crt") {
			return err
		}
		certs[p] = framework.ParseCertificate(t, p, []byte(framework.ReadFile(t, p)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	confs := []string{"admin.conf", "super-admin.conf", "controller-manager.conf", "scheduler.conf", "kubelet.conf"}
	for _, name := range confs {
		p := filepath.Join("/etc/kubernetes", name)
		cfg, err := clientcmd.LoadFromFile(p)
		if errors.Is(err, fs.ErrNotExist) && name == "super-admin.conf" {
			continue // kubeadm before v1.29, or a control plane joined later, has none
		}
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		for _, a := range cfg.AuthInfos {
			data, from := a.ClientCertificateData, p
			if len(data) == 0 && a.ClientCertificate != "" {
				from = a.ClientCertificate // kubelet.conf: kubelet-client-current.pem
				data = []byte(framework.ReadFile(t, from))
			}
			if len(data) == 0 {
				t.Errorf("%s has no client certificate", p)
				continue
			}
			certs[p+" ("+from+")"] = framework.ParseCertificate(t, from, data)
		}
		for cl, c := range cfg.Clusters {
			trusted := framework.ParseCertificate(t, p, c.CertificateAuthorityData)
			if n := bytes.Count(c.CertificateAuthorityData, []byte("BEGIN CERTIFICATE")); n != 1 || !trusted.Equal(newCAs["ca.crt"]) {
				t.Errorf("%s: cluster %s trusts %d certificates, first %s; want the new cluster CA alone", p, cl, n, trusted.Subject)
			}
		}
	}
	names := make([]string, 0, len(certs))
	for n := range certs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c := certs[n]
		if err := chainsTo(c, newCAs); err != nil {
			t.Errorf("%s (subject %s, issuer %s) does not chain to the new authorities: %v", n, c.Subject, c.Issuer, err)
		}
		if chainsTo(c, oldCAs) == nil {
			t.Errorf("%s (subject %s) still chains to the old authority %s", n, c.Subject, c.Issuer)
		}
	}
	t.Logf("%d certificates chain to the new authorities and none to the old: %s", len(names), strings.Join(names, ", "))
}

// servesNewCA: the API server's certificate, as served on its port, is the new CA's: a handshake
// trusting only the new authorities succeeds, one trusting only the old fails.
func (e *env) servesNewCA(oldCAs, newCAs map[string]*x509.Certificate) {
	e.t.Helper()
	handshake := func(cas map[string]*x509.Certificate) (*x509.Certificate, error) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", net.JoinHostPort(e.nodeIP, "6443"),
			&tls.Config{RootCAs: pool(cas), ServerName: e.nodeIP})
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0], nil
	}
	served, err := handshake(map[string]*x509.Certificate{"ca.crt": newCAs["ca.crt"]})
	if err != nil {
		e.t.Errorf("a TLS handshake with the API server trusting the new cluster CA alone: %v", err)
		return
	}
	if _, err := handshake(map[string]*x509.Certificate{"ca.crt": oldCAs["ca.crt"]}); err == nil {
		e.t.Errorf("a TLS handshake with the API server trusting the old cluster CA alone succeeded")
	} else {
		e.t.Logf("the API server serves %s issued by %s (serial %s, notAfter %s): verified by the new CA; the old CA refuses it: %v",
			served.Subject, served.Issuer, served.SerialNumber, served.NotAfter, err)
	}
}

// oldAdminRefused: kubectl with the admin.conf saved before the rotation fails, and its client
// certificate, shown to the API server without checking the server, is refused (401).
func (e *env) oldAdminRefused(oldAdmin string) {
	e.t.Helper()
	cmd := exec.CommandContext(e.ctx, filepath.Join(e.bin, "kubectl"), "--request-timeout=10s", "--kubeconfig", oldAdmin, "get", "nodes")
	if out, err := cmd.CombinedOutput(); err == nil {
		e.t.Errorf("kubectl with the admin.conf saved before the rotation works:\n%s", out)
	} else {
		e.t.Logf("kubectl with the admin.conf saved before the rotation: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := e.clientCertificateAccepted(oldAdmin); !apierrors.IsUnauthorized(err) {
		e.t.Errorf("the old admin.conf's client certificate: %v, want 401 Unauthorized", err)
	} else {
		e.t.Logf("the old admin.conf's client certificate, shown to the API server: %v", err)
	}
}

// clientCertificateAccepted asks the API server who the kubeconfig's client certificate is (a
// SelfSubjectReview), without checking the server's certificate: the answer is the server's verdict
// on the client certificate alone.
func (e *env) clientCertificateAccepted(kubeconfigPath string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigPath)
	if err != nil {
		return err
	}
	cfg.TLSClientConfig.CAData, cfg.TLSClientConfig.CAFile = nil, ""
	cfg.TLSClientConfig.Insecure = true // only the client certificate is under test here
	return e.whoAmI(cfg)
}

// tokenAccepted asks the API server who the token is, trusting the server as admin.conf does now.
func (e *env) tokenAccepted(token string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg = rest.AnonymousClientConfig(cfg)
	cfg.BearerToken = token
	return e.whoAmI(cfg)
}

func (e *env) whoAmI(cfg *rest.Config) error {
	cfg.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(e.ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	e.t.Logf("the API server knows the credentials as %s", r.Status.UserInfo.Username)
	return nil
}

// serviceAccountToken mints a token for a new ServiceAccount (TokenRequest), as any client of a
// ServiceAccount gets one.
func (e *env) serviceAccountToken() string {
	e.t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{GenerateName: "realnode-rotation-", Namespace: workloadNS}}
	if err := e.c.Create(e.ctx, sa); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = e.c.Delete(context.Background(), sa) })
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if err := e.c.SubResource("token").Create(e.ctx, sa, tr); err != nil {
		e.t.Fatalf("TokenRequest for %s/%s: %v", sa.Namespace, sa.Name, err)
	}
	return tr.Status.Token
}

// rotationWorkload starts a Deployment whose pod must run through the rotation.
func (e *env) rotationWorkload() *corev1.Pod {
	e.t.Helper()
	d := pauseDeployment(fmt.Sprintf("realnode-rotation-%d", time.Now().Unix()))
	if err := e.c.Create(e.ctx, d); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = e.c.Delete(context.Background(), d) })
	return e.waitRunningPod(workloadNS, d.Spec.Selector.MatchLabels, 3*time.Minute)
}

// workloadsRun: the pod started before the rotation still runs, the same pod with no restart, and a
// new pod starts and runs.
func (e *env) workloadsRun(before *corev1.Pod) {
	e.t.Helper()
	now := &corev1.Pod{}
	if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(before), now); err != nil {
		e.t.Errorf("the workload pod %s started before the rotation: %v", before.Name, err)
	} else if now.UID != before.UID || now.Status.Phase != corev1.PodRunning || !podReady(now) || restarts(now) != 0 {
		e.t.Errorf("the workload pod %s: uid %s (before %s), %s, ready %v, restarts %d; want the same pod running through",
			now.Name, now.UID, before.UID, now.Status.Phase, podReady(now), restarts(now))
	} else {
		e.t.Logf("the workload pod %s (uid %s) ran through the rotation without a restart", now.Name, now.UID)
	}
	labels := map[string]string{"app": fmt.Sprintf("realnode-after-rotation-%d", time.Now().Unix())}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: labels["app"], Namespace: workloadNS, Labels: labels},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](2),
			Containers:                    []corev1.Container{{Name: "app", Image: pauseImage, ImagePullPolicy: corev1.PullNever}},
		},
	}
	if err := e.c.Create(e.ctx, pod); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = e.c.Delete(context.Background(), pod) })
	p := e.waitRunningPod(workloadNS, labels, 3*time.Minute)
	e.t.Logf("a pod created after the rotation runs: %s on %s", p.Name, p.Spec.NodeName)
}

func restarts(p *corev1.Pod) int32 {
	if len(p.Status.ContainerStatuses) == 0 {
		return -1
	}
	return p.Status.ContainerStatuses[0].RestartCount
}

// rootCAConfigMapHoldsNewOnly: what pods mount as their cluster CA is the new CA alone.
func (e *env) rootCAConfigMapHoldsNewOnly(oldCA, newCA *x509.Certificate) {
	e.t.Helper()
	var cm corev1.ConfigMap
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: managerNS, Name: "kube-root-ca.crt"}, &cm); err != nil {
		e.t.Fatal(err)
	}
	data := []byte(cm.Data["ca.crt"])
	c := framework.ParseCertificate(e.t, "kube-root-ca.crt", data)
	if bytes.Count(data, []byte("BEGIN CERTIFICATE")) != 1 || !c.Equal(newCA) || c.Equal(oldCA) {
		e.t.Errorf("%s/kube-root-ca.crt does not hold the new CA alone:\n%s", managerNS, data)
	}
}

func (e *env) nodeReady() {
	e.t.Helper()
	testutil.EventuallyEvery(e.t, 2*time.Minute, realnodePoll, "node "+e.node+" Ready", func(ctx context.Context) error {
		var n corev1.Node
		if err := e.c.Get(ctx, client.ObjectKey{Name: e.node}, &n); err != nil {
			return err
		}
		if !plan.NodeReady(&n) {
			return fmt.Errorf("node %s not Ready", e.node)
		}
		return nil
	})
	e.t.Logf("node %s is Ready", e.node)
}

// nodeopsPod is what the test compares of a manager or agent pod before and after.
type nodeopsPod struct {
	name, uid string
	restarts  int32
}

// nodeopsPods are the manager's and the agent's pods, by their app.kubernetes.io/name.
func (e *env) nodeopsPods() map[string]nodeopsPod {
	e.t.Helper()
	out := map[string]nodeopsPod{}
	for _, app := range []string{"nodeops-manager", "nodeops-agent"} {
		p := e.waitRunningPod(managerNS, map[string]string{"app.kubernetes.io/name": app}, 3*time.Minute)
		out[app] = nodeopsPod{name: p.Name, uid: string(p.UID), restarts: restarts(p)}
	}
	return out
}

// nodeopsRanThrough: the manager's and the agent's pods are the same as before, running; it prints
// their restart counts, with the last termination's reason when a container restarted, and what
// their logs say about TLS and authentication errors during the rotation.
func (e *env) nodeopsRanThrough(before map[string]nodeopsPod) {
	e.t.Helper()
	for app, b := range before {
		var p corev1.Pod
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: managerNS, Name: b.name}, &p); err != nil {
			e.t.Errorf("%s pod %s after the rotation: %v", app, b.name, err)
			continue
		}
		if string(p.UID) != b.uid {
			e.t.Errorf("%s pod %s was replaced: uid %s, before %s", app, p.Name, p.UID, b.uid)
		}
		if p.Status.Phase != corev1.PodRunning || !podReady(&p) || len(p.Status.ContainerStatuses) == 0 {
			e.t.Errorf("%s pod %s is %s, ready %v after the rotation", app, p.Name, p.Status.Phase, podReady(&p))
			continue
		}
		cs := p.Status.ContainerStatuses[0]
		why := ""
		if t := cs.LastTerminationState.Terminated; t != nil && cs.RestartCount > b.restarts {
			why = fmt.Sprintf("; last termination: %s, exit code %d at %s: %s", t.Reason, t.ExitCode, t.FinishedAt.UTC().Format(time.TimeOnly), strings.TrimSpace(t.Message))
		}
		logs, _ := e.kubectlOnce("-n", managerNS, "logs", p.Name)
		figure("rotation: %s pod %s (same uid) restartCount %d before, %d after%s; its log since its start: %s",
			app, p.Name, b.restarts, cs.RestartCount, why, logErrors(logs))
	}
}

// logErrors counts a log's lines about TLS trust, authentication and starting again in place.
func logErrors(logs string) string {
	kinds := []struct{ what, pattern string }{
		{"x509 errors", `x509: `},
		{"401 Unauthorized", `Unauthorized`},
		{"starts in place after a lost Lease", `starting again in place`},
	}
	var parts []string
	lines := strings.Split(logs, "\n")
	for _, k := range kinds {
		re := regexp.MustCompile(k.pattern)
		n, first, last := 0, "", ""
		for _, l := range lines {
			if re.MatchString(l) {
				n++
				if first == "" {
					first = logTime(l)
				}
				if t := logTime(l); t != "" {
					last = t
				}
			}
		}
		switch {
		case n > 0 && first != "":
			parts = append(parts, fmt.Sprintf("%d lines with %s (%s to %s)", n, k.what, first, last))
		case n > 0:
			parts = append(parts, fmt.Sprintf("%d lines with %s", n, k.what))
		default:
			parts = append(parts, "no "+k.what)
		}
	}
	return strings.Join(parts, ", ")
}

var logTimeRE = regexp.MustCompile(`\d{4}-\d\d-\d\dT(\d\d:\d\d:\d\d)`)

// logTime is a log line's time of day, "" for a line without one (the manager's own stderr lines).
func logTime(line string) string {
	if m := logTimeRE.FindStringSubmatch(line); m != nil {
		return m[1]
	}
	return ""
}

// checkExpirationShows: the host's `kubeadm certs check-expiration` lists each authority with the
// new certificate's expiry.
func (e *env) checkExpirationShows(oldCAs, newCAs map[string]*x509.Certificate) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, hostKubeadm, "certs", "check-expiration").CombinedOutput()
	if err != nil {
		e.t.Fatalf("%s certs check-expiration: %v\n%s", hostKubeadm, err, out)
	}
	e.t.Logf("%s certs check-expiration:\n%s", hostKubeadm, out)
	for _, a := range authorityFiles {
		want := newCAs[a.file].NotAfter.UTC().Format("Jan 02, 2006 15:04 MST")
		re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(a.kubeadmName) + `\s+(\w{3} \d\d, \d{4} \d\d:\d\d \w+)\s`)
		m := re.FindStringSubmatch(string(out))
		switch {
		case m == nil:
			e.t.Errorf("kubeadm certs check-expiration lists no authority %s", a.kubeadmName)
		case m[1] != want:
			e.t.Errorf("kubeadm certs check-expiration: %s expires %s, but the new %s's notAfter is %s", a.kubeadmName, m[1], a.file, want)
		default:
			e.t.Logf("kubeadm certs check-expiration: %s expires %s, the new %s's notAfter (the old one's was %s)",
				a.kubeadmName, m[1], a.file, oldCAs[a.file].NotAfter.UTC().Format("Jan 02, 2006 15:04 MST"))
		}
	}
}
