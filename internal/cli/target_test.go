package cli

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
)

// `target` shows observed against desired and the plan of what would run next; `target set`
// edits the spec.
func TestTarget(t *testing.T) {
	planCluster(t)
	if _, errOut, code := run(t, "target"); code != CodeError || !strings.Contains(errOut, "no ClusterTarget") {
		t.Errorf("target without a ClusterTarget: exit %d, stderr %q", code, errOut)
	}
	ct := &nodeopsv1.ClusterTarget{ObjectMeta: metav1.ObjectMeta{Name: "cluster"}, Spec: nodeopsv1.ClusterTargetSpec{
		KubernetesVersion: "v1.36.4",
		Upgrade:           nodeopsv1.ClusterUpgrade{BinarySource: &nodeopsv1.BinarySource{BaseURL: "https://bins.local"}},
	}}
	if err := k8s.Create(ctx(t), ct); err != nil {
		t.Fatal(err)
	}
	deleteAtEnd(t, ct)
	// The manager's status, as it writes it for a cluster at v1.36.4 that is up to date.
	ct.Status = nodeopsv1.ClusterTargetStatus{
		ObservedGeneration: ct.Generation, Phase: nodeopsv1.ClusterUpToDate, KubernetesVersion: "v1.36.4",
		Nodes: []nodeopsv1.ObservedNode{
			{Name: "cp-1", KubeletVersion: "v1.36.4", ControlPlane: true, StaticPods: map[string]string{"kube-apiserver": "v1.36.4", "etcd": "3.6.5-0"}},
			{Name: "w-1", KubeletVersion: "v1.36.4"},
		},
		Certificates: []nodeopsv1.ObservedCertificates{{Node: "cp-1", Task: "renew-cp-1",
			Certificates: []nodeopsv1.CertificateExpiry{{Name: "apiserver", NotAfter: *at(240 * 24 * time.Hour)}}}},
		NextCertificateExpiry:          at(240 * 24 * time.Hour),
		NextCertificateAuthorityExpiry: at(3000 * 24 * time.Hour),
		Conditions:                     []metav1.Condition{cond(nodeopsv1.ConditionUpToDate, metav1.ConditionTrue, "UpToDate", "the cluster is at v1.36.4 and no renewal is due")},
	}
	if err := k8s.Status().Update(ctx(t), ct); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, "target")
	for _, want := range []string{
		"ClusterTarget cluster: UpToDate",
		"kubernetes version   v1.36.4, target v1.36.4",
		"next cert expiry     2026-10-27T12:00:00Z (in 240d)",
		"next CA expiry       ",
		"cp-1  control-plane  v1.36.4  etcd 3.6.5-0, kube-apiserver v1.36.4",
		"Next: nothing to generate (the cluster is at v1.36.4 and no renewal is due)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("target output lacks %q:\n%s", want, out)
		}
	}

	out = mustRun(t, "target", "set", "--version", "v1.37.2")
	if !strings.Contains(out, "kubernetesVersion v1.36.4 -> v1.37.2") {
		t.Errorf("set output:\n%s", out)
	}
	out = mustRun(t, "target")
	for _, want := range []string{
		"(the manager has not yet acted on the latest spec: generation 2, observed 1)",
		"Next: NodeOperation cluster-upgrade-v1.37.2-1 (UpgradeDue)",
		"Plan: upgrade to v1.37.2",
		"cluster version v1.36.4 -> v1.37.2: allowed",
		"1. preflight: 7 nodes, all at once",
		"2. control-plane-first: 1 node (the first node by name)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("target output after set lacks %q:\n%s", want, out)
		}
	}

	out = mustRun(t, "target", "set", "--version", "v1.37.2", "--binary-source", "https://mirror.example/k8s",
		"--ignore-preflight-errors", "SystemVerification,CoreDNSMigration")
	for _, want := range []string{"upgrade binarySource https://mirror.example/k8s", "upgrade ignorePreflightErrors [SystemVerification,CoreDNSMigration]"} {
		if !strings.Contains(out, want) {
			t.Errorf("set output lacks %q:\n%s", want, out)
		}
	}
	mustRun(t, "target", "set", "--rotate-certificates")
	mustRun(t, "target", "set", "--rotate-certificates")
	var got nodeopsv1.ClusterTarget
	if err := k8s.Get(ctx(t), client.ObjectKey{Name: "cluster"}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Certificates.RotationCount != 2 || got.Spec.KubernetesVersion != "v1.37.2" ||
		got.Spec.Upgrade.BinarySource == nil || got.Spec.Upgrade.BinarySource.BaseURL != "https://mirror.example/k8s" ||
		strings.Join(got.Spec.Upgrade.IgnorePreflightErrors, ",") != "SystemVerification,CoreDNSMigration" {
		t.Errorf("spec after set: %+v", got.Spec)
	}
	out = mustRun(t, "target", "set", "--rotate-certificate-authorities")
	if !strings.Contains(out, "certificateAuthorities.rotationCount 0 -> 1 (one CA rotation)") {
		t.Errorf("set --rotate-certificate-authorities output:\n%s", out)
	}
	if err := k8s.Get(ctx(t), client.ObjectKey{Name: "cluster"}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.CertificateAuthorities.RotationCount != 1 || got.Spec.Certificates.RotationCount != 2 {
		t.Errorf("spec after --rotate-certificate-authorities: %+v", got.Spec)
	}
	// The manager's status while the rotation it generated runs.
	got.Status.LastCertificateAuthorityRotationCount = 1
	got.Status.Operations = []nodeopsv1.GeneratedOperation{{Name: "cluster-rotate-certificate-authorities-1-1", Kind: nodeopsv1.GeneratedRotateCertificateAuthorities,
		Phase: nodeopsv1.OperationRunning, Reason: "CertificateAuthorityRotationRequested", RotationPhase: "trust-both"}}
	if err := k8s.Status().Update(ctx(t), &got); err != nil {
		t.Fatal(err)
	}
	out = mustRun(t, "target")
	for _, want := range []string{
		"CA rotation          rotationCount 1 (acted on 1), authorities cluster,etcd,front-proxy, serviceAccountKey false, completion Manual",
		"last CA rotation     cluster-rotate-certificate-authorities-1-1, Running (trust-both)",
		"cluster-rotate-certificate-authorities-1-1  RotateCertificateAuthorities  Running (trust-both)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("target output while a rotation runs lacks %q:\n%s", want, out)
		}
	}
	if _, errOut, code := run(t, "target", "set", "--binary-source", "https://b"); code != CodeError || !strings.Contains(errOut, "go with --version") {
		t.Errorf("set --binary-source without --version: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := run(t, "target", "set"); code != CodeError || !strings.Contains(errOut, "--version") {
		t.Errorf("set without flags: exit %d, stderr %q", code, errOut)
	}
}

// conflictOnce answers the first patch with a conflict, as when someone else wrote in between.
type conflictOnce struct {
	Client
	done bool
}

func (c *conflictOnce) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if !c.done {
		c.done = true
		return apierrors.NewConflict(schema.GroupResource{Group: "nodeops.io", Resource: "clustertargets"}, obj.GetName(), errors.New("changed"))
	}
	return c.Client.Patch(ctx, obj, patch, opts...)
}

