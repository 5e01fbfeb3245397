package clustertarget_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/clustertarget"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/testutil"
)

// The installer creates the ClusterTarget from what it observes, and never touches one that exists.
func TestCreatedOnInstallAndNeverOverwritten(t *testing.T) {
	f := newFixture(t)
	f.empty("v1.36.3")
	installer := &clustertarget.Installer{Client: f.c, Reader: f.c, Interval: 50 * time.Millisecond}
	f.must(installer.Start(f.ctx))
	ct := f.target()
	if ct.Spec.KubernetesVersion != "v1.36.3" || ct.Spec.Paused || ct.Spec.Certificates.AutoRenew || ct.Spec.Certificates.RotationCount != 0 {
		t.Fatalf("installed spec %+v", ct.Spec)
	}
	f.waitCondition(v1alpha1.ConditionUpToDate, metav1.ConditionTrue, clustertarget.ReasonUpToDate)
	f.stillOperations()

	f.edit(func(ct *v1alpha1.ClusterTarget) {
		ct.Spec.Paused = true
		ct.Spec.Certificates.AutoRenew = true
	})
	// Restarted: a new installer, and the kubeadm-config moving on, change nothing a person wrote.
	f.setClusterVersion("v1.37.2")
	f.must((&clustertarget.Installer{Client: f.c, Reader: f.c, Interval: 50 * time.Millisecond}).Start(f.ctx))
	created, problem, err := clustertarget.Install(f.ctx, f.c, f.c)
	if created || problem != "" || err != nil {
		t.Fatalf("Install over an existing ClusterTarget: created %v, %q, %v", created, problem, err)
	}
	ct = f.target()
	if ct.Spec.KubernetesVersion != "v1.36.3" || !ct.Spec.Paused || !ct.Spec.Certificates.AutoRenew {
		t.Fatalf("spec overwritten: %+v", ct.Spec)
	}
}

