package e2e

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/keyutil"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/localcluster"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// caFiles are the three authorities' certificates under /etc/kubernetes/pki (and the staging directory).
var caFiles = []string{"ca.crt", "front-proxy-ca.crt", "etcd/ca.crt"}

// readCAs reads the authorities' certificates in dir.
func readCAs(t *testing.T, dir string) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for _, f := range caFiles {
		out = append(out, framework.ParseCertificate(t, f, []byte(framework.ReadFile(t, filepath.Join(dir, f)))))
	}
	return out
}

// signedByAny says which of cas signed c ("" when none).
func signedByAny(c *x509.Certificate, cas []*x509.Certificate) string {
	for _, ca := range cas {
		if c.CheckSignatureFrom(ca) == nil {
			return ca.Subject.CommonName
		}
	}
	return ""
}

// pkiLeaves are the certificates under root's /etc/kubernetes/pki that are not an authority's, by path.
func pkiLeaves(t *testing.T, root string) map[string]*x509.Certificate {
	t.Helper()
	out := map[string]*x509.Certificate{}
	pki := filepath.Join(root, "etc/kubernetes/pki")
	err := filepath.WalkDir(pki, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".crt") {
			return err
		}
		rel, _ := filepath.Rel(pki, p)
		for _, ca := range caFiles {
			if rel == ca {
				return nil
			}
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[rel] = framework.ParseCertificate(t, p, data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// kubeconfigClientCertificates are the client certificates of root's kubeconfigs under
// /etc/kubernetes, embedded or (kubelet.conf) a file in the root.
func kubeconfigClientCertificates(t *testing.T, root string) map[string]*x509.Certificate {
	t.Helper()
	out := map[string]*x509.Certificate{}
	confs, _ := filepath.Glob(filepath.Join(root, "etc/kubernetes/*.conf"))
	for _, path := range confs {
		cfg, err := clientcmd.LoadFromFile(path)
		if err != nil {
			t.Fatalf("loading %s: %v", path, err)
		}
		for _, a := range cfg.AuthInfos {
			data := a.ClientCertificateData
			if len(data) == 0 && a.ClientCertificate != "" {
				data = []byte(framework.ReadFile(t, filepath.Join(root, a.ClientCertificate)))
			}
			if len(data) == 0 {
				continue
			}
			out[filepath.Base(path)] = framework.ParseCertificate(t, path, data)
		}
	}
	return out
}

// serials are the serial numbers of root's certificates (pki leaves, kubeconfigs' client
// certificates) issued by one of cas, by path.
func serials(t *testing.T, root string, cas []*x509.Certificate) map[string]string {
	t.Helper()
	out := map[string]string{}
	for p, c := range pkiLeaves(t, root) {
		if signedByAny(c, cas) != "" {
			out[p] = c.SerialNumber.String()
		}
	}
	for p, c := range kubeconfigClientCertificates(t, root) {
		if signedByAny(c, cas) != "" {
			out[p] = c.SerialNumber.String()
		}
	}
	return out
}

// journalSerials are the serial numbers of the certificates reissueCertificates recorded in root's
// staging directory before putting them in place, by entry.
func journalSerials(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	dir := filepath.Join(root, "etc/kubernetes/pki-rotation/reissued")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".pem") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := pem.Decode(data); b != nil && b.Type == "CERTIFICATE" {
			out[e.Name()] = framework.ParseCertificate(t, e.Name(), data).SerialNumber.String()
		}
	}
	return out
}

func rotationSpec(mode v1alpha1.ExecutionMode, completion v1alpha1.RotationCompletion, serviceAccountKey bool) v1alpha1.NodeOperationSpec {
	return v1alpha1.NodeOperationSpec{ExecutionMode: mode,
		RotateCertificateAuthorities: &v1alpha1.RotateCertificateAuthoritiesOperation{Completion: completion, ServiceAccountKey: serviceAccountKey}}
}

// saProbe is the ServiceAccount whose tokens show which service-account keys the API server
// verifies and signs with during a rotation.
const saProbe = "rotation-probe"

// mintToken is a token of default/rotation-probe (TokenRequest, two hours).
func mintToken(t *testing.T, l *framework.Local) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(l.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts("default").CreateToken(context.Background(), saProbe,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(7200))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for default/%s: %v", saProbe, err)
	}
	return tr.Status.Token
}