// `target set` rereads and patches again after a conflict, so rotationCount+1 counts once.
func TestTargetSetRetriesConflict(t *testing.T) {
	var out, errOut syncBuffer
	o := testOptions(&out, &errOut, "")
	var before nodeopsv1.ClusterTarget
	if err := k8s.Get(ctx(t), client.ObjectKey{Name: "cluster"}, &before); apierrors.IsNotFound(err) {
		// Run alone, without TestTarget's: make the singleton here.
		before = nodeopsv1.ClusterTarget{ObjectMeta: metav1.ObjectMeta{Name: "cluster"}, Spec: nodeopsv1.ClusterTargetSpec{
			KubernetesVersion: "v1.36.4",
			Upgrade:           nodeopsv1.ClusterUpgrade{BinarySource: &nodeopsv1.BinarySource{BaseURL: "https://bins.local"}},
		}}
		if err := k8s.Create(ctx(t), &before); err != nil {
			t.Fatal(err)
		}
		deleteAtEnd(t, &before)
	} else if err != nil {
		t.Fatal(err)
	}
	c := &conflictOnce{Client: k8s}
	o.NewClient = func() (Client, error) { return c, nil }
	if code := Run(o, []string{"target", "set", "--rotate-certificates"}); code != 0 || !c.done {
		t.Fatalf("exit %d, conflict seen %v, stderr %s", code, c.done, errOut.String())
	}
	var after nodeopsv1.ClusterTarget
	if err := k8s.Get(ctx(t), client.ObjectKey{Name: "cluster"}, &after); err != nil {
		t.Fatal(err)
	}
	if after.Spec.Certificates.RotationCount != before.Spec.Certificates.RotationCount+1 {
		t.Errorf("rotationCount %d -> %d, want one more", before.Spec.Certificates.RotationCount, after.Spec.Certificates.RotationCount)
	}
}