// The API server keeps the singleton's name and rotationCount from going down.
func TestValidation(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.2")
	err := f.c.Create(f.ctx, &v1alpha1.ClusterTarget{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: v1alpha1.ClusterTargetSpec{KubernetesVersion: "v1.37.2"}})
	if err == nil || !strings.Contains(err.Error(), "named cluster") {
		t.Errorf("a second ClusterTarget: %v", err)
	}
	f.edit(func(ct *v1alpha1.ClusterTarget) { ct.Spec.Certificates.RotationCount = 2 })
	ct := f.target()
	lower := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"certificates":{"rotationCount":1}}}`))
	if err := f.c.Patch(f.ctx, ct, lower); err == nil || !strings.Contains(err.Error(), "can only go up") {
		t.Errorf("lowering rotationCount: %v", err)
	}
}

// A new patch version makes exactly one upgrade operation, owned by the ClusterTarget; once it
// succeeded and the versions observed match, the cluster is up to date.
func TestUpgradeToNewPatch(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.0")
	f.waitCondition(v1alpha1.ConditionUpToDate, metav1.ConditionTrue, clustertarget.ReasonUpToDate)
	if s := f.kstatus(); s != status.CurrentStatus {
		t.Errorf("kstatus when up to date: %s", s)
	}
	f.edit(func(ct *v1alpha1.ClusterTarget) { ct.Spec.KubernetesVersion = "v1.37.2" })
	ops := f.waitOperations("cluster-upgrade-v1.37.2-1")
	ct := f.target()
	if ref := metav1.GetControllerOf(&ops[0]); ref == nil || ref.UID != ct.UID || ref.Kind != "ClusterTarget" {
		t.Fatalf("owner %+v", ops[0].OwnerReferences)
	}
	if u := ops[0].Spec.Upgrade; u == nil || u.KubernetesVersion != "v1.37.2" || u.BinarySource == nil {
		t.Fatalf("upgrade spec %+v", ops[0].Spec)
	}
	f.waitKstatus(status.InProgressStatus)

	f.runOperation("cluster-upgrade-v1.37.2-1", nil, v1alpha1.OperationSucceeded)
	f.waitCondition(v1alpha1.ConditionReconciling, metav1.ConditionTrue, clustertarget.ReasonAwaitingObservedVersion)
	f.setClusterVersion("v1.37.2")
	f.nodeStatus("cp-1", "v1.37.2")
	f.nodeStatus("w-1", "v1.37.2")
	f.mirrorPod("cp-1", "v1.37.2")
	ct = f.waitCondition(v1alpha1.ConditionUpToDate, metav1.ConditionTrue, clustertarget.ReasonUpToDate)
	if ct.Status.KubernetesVersion != "v1.37.2" || ct.Status.Phase != v1alpha1.ClusterUpToDate {
		t.Errorf("status %s at %s", ct.Status.Phase, ct.Status.KubernetesVersion)
	}
	var cp *v1alpha1.ObservedNode
	for i := range ct.Status.Nodes {
		if ct.Status.Nodes[i].Name == "cp-1" {
			cp = &ct.Status.Nodes[i]
		}
	}
	if cp == nil || !cp.ControlPlane || cp.KubeletVersion != "v1.37.2" || cp.StaticPods["kube-apiserver"] != "v1.37.2" {
		t.Errorf("observed control plane %+v", cp)
	}
	if len(ct.Status.Operations) != 1 || ct.Status.Operations[0].Phase != v1alpha1.OperationSucceeded {
		t.Errorf("operations %+v", ct.Status.Operations)
	}
	f.waitKstatus(status.CurrentStatus)
	f.stillOperations("cluster-upgrade-v1.37.2-1")
}

// v1.35 to v1.37 is two upgrades: refused until the v1.36 step is named, then only the first runs.
func TestUpgradeChain(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.35.3")
	f.edit(func(ct *v1alpha1.ClusterTarget) { ct.Spec.KubernetesVersion = "v1.37.2" })
	ct := f.waitCondition(v1alpha1.ConditionStalled, metav1.ConditionTrue, "UnsupportedVersionSkew")
	msg := meta.FindStatusCondition(ct.Status.Conditions, v1alpha1.ConditionStalled).Message
	if !strings.Contains(msg, "v1.35.3") || !strings.Contains(msg, "v1.37.2") {
		t.Errorf("message %q must name both versions", msg)
	}
	f.stillOperations()

	f.edit(func(ct *v1alpha1.ClusterTarget) { ct.Spec.Upgrade.Path = []string{"v1.36.4"} })
	f.waitOperations("cluster-upgrade-v1.36.4-1")
	ct = f.waitCondition(v1alpha1.ConditionProgressing, metav1.ConditionTrue, "")
	if got := strings.Join(ct.Status.UpgradePath, " "); got != "v1.36.4 v1.37.2" {
		t.Errorf("upgrade path %q", got)
	}
	f.stillOperations("cluster-upgrade-v1.36.4-1")
}

// A downgrade is refused, naming both versions, and nothing runs.
func TestDowngradeRefused(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.2")
	f.edit(func(ct *v1alpha1.ClusterTarget) { ct.Spec.KubernetesVersion = "v1.36.9" })
	ct := f.waitCondition(v1alpha1.ConditionStalled, metav1.ConditionTrue, "UnsupportedVersionSkew")
	if msg := meta.FindStatusCondition(ct.Status.Conditions, v1alpha1.ConditionUpToDate).Message; !strings.Contains(msg, "v1.37.2") || !strings.Contains(msg, "v1.36.9") {
		t.Errorf("message %q", msg)
	}
	f.waitKstatus(status.FailedStatus)
	f.stillOperations()
}

// Raising rotationCount renews the certificates exactly once.
func TestRotationOncePerIncrement(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.2")
	f.edit(func(ct *v1alpha1.ClusterTarget) { ct.Spec.Certificates.RotationCount = 1 })
	ops := f.waitOperations("cluster-rotate-certificates-1-1")
	if ops[0].Spec.RenewCertificates == nil {
		t.Fatalf("spec %+v", ops[0].Spec)
	}
	expiry := metav1.NewTime(time.Now().Add(365 * 24 * time.Hour).Truncate(time.Second))
	f.runOperation(ops[0].Name, []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: expiry}}, v1alpha1.OperationSucceeded)
	ct := f.waitCondition(v1alpha1.ConditionUpToDate, metav1.ConditionTrue, clustertarget.ReasonUpToDate)
	if ct.Status.LastRotationCount != 1 {
		t.Errorf("lastRotationCount %d", ct.Status.LastRotationCount)
	}
	if ct.Status.NextCertificateExpiry == nil || !ct.Status.NextCertificateExpiry.Equal(&expiry) || len(ct.Status.Certificates) != 1 || ct.Status.Certificates[0].Node != "cp-1" {
		t.Errorf("certificates %+v, next %v", ct.Status.Certificates, ct.Status.NextCertificateExpiry)
	}
	f.stillOperations("cluster-rotate-certificates-1-1")
	f.edit(func(ct *v1alpha1.ClusterTarget) { ct.Spec.Certificates.RotationCount = 2 })
	f.waitOperations("cluster-rotate-certificates-1-1", "cluster-rotate-certificates-2-1")
}

// A renewBefore longer than the certificates' lifetime: one renewal, then a condition, no loop.
func TestRenewBeforeNoRenewalSatisfies(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.2")
	// An earlier renewal's reading: certificates that expire in ten days.
	soon := metav1.NewTime(time.Now().Add(10 * 24 * time.Hour).Truncate(time.Second))
	task := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "earlier-renewal-cp-1"},
		Spec: v1alpha1.NodeTaskSpec{NodeName: "cp-1", Commands: []v1alpha1.Command{{KubeadmRenewCertificates: &v1alpha1.KubeadmRenewCertificatesCommand{}}}}}
	f.must(f.c.Create(f.ctx, task))
	f.must(f.agent().Write(f.ctx, task.Name, func(t *v1alpha1.NodeTask) {
		now := metav1.NowMicro()
		t.Status.Phase, t.Status.CompletionTime = v1alpha1.TaskSucceeded, &now
		t.Status.Certificates = []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: soon}}
	}))
	f.edit(func(ct *v1alpha1.ClusterTarget) {
		ct.Spec.Certificates.AutoRenew = true
		ct.Spec.Certificates.RenewBefore = &metav1.Duration{Duration: 2 * 365 * 24 * time.Hour}
	})
	name := "cluster-renew-certificates-expiring-" + soon.UTC().Format("20060102") + "-1"
	f.waitOperations(name)
	year := metav1.NewTime(time.Now().Add(365 * 24 * time.Hour).Truncate(time.Second))
	f.runOperation(name, []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: year}}, v1alpha1.OperationSucceeded)
	f.waitCondition(v1alpha1.ConditionStalled, metav1.ConditionTrue, clustertarget.ReasonRenewBeforeUnsatisfiable)
	f.stillOperations(name)
}

// Paused generates nothing, and says so; resumed, it generates.
func TestPaused(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.0")
	f.edit(func(ct *v1alpha1.ClusterTarget) {
		ct.Spec.Paused = true
		ct.Spec.KubernetesVersion = "v1.37.2"
	})
	f.waitCondition(v1alpha1.ConditionProgressing, metav1.ConditionFalse, clustertarget.ReasonPaused)
	f.stillOperations()
	f.edit(func(ct *v1alpha1.ClusterTarget) { ct.Spec.Paused = false })
	f.waitOperations("cluster-upgrade-v1.37.2-1")
}

// A generated operation that is Blocked makes the ClusterTarget Blocked and Stalled, and nothing
// new is generated, even when more becomes due.
func TestBlocked(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.0")
	f.edit(func(ct *v1alpha1.ClusterTarget) {
		ct.Spec.KubernetesVersion = "v1.37.2"
		ct.Spec.Upgrade.UpgradeKubeletAndKubectl = ptr.To(true)
	})
	f.waitOperations("cluster-upgrade-v1.37.2-1")
	var task string
	testutil.Eventually(t, 30*time.Second, "the first task", func() error {
		var tasks v1alpha1.NodeTaskList
		if err := f.c.List(f.ctx, &tasks, client.MatchingLabels{v1alpha1.LabelOperation: "cluster-upgrade-v1.37.2-1"}); err != nil {
			return err
		}
		if len(tasks.Items) == 0 {
			return errNoTask
		}
		task = tasks.Items[0].Name
		return nil
	})
	f.must(f.agent().Begin(f.ctx, task, 0))
	f.must(f.agent().End(f.ctx, task, 0, false, "download failed"))
	ct := f.waitCondition(v1alpha1.ConditionBlocked, metav1.ConditionTrue, clustertarget.ReasonOperationBlocked)
	if ct.Status.Phase != v1alpha1.ClusterBlocked || !meta.IsStatusConditionTrue(ct.Status.Conditions, v1alpha1.ConditionStalled) {
		t.Errorf("phase %s, conditions %+v", ct.Status.Phase, ct.Status.Conditions)
	}
	f.waitKstatus(status.FailedStatus)
	f.edit(func(ct *v1alpha1.ClusterTarget) { ct.Spec.Certificates.RotationCount = 1 })
	f.waitCondition(v1alpha1.ConditionBlocked, metav1.ConditionTrue, clustertarget.ReasonOperationBlocked)
	f.stillOperations("cluster-upgrade-v1.37.2-1")
}

// At rest the ClusterTarget is not written: node heartbeats and operation progress do not wake
// it, and a reconcile that changes nothing writes nothing.
func TestZeroWritesAtRest(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.2")
	f.edit(func(ct *v1alpha1.ClusterTarget) { ct.Spec.Certificates.RotationCount = 1 })
	f.runOperation("cluster-rotate-certificates-1-1", []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: metav1.NewTime(time.Now().Add(300 * 24 * time.Hour))}}, v1alpha1.OperationSucceeded)
	f.waitCondition(v1alpha1.ConditionUpToDate, metav1.ConditionTrue, clustertarget.ReasonUpToDate)
	f.observed() // the writes the operation's end called for are made
	rv := f.target().ResourceVersion
	w, err := f.c.Watch(f.ctx, &v1alpha1.ClusterTargetList{}, client.MatchingFields{"metadata.name": "cluster"},
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
	f.must(err)
	defer w.Stop()
	for i := range 6 {
		f.nodeStatus("cp-1", "v1.37.2") // a heartbeat
		f.nodeStatus("w-1", "v1.37.2")
		if i == 2 {
			// A label passes the node predicate: a reconcile runs, decides the same, writes nothing.
			f.must(f.c.Patch(f.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "w-1"}},
				client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"pool":"b"}}}`))))
		}
		time.Sleep(500 * time.Millisecond) // heartbeats come apart, each a chance to write
	}
	// Every write between rv and the edit that observed() makes was made at rest.
	gen := f.observed()
	for ev := range w.ResultChan() {
		ct, ok := ev.Object.(*v1alpha1.ClusterTarget)
		if !ok {
			t.Fatalf("watch: %v", ev.Object)
		}
		if ct.Generation >= gen {
			return
		}
		t.Fatalf("ClusterTarget written at rest: resourceVersion %s -> %s, status %+v", rv, ct.ResourceVersion, ct.Status)
	}
	t.Fatal("the watch ended before the edit")
}