// whoIs asks the API server who token is (a SelfSubjectReview authenticated with it).
func whoIs(ctx context.Context, l *framework.Local, token string) (string, error) {
	cfg := rest.AnonymousClientConfig(l.RESTConfig)
	cfg.BearerToken = token
	cfg.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return r.Status.UserInfo.Username, nil
}

// tokenSignedBy fails unless token's header names the key ID the API server gives the public key in
// pubPEM (kid) and its signature verifies with that key.
func tokenSignedBy(token string, pubPEM []byte) error {
	pubs, err := keyutil.ParsePublicKeysPEM(pubPEM)
	if err != nil {
		return err
	}
	kid, err := localcluster.ServiceAccountKeyID(pubs[0])
	if err != nil {
		return err
	}
	got, err := localcluster.TokenKeyID(token)
	if err != nil {
		return err
	}
	if got != kid {
		return fmt.Errorf("the token names key ID %q, not %q", got, kid)
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return fmt.Errorf("a token of %d parts", len(parts))
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	switch k := pubs[0].(type) {
	case *rsa.PublicKey: // RS256
		return rsa.VerifyPKCS1v15(k, crypto.SHA256, sum[:], sig)
	case *ecdsa.PublicKey: // ES256: r and s, 32 bytes each
		if len(sig) != 64 || !ecdsa.Verify(k, sum[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])) {
			return errors.New("the ES256 signature does not verify")
		}
		return nil
	default:
		return fmt.Errorf("a service-account key of type %T", k)
	}
}

// tokenProbe authenticates with a token every half second until stopped, counting the answers.
type tokenProbe struct {
	stop chan struct{}
	done chan struct{}
	// accepted, refused (401) and unavailable (the API server restarting) answers; refusedAt the
	// times of the refusals.
	accepted, unavailable int
	refusedAt             []time.Time
}

