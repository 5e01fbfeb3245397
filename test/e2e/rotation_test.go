package e2e

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
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

func rotationSpec(mode v1alpha1.ExecutionMode, completion v1alpha1.RotationCompletion) v1alpha1.NodeOperationSpec {
	return v1alpha1.NodeOperationSpec{ExecutionMode: mode,
		RotateCertificateAuthorities: &v1alpha1.RotateCertificateAuthoritiesOperation{Completion: completion}}
}

// TestRotateCertificateAuthorities runs issue 29's rotation on nodeops-local with 3 control planes
// and 3 workers, whose control-plane roots the real kubeadm made: a DryRun changes no root and no
// cluster object and lists files with their old and new issuer; the real run (completion Manual)
// runs the phases in order, the control planes one at a time, waits at the approval gate
// complete-rotation until `kubectl nodeops approve`, resumes after its agent was killed in phase
// re-issue without issuing any certificate twice, and leaves every certificate and kubeconfig
// client certificate issued by the new authorities and none by the old.
func TestRotateCertificateAuthorities(t *testing.T) {
	l := framework.StartLocal(t, "--control-planes=3", "--workers=3", "--agent-credentials=pod-bound")
	l.WaitNodesReady(t, 6, 3*time.Minute)
	cps := []string{"cp-1", "cp-2", "cp-3"}
	workers := []string{"worker-1", "worker-2", "worker-3"}
	nodes := append(append([]string(nil), cps...), workers...)
	oldCAs := readCAs(t, filepath.Join(l.Dir, "pki"))
	// The agents read each node's drift with kubeadm's dry runs, which leave files in the roots: let
	// them have read it once before the roots are compared.
	framework.WaitForClusterTarget(t, l, "every node's drift read, none drifting", noDrift(nodes...))

	t.Run("a DryRun changes no root and no cluster object and lists files with old and new issuer", func(t *testing.T) {
		trees := kadmTrees(t, l, nodes)
		cluster := kadmClusterState(t, l)
		var info corev1.ConfigMap
		if err := l.Client.Get(context.Background(), client.ObjectKey{Namespace: "kube-public", Name: "cluster-info"}, &info); err != nil {
			t.Fatal(err)
		}
		op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "rotate-dry-run"}, Spec: rotationSpec(v1alpha1.ExecutionDryRun, v1alpha1.CompletionAuto)}
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
		reissue := framework.GetTask(t, l, plan.TaskName(op.Name, plan.GroupCAReissueControlPlanes, "cp-2"))
		out := commandOutput(t, reissue, "reissueCertificates")
		t.Logf("reissueCertificates DryRun on cp-2:\n%s", out)
		if !strings.Contains(out, "apiserver.crt") || !strings.Contains(out, "issuer") {
			t.Errorf("reissueCertificates' DryRun output does not list apiserver.crt with its issuers:\n%s", out)
		}
	})

	t.Run("the rotation runs phase by phase, waits for approval, resumes after an agent is killed in re-issue", func(t *testing.T) {
		op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "rotate-cas"}, Spec: rotationSpec(v1alpha1.ExecutionAuto, v1alpha1.CompletionManual)}
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

		checkRotated(t, l, nodes, oldCAs, newCAs)
		oldCAs = newCAs
	})

	t.Run("a second rotation, completion Auto, runs through without waiting", func(t *testing.T) {
		op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "rotate-cas-again"}, Spec: rotationSpec(v1alpha1.ExecutionAuto, v1alpha1.CompletionAuto)}
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