type errString string

func (e errString) Error() string { return string(e) }

const errNoTask = errString("no task yet")

// The sample is a valid ClusterTarget: strict to the type, and accepted by the API server's
// schema and CEL rules (a dry-run update).
func TestSample(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.2")
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "samples", "clustertarget.yaml"))
	f.must(err)
	var sample v1alpha1.ClusterTarget
	f.must(yaml.UnmarshalStrict(data, &sample))
	f.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ct := f.target()
		ct.Spec = sample.Spec
		return f.c.Update(f.ctx, ct, client.DryRunAll)
	}))
}

// An operation deleted by hand is history: it is not generated again (nothing deleted
// automatically, rule 7) until the spec changes.
func TestDeletedByHandNotMadeAgain(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.0")
	f.edit(func(ct *v1alpha1.ClusterTarget) { ct.Spec.KubernetesVersion = "v1.37.2" })
	ops := f.waitOperations("cluster-upgrade-v1.37.2-1")
	f.waitCondition(v1alpha1.ConditionReconciling, metav1.ConditionTrue, clustertarget.ReasonOperationRunning)
	f.must(f.c.Delete(f.ctx, &ops[0]))
	ct := f.waitCondition(v1alpha1.ConditionStalled, metav1.ConditionTrue, clustertarget.ReasonOperationFailed)
	if len(ct.Status.Operations) != 1 || ct.Status.Operations[0].Phase != v1alpha1.OperationPhaseDeleted {
		t.Errorf("history %+v", ct.Status.Operations)
	}
	f.stillOperations()
	// A spec change is the person's word to try again.
	f.edit(func(ct *v1alpha1.ClusterTarget) { ct.Spec.Upgrade.IgnorePreflightErrors = []string{"Swap"} })
	f.waitOperations("cluster-upgrade-v1.37.2-2")
}