func probeToken(l *framework.Local, token string) *tokenProbe {
	p := &tokenProbe{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			switch _, err := whoIs(context.Background(), l, token); {
			case err == nil:
				p.accepted++
			case apierrors.IsUnauthorized(err):
				p.refusedAt = append(p.refusedAt, time.Now())
			default:
				p.unavailable++
			}
			select {
			case <-p.stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return p
}

// end stops the probe and returns its answers.
func (p *tokenProbe) end() *tokenProbe {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
	return p
}

// TestRotateCertificateAuthorities runs issue 29's rotation on nodeops-local with 3 control planes
// and 3 workers, whose control-plane roots the real kubeadm made: a DryRun (with the service-account
// key) changes no root and no cluster object and lists files with their old and new issuer, the
// service-account key's among them; the real run (completion Manual, serviceAccountKey) runs the
// phases in order, the control planes one at a time, waits at the approval gate complete-rotation
// until `kubectl nodeops approve`, resumes after its agent was killed in phase re-issue without
// issuing any certificate twice, and leaves every certificate and kubeconfig client certificate
// issued by the new authorities and none by the old; a token minted before it is accepted through
// trust-both and re-issue, one minted at the gate is signed by the new service-account key, and after
// complete the first is refused (401) and the second accepted. A second rotation (completion Auto,
// without the service-account key) runs through and leaves the key as it is.
func TestRotateCertificateAuthorities(t *testing.T) {
	t.Parallel()
	l := framework.StartLocal(t, "--control-planes=3", "--workers=3", "--agent-credentials=pod-bound")
	l.WaitNodesReady(t, 6, 3*time.Minute)
	cps := []string{"cp-1", "cp-2", "cp-3"}
	workers := []string{"worker-1", "worker-2", "worker-3"}
	nodes := append(append([]string(nil), cps...), workers...)
	oldCAs := readCAs(t, filepath.Join(l.Dir, "pki"))
	var saPub []byte // the service-account public key after the first rotation
	// The agents read each node's drift with kubeadm's dry runs, which leave files in the roots: let
	// them have read it once before the roots are compared.
	framework.WaitForClusterTarget(t, l, "every node's drift read, none drifting", noDrift(nodes...))

	t.Run("a DryRun changes no root and no cluster object and lists files with old and new issuer", func(t *testing.T) {
		trees := kadmSettledTrees(t, l, nodes)
		cluster := kadmClusterState(t, l)
		var info corev1.ConfigMap
		if err := l.Client.Get(context.Background(), client.ObjectKey{Namespace: "kube-public", Name: "cluster-info"}, &info); err != nil {
			t.Fatal(err)
		}
		op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "rotate-dry-run"}, Spec: rotationSpec(v1alpha1.ExecutionDryRun, v1alpha1.CompletionAuto, true)}
		framework.RunOperationWatched(t, l, op, framework.WaitForKubeadmOperation(v1alpha1.OperationSucceeded))

		kadmSameTrees(t, l, nodes, trees)
		if after := kadmClusterState(t, l); after != cluster {
			t.Errorf("the cluster changed in DryRun:\nbefore %s\nafter  %s", cluster, after)
		}
		var infoAfter corev1.ConfigMap
		if err := l.Client.Get(context.Background(), client.ObjectKey{Namespace: "kube-public", Name: "cluster-info"}, &infoAfter); err != nil {
			t.Fatal(err)
		}
		if infoAfter.ResourceVersion != info.ResourceVersion {
			t.Errorf("cluster-info changed in DryRun")
		}
		reissue := framework.GetTask(t, l, objname.TaskName(op.Name, plan.GroupCAReissueControlPlanes, "cp-2"))
		out := commandOutput(t, reissue, "reissueCertificates")
		t.Logf("reissueCertificates DryRun on cp-2:\n%s", out)
		if !strings.Contains(out, "apiserver.crt") || !strings.Contains(out, "issuer") {
			t.Errorf("reissueCertificates' DryRun output does not list apiserver.crt with its issuers:\n%s", out)
		}
		// serviceAccountKey: every phase lists the service-account key's files.
		for _, c := range []struct{ group, node, kind string }{
			{plan.GroupCAPrepareGenerate, "cp-1", "generateCertificateAuthorities"},
			{plan.GroupCATrustBothControlPlanes, "cp-1", "trustCertificateAuthorities"},
			{plan.GroupCAReissueControlPlanes, "cp-2", "reissueCertificates"},
			{plan.GroupCACompleteControlPlanes, "cp-3", "trustCertificateAuthorities"},
		} {
			out := commandOutput(t, framework.GetTask(t, l, objname.TaskName(op.Name, c.group, c.node)), c.kind)
			want := map[string][]string{
				plan.GroupCAPrepareGenerate:        {"/etc/kubernetes/pki-rotation/sa.pub and /etc/kubernetes/pki-rotation/sa.key"},
				plan.GroupCATrustBothControlPlanes: {"/etc/kubernetes/pki/sa-bundle.pub: would be created", "flag --service-account-key-file: /etc/kubernetes/pki/sa.pub -> /etc/kubernetes/pki/sa-bundle.pub"},
				plan.GroupCAReissueControlPlanes:   {"/etc/kubernetes/pki/sa.pub, /etc/kubernetes/pki/sa.key: the old service-account key -> the new"},
				plan.GroupCACompleteControlPlanes:  {"/etc/kubernetes/pki/sa-bundle.pub: would be removed", "flag --service-account-key-file: /etc/kubernetes/pki/sa-bundle.pub -> /etc/kubernetes/pki/sa.pub"},
			}[c.group]
			for _, w := range want {
				if !strings.Contains(out, w) {
					t.Errorf("%s's DryRun on %s does not list %q:\n%s", c.kind, c.node, w, out)
				}
			}
		}
	})

	t.Run("the rotation runs phase by phase, waits for approval, resumes after an agent is killed in re-issue", func(t *testing.T) {
		start := time.Now()
		// With the service-account key: a token minted before the rotation is signed by the old key.
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: saProbe}}
		framework.Create(t, l, sa)
		t.Cleanup(func() { _ = l.Client.Delete(context.Background(), sa) })
		oldSAPub := []byte(framework.ReadFile(t, filepath.Join(l.Dir, "pki/sa.pub")))
		oldToken := mintToken(t, l)
		if err := tokenSignedBy(oldToken, oldSAPub); err != nil {
			t.Fatalf("the token minted before the rotation: %v", err)
		}
		probe := probeToken(l, oldToken)
		defer probe.end()

		op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "rotate-cas"}, Spec: rotationSpec(v1alpha1.ExecutionAuto, v1alpha1.CompletionManual, true)}
		w := framework.WatchTasks(t, l, client.MatchingLabels{v1alpha1.LabelOperation: op.Name})
		framework.Create(t, l, op)

		// Phase re-issue on cp-2: freeze its agent the moment it records its first re-issued
		// certificate (the command is over in milliseconds, too fast for a poll of the task), then
		// kill it, as a node losing its agent in the middle of the command.
		stopped := make(chan string, 1)
		go func() {
			journal := filepath.Join(l.NodeRoot("cp-2"), "etc/kubernetes/pki-rotation/reissued")
			deadline := time.Now().Add(framework.KubeadmOperationTimeout)
			for time.Now().Before(deadline) {
				entries, _ := os.ReadDir(journal)
				if slices.ContainsFunc(entries, func(e os.DirEntry) bool { return strings.HasSuffix(e.Name(), ".pem") }) {
					procs, err := l.Processes()
					if err != nil {
						stopped <- "reading the process table: " + err.Error()
						return
					}
					if err := syscall.Kill(procs["agent-cp-2"], syscall.SIGSTOP); err != nil {
						stopped <- "stopping cp-2's agent: " + err.Error()
						return
					}
					stopped <- ""
					return
				}
				time.Sleep(time.Millisecond)
			}
			stopped <- "cp-2 recorded no re-issued certificate in time"
		}()
		var why string
		select {
		case why = <-stopped:
		case <-time.After(framework.KubeadmOperationTimeout + time.Minute):
			why = "the watcher of cp-2's journal never answered"
		}
		if why != "" {
			t.Fatal(why)
		}
		newCAs := readCAs(t, filepath.Join(l.NodeRoot("cp-1"), "etc/kubernetes/pki-rotation"))
		before := serials(t, l.NodeRoot("cp-2"), newCAs)
		journaled := journalSerials(t, l.NodeRoot("cp-2"))
		framework.KillAgent(t, l, "cp-2")
		t.Logf("killed cp-2's agent in reissueCertificates: %d certificates recorded in its journal %v, %d of its files issued by the new authorities %v",
			len(journaled), journaled, len(before), before)

		// completion Manual: the operation waits at the gate before phase complete.
		testutil.EventuallyEvery(t, framework.KubeadmOperationTimeout, framework.PollInterval, "the operation waits at gate complete-rotation", func(ctx context.Context) error {
			var got v1alpha1.NodeOperation
			if err := l.Client.Get(ctx, client.ObjectKey{Name: op.Name}, &got); err != nil {
				return err
			}
			if got.Status.Phase.Finished() {
				return fmt.Errorf("finished %s before the gate", got.Status.Phase)
			}
			for _, c := range got.Status.Conditions {
				if c.Type == v1alpha1.ConditionProgressing && c.Reason == nodeoperation.ReasonWaitingForGate && strings.Contains(c.Message, plan.GateCompleteRotation) {
					return nil
				}
			}
			return fmt.Errorf("phase %s, conditions %+v", got.Status.Phase, got.Status.Conditions)
		})
		for _, task := range framework.OperationTasks(t, l, op.Name) {
			if strings.HasPrefix(task.Spec.Group, "ca-complete-") {
				t.Errorf("task %s of phase complete exists before the approval", task.Name)
			}
		}
		// Every node still trusts the old authorities while it waits.
		for _, n := range cps {
			if _, err := os.Stat(filepath.Join(l.NodeRoot(n), "etc/kubernetes/pki/ca-bundle.crt")); err != nil {
				t.Errorf("%s has no bundle at the gate: %v", n, err)
			}
		}
		// Through trust-both and re-issue the token of the old key was never refused; the API server
		// now signs with the new key (a token minted now verifies with the new sa.pub, not the old)
		// and still accepts the old key's.
		probe.end()
		t.Logf("the pre-rotation token through trust-both and re-issue: accepted %d times, refused %d, API server unavailable %d",
			probe.accepted, len(probe.refusedAt), probe.unavailable)
		if len(probe.refusedAt) > 0 || probe.accepted == 0 {
			t.Errorf("the token of the old service-account key was refused before complete, at %v", probe.refusedAt)
		}
		newSAPub := []byte(framework.ReadFile(t, filepath.Join(l.NodeRoot("cp-1"), "etc/kubernetes/pki/sa.pub")))
		if bytes.Equal(newSAPub, oldSAPub) {
			t.Fatal("cp-1's sa.pub is still the old key after re-issue")
		}
		newToken := mintToken(t, l)
		if err := tokenSignedBy(newToken, newSAPub); err != nil {
			t.Errorf("a token minted after re-issue is not signed by the new service-account key: %v", err)
		}
		if err := tokenSignedBy(newToken, oldSAPub); err == nil {
			t.Error("a token minted after re-issue is signed by the old service-account key")
		}
		for name, token := range map[string]string{"old": oldToken, "new": newToken} {
			if who, err := whoIs(context.Background(), l, token); err != nil || who != "system:serviceaccount:default:"+saProbe {
				t.Errorf("at the gate, the %s key's token: %q, %v", name, who, err)
			}
		}
		if out, err := exec.Command(filepath.Join(l.BinDir, "kubectl-nodeops"), "approve", op.Name, "--gate", plan.GateCompleteRotation, "--kubeconfig", l.Kubeconfig).CombinedOutput(); err != nil {
			t.Fatalf("kubectl nodeops approve: %v\n%s", err, out)
		}
		framework.WaitForOperation(t, l, framework.WaitForOperationInput{Name: op.Name, Phase: v1alpha1.OperationSucceeded,
			Timeout: framework.KubeadmOperationTimeout, FailIfBlocked: true})
		events := w.Stop(t)

		// Certificates issued before the kill were not issued again: those in place keep their serial,
		// those only recorded were put in place.
		after := serials(t, l.NodeRoot("cp-2"), newCAs)
		for p, s := range before {
			if after[p] != s {
				t.Errorf("cp-2's %s was issued again after its agent was killed: serial %s -> %s", p, s, after[p])
			}
		}
		installed := map[string]bool{}
		for _, s := range after {
			installed[s] = true
		}
		for name, s := range journaled {
			if !installed[s] {
				t.Errorf("cp-2's recorded %s (serial %s) is not the one in place after the resumed run: issued twice", name, s)
			}
		}
		if len(journaled) == 0 {
			t.Error("the kill found no certificate recorded: it did not land in the middle of re-issue")
		}

		// Phases in order, control planes one at a time.
		among := map[string]bool{"cp-1": true, "cp-2": true, "cp-3": true}
		if held, what := framework.MaxHeld(framework.WorkEvents(events), among); held > 1 {
			t.Errorf("%d control planes rotated at once: %s", held, what)
		}
		order := []string{plan.GroupCAPrepareGenerate, plan.GroupCAPrepareCopy, plan.GroupCATrustBothControlPlanes, plan.GroupCATrustBothCluster,
			plan.GroupCATrustBothWorkers, plan.GroupCAReissueControlPlanes, plan.GroupCAReissueWorkers, plan.GroupCACompleteControlPlanes,
			plan.GroupCACompleteWorkers, plan.GroupCACompleteCluster}
		rank := map[string]int{}
		for i, g := range order {
			rank[g] = i
		}
		started, finished := map[string]time.Time{}, map[string]time.Time{}
		for _, task := range framework.OperationTasks(t, l, op.Name) {
			g := task.Spec.Group
			if _, ok := rank[g]; !ok || task.Status.StartTime == nil || task.Status.CompletionTime == nil {
				continue
			}
			if s, ok := started[g]; !ok || task.Status.StartTime.Time.Before(s) {
				started[g] = task.Status.StartTime.Time
			}
			if f := task.Status.CompletionTime.Time; f.After(finished[g]) {
				finished[g] = f
			}
		}
		for i := 1; i < len(order); i++ {
			prev, g := order[i-1], order[i]
			if _, ok := started[g]; !ok {
				t.Errorf("group %s ran no task", g)
				continue
			}
			if started[g].Before(finished[prev]) {
				t.Errorf("group %s started at %s, before %s finished at %s", g, started[g], prev, finished[prev])
			}
		}
		for _, g := range order {
			t.Logf("group %s: started %s into the subtest, ran %s", g, started[g].Sub(start).Round(time.Second), finished[g].Sub(started[g]).Round(time.Second))
		}

		checkRotated(t, l, nodes, oldCAs, newCAs)
		oldCAs = newCAs

		// Complete: the API server verifies with the new key alone.
		if who, err := whoIs(context.Background(), l, oldToken); !apierrors.IsUnauthorized(err) {
			t.Errorf("after complete, the pre-rotation token is not refused: %q, %v", who, err)
		}
		if who, err := whoIs(context.Background(), l, newToken); err != nil || who != "system:serviceaccount:default:"+saProbe {
			t.Errorf("after complete, the token of the new key: %q, %v", who, err)
		}
		for _, n := range cps {
			if got := framework.ReadFile(t, filepath.Join(l.NodeRoot(n), "etc/kubernetes/pki/sa.pub")); got != string(newSAPub) {
				t.Errorf("%s's sa.pub is not the new service-account key", n)
			}
			if _, err := os.Stat(filepath.Join(l.NodeRoot(n), "etc/kubernetes/pki/sa-bundle.pub")); !os.IsNotExist(err) {
				t.Errorf("%s still has sa-bundle.pub: %v", n, err)
			}
		}
		saPub = newSAPub
		t.Logf("the rotation with the service-account key took %s", time.Since(start).Round(time.Second))
	})

	t.Run("a second rotation, completion Auto, runs through without waiting", func(t *testing.T) {
		start := time.Now()
		op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "rotate-cas-again"}, Spec: rotationSpec(v1alpha1.ExecutionAuto, v1alpha1.CompletionAuto, false)}
		done, events := framework.RunOperationWatched(t, l, op, framework.WaitForKubeadmOperation(v1alpha1.OperationSucceeded))
		for _, c := range done.Status.Conditions {
			if c.Reason == nodeoperation.ReasonWaitingForGate {
				t.Errorf("completion Auto left condition %s %s: %s", c.Type, c.Reason, c.Message)
			}
		}
		among := map[string]bool{"cp-1": true, "cp-2": true, "cp-3": true}
		if held, what := framework.MaxHeld(framework.WorkEvents(events), among); held > 1 {
			t.Errorf("%d control planes rotated at once: %s", held, what)
		}
		newCAs := readCAs(t, filepath.Join(l.NodeRoot("cp-1"), "etc/kubernetes/pki"))
		for i := range newCAs {
			if newCAs[i].Equal(oldCAs[i]) {
				t.Fatalf("cp-1's %s is the first rotation's", caFiles[i])
			}
		}
		checkRotated(t, l, nodes, oldCAs, newCAs)
		// Without serviceAccountKey the service-account key stays.
		for _, n := range cps {
			if got := framework.ReadFile(t, filepath.Join(l.NodeRoot(n), "etc/kubernetes/pki/sa.pub")); saPub != nil && got != string(saPub) {
				t.Errorf("%s's sa.pub changed in a rotation without serviceAccountKey", n)
			}
		}
		t.Logf("the second rotation took %s", time.Since(start).Round(time.Second))
	})
}