// A control plane's agent reads its certificates into its Node (nodeops.io/certificates): the
// ClusterTarget shows that reading without any operation having run, renews on it, and after the
// renewal shows the renewal's (later) reading until the agent reads again: an agent's older reading
// never makes it renew a second time.
func TestAgentsCertificateReading(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.2")
	day := 24 * time.Hour
	// The cluster CA, which renewals keep: shown beside the leaves whichever reading wins.
	caExpiry := metav1.NewTime(time.Now().Add(9 * 365 * day).Truncate(time.Second))
	annotate := func(notAfter metav1.Time) {
		t.Helper()
		value := v1alpha1.EncodeCertificates([]v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: notAfter},
			{Name: "admin.conf", NotAfter: metav1.NewTime(notAfter.Add(day))}, {Name: "ca", NotAfter: caExpiry}})
		f.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var n corev1.Node
			if err := f.c.Get(f.ctx, client.ObjectKey{Name: "cp-1"}, &n); err != nil {
				return err
			}
			if n.Annotations == nil {
				n.Annotations = map[string]string{}
			}
			n.Annotations[v1alpha1.AnnotationCertificates] = value
			return f.c.Update(f.ctx, &n)
		}))
	}
	shows := func(what string, next metav1.Time, task string) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, what, func() error {
			ct := f.target()
			if ct.Status.NextCertificateExpiry == nil || !ct.Status.NextCertificateExpiry.Equal(&next) ||
				len(ct.Status.Certificates) != 1 || ct.Status.Certificates[0].Node != "cp-1" || ct.Status.Certificates[0].Task != task ||
				len(ct.Status.Certificates[0].Certificates) == 0 {
				return fmt.Errorf("next %v, certificates %+v", ct.Status.NextCertificateExpiry, ct.Status.Certificates)
			}
			if cas := ct.Status.Certificates[0].CertificateAuthorities; len(cas) != 1 || cas[0].Name != "ca" || !cas[0].NotAfter.Equal(&caExpiry) ||
				ct.Status.NextCertificateAuthorityExpiry == nil || !ct.Status.NextCertificateAuthorityExpiry.Equal(&caExpiry) {
				return fmt.Errorf("certificate authorities %+v, next %v", cas, ct.Status.NextCertificateAuthorityExpiry)
			}
			return nil
		})
	}
	soon := metav1.NewTime(time.Now().Add(200 * day).Truncate(time.Second))
	annotate(soon)
	shows("the agent's reading in status, with no operation run", soon, "")
	f.stillOperations()

	f.edit(func(ct *v1alpha1.ClusterTarget) {
		ct.Spec.Certificates.AutoRenew = true
		ct.Spec.Certificates.RenewBefore = &metav1.Duration{Duration: 300 * day}
	})
	name := "cluster-renew-certificates-expiring-" + soon.UTC().Format("20060102") + "-1"
	ops := f.waitOperations(name)
	year := metav1.NewTime(time.Now().Add(365 * day).Truncate(time.Second))
	f.runOperation(ops[0].Name, []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: year}}, v1alpha1.OperationSucceeded)
	var task v1alpha1.NodeTaskList
	f.must(f.c.List(f.ctx, &task, client.MatchingLabels{v1alpha1.LabelOperation: name}))
	// The renewal's task, beside the node's preflight.
	task.Items = slices.DeleteFunc(task.Items, func(t v1alpha1.NodeTask) bool { return t.Spec.Group == plan.GroupPreflight })
	if len(task.Items) != 1 {
		t.Fatalf("%d tasks of %s", len(task.Items), name)
	}
	shows("the renewal's later reading while the node still carries the agent's older one", year, task.Items[0].Name)
	f.waitCondition(v1alpha1.ConditionUpToDate, metav1.ConditionTrue, clustertarget.ReasonUpToDate)
	f.stillOperations(name)

	later := metav1.NewTime(year.Add(time.Hour))
	annotate(later)
	shows("the agent's next reading", later, "")
	f.stillOperations(name)
}

// Any agent may write nodeops.io/certificates on its own Node: only control planes' readings count
// (the node's role as the manager sees it, by its label, which no kubelet or agent may set on its
// own Node), so a worker's reading of certificates that expire tomorrow generates nothing, while a
// control plane's true reading still renews.
func TestWorkersCertificateReadingIgnored(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.2")
	day := 24 * time.Hour
	f.edit(func(ct *v1alpha1.ClusterTarget) {
		ct.Spec.Certificates.AutoRenew = true
		ct.Spec.Certificates.RenewBefore = &metav1.Duration{Duration: 30 * day}
	})
	tomorrow := metav1.NewTime(time.Now().Add(day).Truncate(time.Second))
	f.annotateCertificates("w-1", []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: tomorrow}})
	// cp-1's reading, written after w-1's: once the status shows it, w-1's was read too.
	far := metav1.NewTime(time.Now().Add(200 * day).Truncate(time.Second))
	f.annotateCertificates("cp-1", []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: far}})
	testutil.Eventually(t, 30*time.Second, "cp-1's reading alone in status", func() error {
		ct := f.target()
		if len(ct.Status.Certificates) != 1 || ct.Status.Certificates[0].Node != "cp-1" || ct.Status.NextCertificateExpiry == nil || !ct.Status.NextCertificateExpiry.Equal(&far) {
			return fmt.Errorf("next %v, certificates %+v", ct.Status.NextCertificateExpiry, ct.Status.Certificates)
		}
		return nil
	})
	f.stillOperations()

	f.annotateCertificates("cp-1", []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: tomorrow}})
	f.waitOperations("cluster-renew-certificates-expiring-" + tomorrow.UTC().Format("20060102") + "-1")
}