// checkRotated: every certificate under each control plane's /etc/kubernetes/pki and every
// kubeconfig's client certificate on every node chains to newCAs and to none of oldCAs, the control
// planes hold newCAs and no staging directory, and kube-root-ca.crt holds the new cluster CA alone.
func checkRotated(t *testing.T, l *framework.Local, nodes []string, oldCAs, newCAs []*x509.Certificate) {
	t.Helper()
	// Every certificate and kubeconfig client certificate chains to the new authorities, none to the old.
	for _, n := range nodes {
		root := l.NodeRoot(n)
		certs := kubeconfigClientCertificates(t, root)
		if len(certs) == 0 {
			t.Errorf("%s: no kubeconfig client certificate found", n)
		}
		if strings.HasPrefix(n, "cp-") {
			got := readCAs(t, filepath.Join(root, "etc/kubernetes/pki"))
			for i := range got {
				if !got[i].Equal(newCAs[i]) {
					t.Errorf("%s's %s is not the new authority", n, caFiles[i])
				}
			}
			for p, c := range pkiLeaves(t, root) {
				certs[p] = c
			}
			if _, err := os.Stat(filepath.Join(root, "etc/kubernetes/pki-rotation")); !os.IsNotExist(err) {
				t.Errorf("%s still has the staging directory: %v", n, err)
			}
		}
		for p, c := range certs {
			if by := signedByAny(c, oldCAs); by != "" {
				t.Errorf("%s's %s is still issued by the old %s", n, p, by)
			}
			if signedByAny(c, newCAs) == "" {
				t.Errorf("%s's %s (issuer %s) is issued by none of the new authorities", n, p, c.Issuer)
			}
		}
		t.Logf("%s: %d certificates issued by the new authorities", n, len(certs))
	}
	var rootCA corev1.ConfigMap
	if err := l.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "kube-root-ca.crt"}, &rootCA); err != nil {
		t.Fatal(err)
	}
	if b, _ := pem.Decode([]byte(rootCA.Data["ca.crt"])); b == nil || !strings.Contains(rootCA.Data["ca.crt"], string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: newCAs[0].Raw}))) ||
		strings.Contains(rootCA.Data["ca.crt"], string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: oldCAs[0].Raw}))) {
		t.Errorf("default/kube-root-ca.crt does not hold the new CA alone:\n%s", rootCA.Data["ca.crt"])
	}
}