// A control plane's reading is checked against the cluster CA the controller-manager publishes in
// kube-system/kube-root-ca.crt: a certificate that CA signs expiring after it cannot be true, and
// is shown with its problem, counting for nothing.
func TestCertificateReadingOutsideTheCAIsReported(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.2")
	day := 24 * time.Hour
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	f.must(err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(30 * day), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	f.must(err)
	ca := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: clustertarget.RootCAConfigMap},
		Data: map[string]string{"ca.crt": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}}
	f.must(f.c.Create(f.ctx, ca))
	t.Cleanup(func() { _ = f.c.Delete(context.Background(), ca) })

	f.annotateCertificates("cp-1", []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: metav1.NewTime(time.Now().Add(365 * day).Truncate(time.Second))}})
	testutil.Eventually(t, 30*time.Second, "cp-1's reading shown with its problem", func() error {
		ct := f.target()
		if len(ct.Status.Certificates) != 1 || !strings.Contains(ct.Status.Certificates[0].Problem, "out of range") || ct.Status.NextCertificateExpiry != nil {
			return fmt.Errorf("next %v, certificates %+v", ct.Status.NextCertificateExpiry, ct.Status.Certificates)
		}
		return nil
	})
	within := metav1.NewTime(time.Now().Add(20 * day).Truncate(time.Second))
	f.annotateCertificates("cp-1", []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: within}})
	testutil.Eventually(t, 30*time.Second, "cp-1's reading within the CA counts", func() error {
		ct := f.target()
		if len(ct.Status.Certificates) != 1 || ct.Status.Certificates[0].Problem != "" || ct.Status.NextCertificateExpiry == nil || !ct.Status.NextCertificateExpiry.Equal(&within) {
			return fmt.Errorf("next %v, certificates %+v", ct.Status.NextCertificateExpiry, ct.Status.Certificates)
		}
		return nil
	})
}

// What a person sees raising certificateAuthorities.rotationCount: one rotateCertificateAuthorities
// operation with the target's settings appears, owned by the ClusterTarget; the ClusterTarget's
// status follows it phase by phase, says when it waits for approval and how to give it; an upgrade
// asked meanwhile waits until the rotation succeeded, then goes; nothing is generated twice.
func TestCertificateAuthorityRotation(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.2")
	const rotation = "cluster-rotate-certificate-authorities-1-1"
	f.edit(func(ct *v1alpha1.ClusterTarget) {
		ct.Spec.CertificateAuthorities.RotationCount = 1
		ct.Spec.CertificateAuthorities.ServiceAccountKey = true
	})
	ops := f.waitOperations(rotation)
	ct := f.target()
	if ref := metav1.GetControllerOf(&ops[0]); ref == nil || ref.UID != ct.UID || ops[0].Labels[clustertarget.LabelClusterTarget] != "cluster" {
		t.Fatalf("owner %+v, labels %v", ops[0].OwnerReferences, ops[0].Labels)
	}
	if r := ops[0].Spec.RotateCertificateAuthorities; r == nil || !r.ServiceAccountKey || r.Completion != v1alpha1.CompletionManual || len(r.Authorities) != 0 {
		t.Fatalf("generated spec %+v", ops[0].Spec)
	}
	if ct.Status.LastCertificateAuthorityRotationCount != 1 {
		t.Errorf("lastCertificateAuthorityRotationCount %d", ct.Status.LastCertificateAuthorityRotationCount)
	}

	// An upgrade asked while the rotation runs waits for it.
	f.edit(func(ct *v1alpha1.ClusterTarget) { ct.Spec.KubernetesVersion = "v1.37.3" })
	ct = f.waitCondition(v1alpha1.ConditionReconciling, metav1.ConditionTrue, clustertarget.ReasonOperationRunning)
	if g := ct.Status.Operations; len(g) != 1 || g[0].Kind != v1alpha1.GeneratedRotateCertificateAuthorities || g[0].Name != rotation {
		t.Fatalf("operations %+v", g)
	}
	f.stillOperations(rotation)

	// The agents do their part; the status names the rotation's phase as it goes, and stops at the
	// approval before phase complete.
	seen := map[string]bool{}
	testutil.Eventually(t, 60*time.Second, "the rotation waits for approval", func() error {
		if err := f.succeedTasks(rotation, nil); err != nil {
			return err
		}
		ct := f.target()
		if g := ct.Status.Operations; len(g) == 1 && g[0].RotationPhase != "" {
			seen[g[0].RotationPhase] = true
		}
		if c := meta.FindStatusCondition(ct.Status.Conditions, v1alpha1.ConditionReconciling); c == nil || c.Reason != clustertarget.ReasonRotationAwaitingApproval {
			return fmt.Errorf("Reconciling %+v", c)
		}
		return nil
	})
	ct = f.target()
	msg := meta.FindStatusCondition(ct.Status.Conditions, v1alpha1.ConditionUpToDate).Message
	if !strings.Contains(msg, "kubectl nodeops approve "+rotation+" --gate complete-rotation") || ct.Status.Operations[0].RotationPhase != plan.RotationComplete {
		t.Errorf("waiting for approval: %q, operations %+v", msg, ct.Status.Operations)
	}
	if !seen[plan.RotationComplete] || len(seen) < 2 {
		t.Errorf("rotation phases seen in the status: %v", seen)
	}
	f.stillOperations(rotation)

	f.must(f.c.Patch(f.ctx, &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: rotation}}, client.RawPatch(types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+v1alpha1.AnnotationApproveGatePrefix+plan.GateCompleteRotation+`":"test"}}}`))))
	f.runOperation(rotation, nil, v1alpha1.OperationSucceeded)
	// Then, and only then, the upgrade.
	f.waitOperations(rotation, "cluster-upgrade-v1.37.3-1")
	ct = f.target()
	if len(ct.Status.Operations) != 2 || ct.Status.Operations[0].Phase != v1alpha1.OperationSucceeded || ct.Status.Operations[0].RotationPhase != "" ||
		ct.Status.LastCertificateAuthorityRotationCount != 1 {
		t.Errorf("status %+v, lastCertificateAuthorityRotationCount %d", ct.Status.Operations, ct.Status.LastCertificateAuthorityRotationCount)
	}
	f.stillOperations(rotation, "cluster-upgrade-v1.37.3-1")
}

// A rotation made by hand holds what the ClusterTarget would generate until it ends: an upgrade
// asked meanwhile waits, and goes once the rotation is aborted (the ClusterTarget watches
// operations it did not generate for that).
func TestHandMadeRotationHoldsGeneration(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.2")
	byHand := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "rotate-cas-by-hand"},
		Spec: v1alpha1.NodeOperationSpec{RotateCertificateAuthorities: &v1alpha1.RotateCertificateAuthoritiesOperation{}}}
	f.must(f.c.Create(f.ctx, byHand))
	f.edit(func(ct *v1alpha1.ClusterTarget) { ct.Spec.KubernetesVersion = "v1.37.3" })
	ct := f.waitCondition(v1alpha1.ConditionUpToDate, metav1.ConditionFalse, clustertarget.ReasonOtherOperationRunning)
	if msg := meta.FindStatusCondition(ct.Status.Conditions, v1alpha1.ConditionUpToDate).Message; !strings.Contains(msg, byHand.Name) {
		t.Errorf("message %q does not name %s", msg, byHand.Name)
	}
	f.stillOperations(byHand.Name)
	f.must(f.c.Patch(f.ctx, byHand, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"abort":true}}`))))
	f.waitOperations("cluster-upgrade-v1.37.3-1", byHand.Name)
}
