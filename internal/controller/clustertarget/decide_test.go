package clustertarget

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/plan"
)

var now = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func target(version string, mutate ...func(*v1alpha1.ClusterTarget)) *v1alpha1.ClusterTarget {
	ct := &v1alpha1.ClusterTarget{ObjectMeta: metav1.ObjectMeta{Name: "cluster", UID: "u", Generation: 1},
		Spec: v1alpha1.ClusterTargetSpec{KubernetesVersion: version,
			Upgrade: v1alpha1.ClusterUpgrade{BinarySource: &v1alpha1.BinarySource{BaseURL: "https://example"}}}}
	for _, m := range mutate {
		m(ct)
	}
	return ct
}

func certs(notAfter time.Time) []v1alpha1.ObservedCertificates {
	return []v1alpha1.ObservedCertificates{{Node: "cp", Certificates: []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: metav1.NewTime(notAfter)}}}}
}

func TestDecide(t *testing.T) {
	renewed := metav1.NewTime(now.Add(-time.Hour))
	tests := []struct {
		name string
		in   input
		// create is the name of the operation generated, "" for none.
		create, phase, reason string
		upToDate, stalled     bool
	}{
		{name: "fresh install", in: input{ct: target("v1.37.2"), clusterVersion: "v1.37.2"},
			phase: "UpToDate", reason: ReasonUpToDate, upToDate: true},
		{name: "patch upgrade", in: input{ct: target("v1.37.2"), clusterVersion: "v1.37.0"},
			create: "cluster-upgrade-v1.37.2-1", phase: "Progressing", reason: ReasonOperationCreated},
		{name: "two minors without a path", in: input{ct: target("v1.37.2"), clusterVersion: "v1.35.3"},
			phase: "Waiting", reason: "UnsupportedVersionSkew", stalled: true},
		{name: "two minors with a path", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) { ct.Spec.Upgrade.Path = []string{"v1.36.4"} }), clusterVersion: "v1.35.3"},
			create: "cluster-upgrade-v1.36.4-1", phase: "Progressing", reason: ReasonOperationCreated},
		{name: "downgrade", in: input{ct: target("v1.36.0"), clusterVersion: "v1.37.2"},
			phase: "Waiting", reason: "UnsupportedVersionSkew", stalled: true},
		{name: "no kubeadm-config", in: input{ct: target("v1.37.2"), versionProblem: "gone"},
			phase: "Waiting", reason: ReasonNoKubeadmConfig, stalled: true},
		{name: "no binary source", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) { ct.Spec.Upgrade.BinarySource = nil }), clusterVersion: "v1.36.3"},
			phase: "Waiting", reason: ReasonInvalidSpec, stalled: true},
		{name: "paused", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) { ct.Spec.Paused = true }), clusterVersion: "v1.36.3"},
			phase: "Paused", reason: ReasonPaused},
		{name: "running operation", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) {
			ct.Status.Operations = []v1alpha1.GeneratedOperation{{Name: "cluster-upgrade-v1.37.2-1", Kind: "Upgrade", Phase: "Pending", KubernetesVersion: "v1.37.2", Generation: 1}}
		}), clusterVersion: "v1.36.3", ops: map[string]opView{"cluster-upgrade-v1.37.2-1": {Phase: "Running"}}},
			phase: "Progressing", reason: ReasonOperationRunning},
		{name: "blocked operation", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) {
			ct.Status.Operations = []v1alpha1.GeneratedOperation{{Name: "cluster-upgrade-v1.37.2-1", Kind: "Upgrade", Phase: "Running", KubernetesVersion: "v1.37.2", Generation: 1}}
		}), clusterVersion: "v1.36.3", ops: map[string]opView{"cluster-upgrade-v1.37.2-1": {Phase: "Blocked", Reason: "CommandFailed"}}},
			phase: "Blocked", reason: ReasonOperationBlocked, stalled: true},
		{name: "deleted by hand is not made again", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) {
			ct.Status.Operations = []v1alpha1.GeneratedOperation{{Name: "cluster-upgrade-v1.37.2-1", Kind: "Upgrade", Phase: "Running", KubernetesVersion: "v1.37.2", Generation: 1}}
		}), clusterVersion: "v1.36.3"},
			phase: "Waiting", reason: ReasonOperationFailed, stalled: true},
		{name: "deleted by hand before it started is not made again", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) {
			ct.Status.Operations = []v1alpha1.GeneratedOperation{{Name: "cluster-upgrade-v1.37.2-1", Kind: "Upgrade", Phase: "Pending", KubernetesVersion: "v1.37.2", Generation: 1}}
		}), clusterVersion: "v1.36.3"},
			phase: "Waiting", reason: ReasonOperationFailed, stalled: true},
		{name: "recorded, not yet created: recorded again", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) {
			ct.Status.Operations = []v1alpha1.GeneratedOperation{{Name: "cluster-upgrade-v1.37.2-1", Kind: "Upgrade", KubernetesVersion: "v1.37.2", Generation: 1}}
		}), clusterVersion: "v1.36.3"},
			create: "cluster-upgrade-v1.37.2-1", phase: "Progressing", reason: ReasonOperationCreated},
		{name: "failed is tried again after a spec change", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) {
			ct.Generation = 2
			ct.Status.Operations = []v1alpha1.GeneratedOperation{{Name: "cluster-upgrade-v1.37.2-1", Kind: "Upgrade", Phase: "Aborted", KubernetesVersion: "v1.37.2", Generation: 1}}
		}), clusterVersion: "v1.36.3", ops: map[string]opView{"cluster-upgrade-v1.37.2-1": {Phase: "Aborted"}}},
			create: "cluster-upgrade-v1.37.2-2", phase: "Progressing", reason: ReasonOperationCreated},
		{name: "succeeded, version not yet observed", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) {
			ct.Status.Operations = []v1alpha1.GeneratedOperation{{Name: "cluster-upgrade-v1.37.2-1", Kind: "Upgrade", Phase: "Succeeded", KubernetesVersion: "v1.37.2", Generation: 1, ExecutionMode: "Auto"}}
		}), clusterVersion: "v1.36.3", ops: map[string]opView{"cluster-upgrade-v1.37.2-1": {Phase: "Succeeded", Mode: "Auto"}}},
			phase: "Progressing", reason: ReasonAwaitingObservedVersion},
		{name: "rotation", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) { ct.Spec.Certificates.RotationCount = 1 }), clusterVersion: "v1.37.2"},
			create: "cluster-rotate-certificates-1-1", phase: "Progressing", reason: ReasonOperationCreated},
		{name: "upgrade before rotation", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) { ct.Spec.Certificates.RotationCount = 1 }), clusterVersion: "v1.36.3"},
			create: "cluster-upgrade-v1.37.2-1", phase: "Progressing", reason: ReasonOperationCreated},
		{name: "rotation already acted on", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) {
			ct.Spec.Certificates.RotationCount = 1
			ct.Status.LastRotationCount = 1
		}), clusterVersion: "v1.37.2"},
			phase: "UpToDate", reason: ReasonUpToDate, upToDate: true},
		{name: "a renewal recorded for a raise, not yet created: created as recorded", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) {
			ct.Spec.Certificates.RotationCount = 1
			ct.Status.LastRotationCount = 1
			ct.Status.Operations = []v1alpha1.GeneratedOperation{{Name: "cluster-rotate-certificates-1-1", Kind: "RenewCertificates", Reason: ReasonRotationRequested, Generation: 1}}
		}), clusterVersion: "v1.37.2"},
			create: "cluster-rotate-certificates-1-1", phase: "Progressing", reason: ReasonOperationCreated},
		{name: "expiring, autoRenew off", in: input{ct: target("v1.37.2"), clusterVersion: "v1.37.2", certs: certs(now.Add(24 * time.Hour))},
			phase: "UpToDate", reason: ReasonUpToDate, upToDate: true},
		{name: "expiring", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) { ct.Spec.Certificates.AutoRenew = true }), clusterVersion: "v1.37.2", certs: certs(now.Add(24 * time.Hour))},
			create: "cluster-renew-certificates-expiring-20261202-1", phase: "Progressing", reason: ReasonOperationCreated},
		{name: "renewBefore no renewal satisfies", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) {
			ct.Spec.Certificates.AutoRenew = true
			ct.Spec.Certificates.RenewBefore = &metav1.Duration{Duration: 2 * 365 * 24 * time.Hour}
			ct.Status.Operations = []v1alpha1.GeneratedOperation{{Name: "cluster-renew-certificates-expiring-20261202-1", Kind: "RenewCertificates", Phase: "Succeeded", Generation: 1}}
		}), clusterVersion: "v1.37.2", certs: certs(now.Add(365 * 24 * time.Hour)),
			ops: map[string]opView{"cluster-renew-certificates-expiring-20261202-1": {Phase: "Succeeded", Completion: &renewed}}},
			phase: "Waiting", reason: ReasonRenewBeforeUnsatisfiable, stalled: true},
		{name: "a renewal that did not move expiry is reported, not repeated", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) {
			ct.Spec.Certificates.AutoRenew = true
			ct.Status.Operations = []v1alpha1.GeneratedOperation{{Name: "cluster-renew-certificates-expiring-20261202-1", Kind: "RenewCertificates", Phase: "Succeeded", Generation: 1}}
		}), clusterVersion: "v1.37.2", certs: certs(now.Add(24 * time.Hour)),
			ops: map[string]opView{"cluster-renew-certificates-expiring-20261202-1": {Phase: "Succeeded", Completion: &renewed}}},
			phase: "Waiting", reason: ReasonRenewalDidNotMoveExpiry, stalled: true},
		{name: "a reading with a problem counts for nothing", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) { ct.Spec.Certificates.AutoRenew = true }), clusterVersion: "v1.37.2",
			certs: []v1alpha1.ObservedCertificates{{Node: "cp", Problem: "out of range", Certificates: []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: metav1.NewTime(now.Add(24 * time.Hour))}}}}},
			phase: "UpToDate", reason: ReasonUpToDate, upToDate: true},
		{name: "dry run done", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) {
			ct.Spec.ExecutionMode = v1alpha1.ExecutionDryRun
			ct.Status.Operations = []v1alpha1.GeneratedOperation{{Name: "cluster-upgrade-v1.37.2-1", Kind: "Upgrade", Phase: "Succeeded", KubernetesVersion: "v1.37.2", Generation: 1, ExecutionMode: "DryRun"}}
		}), clusterVersion: "v1.36.3", ops: map[string]opView{"cluster-upgrade-v1.37.2-1": {Phase: "Succeeded", Mode: "DryRun"}}},
			phase: "Waiting", reason: ReasonDryRunSucceeded},
		{name: "for real after a dry run", in: input{ct: target("v1.37.2", func(ct *v1alpha1.ClusterTarget) {
			ct.Generation = 2
			ct.Status.Operations = []v1alpha1.GeneratedOperation{{Name: "cluster-upgrade-v1.37.2-1", Kind: "Upgrade", Phase: "Succeeded", KubernetesVersion: "v1.37.2", Generation: 1, ExecutionMode: "DryRun"}}
		}), clusterVersion: "v1.36.3", ops: map[string]opView{"cluster-upgrade-v1.37.2-1": {Phase: "Succeeded", Mode: "DryRun"}}},
			create: "cluster-upgrade-v1.37.2-2", phase: "Progressing", reason: ReasonOperationCreated},
		{name: "status lost: the operation is adopted, not made again", in: input{ct: target("v1.37.2"), clusterVersion: "v1.36.3",
			ops: map[string]opView{"cluster-upgrade-v1.37.2-1": {Phase: "Running"}}, opOrder: []string{"cluster-upgrade-v1.37.2-1"},
			opKinds: map[string]v1alpha1.GeneratedOperationKind{"cluster-upgrade-v1.37.2-1": "Upgrade"}, opVersions: map[string]string{"cluster-upgrade-v1.37.2-1": "v1.37.2"}},
			phase: "Progressing", reason: ReasonOperationRunning},
		{name: "kubelets behind", in: input{ct: target("v1.37.2"), clusterVersion: "v1.37.2", nodes: []v1alpha1.ObservedNode{{Name: "w", KubeletVersion: "v1.36.3"}}},
			phase: "Waiting", reason: ReasonNodesBehind},
	}
	for _, tt := range tests {
		d, got := decideAt(&tt.in, now)
		st := d.status
		up := meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionUpToDate)
		stalled := meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionStalled)
		reason := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionUpToDate).Reason
		if got != tt.create || string(st.Phase) != tt.phase || reason != tt.reason || up != tt.upToDate || stalled != tt.stalled {
			t.Errorf("%s: created %q phase %s reason %s upToDate %v stalled %v; want %q %s %s %v %v\n%+v",
				tt.name, got, st.Phase, reason, up, stalled, tt.create, tt.phase, tt.reason, tt.upToDate, tt.stalled, st.Conditions)
		}
		for _, c := range st.Conditions {
			if c.Reason == "" {
				t.Errorf("%s: condition %s has no reason", tt.name, c.Type)
			}
		}
		if tt.reason == "UnsupportedVersionSkew" {
			msg := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionStalled).Message
			if !strings.Contains(msg, tt.in.clusterVersion) || !strings.Contains(msg, tt.in.ct.Spec.KubernetesVersion) {
				t.Errorf("%s: message %q must name both versions", tt.name, msg)
			}
		}
		// Deciding again from the status written must change nothing: zero writes at rest.
		again := tt.in
		ct := tt.in.ct.DeepCopy()
		ct.Status = st
		again.ct = ct
		if d.create != nil {
			again.ops = map[string]opView{d.create.Name: {Phase: ""}}
			for k, v := range tt.in.ops {
				again.ops[k] = v
			}
		}
		if d2 := decide(&again); d2.create != nil {
			t.Errorf("%s: deciding again generates %s too", tt.name, d2.create.Name)
		}
	}
}

func TestImageTag(t *testing.T) {
	for in, want := range map[string]string{
		"registry.k8s.io/kube-apiserver:v1.37.2":            "v1.37.2",
		"localhost:5000/kube-apiserver:v1.37.2@sha256:abcd": "v1.37.2",
		"localhost:5000/kube-apiserver":                     "",
		"kube-apiserver":                                    "",
	} {
		if got := imageTag(in); got != want {
			t.Errorf("imageTag(%q) = %q, want %q", in, got, want)
		}
	}
}

// Only control planes' readings count, by their label as the manager sees the Node, from their
// annotation or their tasks; a reading outside the cluster CA's validity is kept with its problem.
func TestObserveCertificates(t *testing.T) {
	node := func(name string, cp bool, notAfter time.Time) corev1.Node {
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{
			v1alpha1.AnnotationCertificates: v1alpha1.EncodeCertificates([]v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: metav1.NewTime(notAfter)}}),
		}}}
		if cp {
			n.Labels["node-role.kubernetes.io/control-plane"] = ""
		}
		return n
	}
	day := 24 * time.Hour
	task := v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "renew-w"}, Spec: v1alpha1.NodeTaskSpec{NodeName: "w"},
		Status: v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskSucceeded, Certificates: []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: metav1.NewTime(now.Add(day))}}}}
	nodes := []corev1.Node{node("cp", true, now.Add(300*day)), node("w", false, now.Add(day))}
	got := observeCertificates(nodes, []v1alpha1.NodeTask{task}, caValidity{})
	if len(got) != 1 || got[0].Node != "cp" || got[0].Problem != "" {
		t.Fatalf("readings %+v; want cp's alone", got)
	}
	ca := caValidity{notBefore: now.Add(-365 * day), notAfter: now.Add(9 * 365 * day)}
	if got := observeCertificates(nodes, nil, ca); len(got) != 1 || got[0].Problem != "" {
		t.Fatalf("a reading within the CA's validity: %+v", got)
	}
	late := []corev1.Node{node("cp", true, now.Add(20*365*day))}
	got = observeCertificates(late, nil, ca)
	if len(got) != 1 || !strings.Contains(got[0].Problem, "out of range") {
		t.Fatalf("a leaf expiring after its CA: %+v; want a problem", got)
	}
	if next := nextExpiry(got); next != nil {
		t.Fatalf("next expiry %v from a reading with a problem", next)
	}
}

// A control plane's certificate authorities are shown beside its leaves and never count as a leaf:
// a CA expiring before every leaf moves nextCertificateAuthorityExpiry, not nextCertificateExpiry
// (which renewals act on, and no renewal moves a CA); a renewal's newer leaves keep the agent's CAs.
func TestObserveCertificateAuthorities(t *testing.T) {
	day := 24 * time.Hour
	caSoon, leaf := metav1.NewTime(now.Add(30*day).Truncate(time.Second)), metav1.NewTime(now.Add(300*day).Truncate(time.Second))
	cp := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp", Labels: map[string]string{"node-role.kubernetes.io/control-plane": ""},
		Annotations: map[string]string{v1alpha1.AnnotationCertificates: v1alpha1.EncodeCertificates([]v1alpha1.CertificateExpiry{
			{Name: "apiserver", NotAfter: leaf}, {Name: "ca", NotAfter: caSoon}, {Name: "etcd-ca", NotAfter: metav1.NewTime(caSoon.Add(day))}})}}}
	got := observeCertificates([]corev1.Node{cp}, nil, caValidity{})
	if len(got) != 1 || len(got[0].Certificates) != 1 || got[0].Certificates[0].Name != "apiserver" ||
		len(got[0].CertificateAuthorities) != 2 || got[0].CertificateAuthorities[0].Name != "ca" {
		t.Fatalf("readings %+v", got)
	}
	if next := nextExpiry(got); next == nil || !next.Equal(&leaf) {
		t.Errorf("next certificate expiry %v, want the leaf's %v: a CA is no certificate a renewal renews", next, leaf)
	}
	if next := nextAuthorityExpiry(got); next == nil || !next.Equal(&caSoon) {
		t.Errorf("next certificate authority expiry %v, want %v", next, caSoon)
	}
	renewed := metav1.NewTime(now.Add(365 * day).Truncate(time.Second))
	task := v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "renew-cp"}, Spec: v1alpha1.NodeTaskSpec{NodeName: "cp"},
		Status: v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskSucceeded, Certificates: []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: renewed}}}}
	got = observeCertificates([]corev1.Node{cp}, []v1alpha1.NodeTask{task}, caValidity{})
	if len(got) != 1 || got[0].Task != "renew-cp" || len(got[0].CertificateAuthorities) != 2 {
		t.Fatalf("with a renewal's newer reading: %+v", got)
	}
}

func withControlPlane(ct *v1alpha1.ClusterTarget) {
	ct.Spec.ControlPlane = &v1alpha1.ClusterConfigurationPatch{APIServer: &v1alpha1.APIServerPatch{
		ControlPlaneComponentPatch: v1alpha1.ControlPlaneComponentPatch{ExtraArgs: []v1alpha1.ExtraArg{{Name: "audit-log-maxage", Value: "30"}}}}}
	ct.Spec.Kubelet = &v1alpha1.ClusterKubelet{Configuration: "maxPods: 150\n"}
}

// The controlPlane and kubelet sections generate one reconfigure while kube-system's configuration
// lacks them, after any upgrade due, and none once it holds them; a configuration nodeops cannot
// read stalls with its reason.
func TestDecideReconfigure(t *testing.T) {
	ct := target("v1.37.2", withControlPlane)
	name := "cluster-reconfigure-" + ReconfigureHash(ct) + "-1"
	pending := []string{"kubeadm-config (apiServer)", "kubelet-config"}
	tests := []struct {
		name                  string
		in                    input
		create, phase, reason string
	}{
		{"lacking", input{ct: ct, clusterVersion: "v1.37.2", reconfigure: pending}, name, "Progressing", ReasonOperationCreated},
		{"an upgrade first", input{ct: ct, clusterVersion: "v1.37.0", reconfigure: pending}, "cluster-upgrade-v1.37.2-1", "Progressing", ReasonOperationCreated},
		{"held", input{ct: ct, clusterVersion: "v1.37.2"}, "", "UpToDate", ReasonUpToDate},
		{"unreadable", input{ct: ct, clusterVersion: "v1.37.2", reconfigureProblem: "kube-system/kubelet-config not found"}, "", "Waiting", ReasonInvalidConfiguration},
		{"succeeded, the cache not caught up", input{ct: target("v1.37.2", withControlPlane, func(ct *v1alpha1.ClusterTarget) {
			ct.Status.Operations = []v1alpha1.GeneratedOperation{{Name: name, Kind: v1alpha1.GeneratedReconfigure, Phase: "Succeeded", Generation: 1, ExecutionMode: v1alpha1.ExecutionAuto}}
		}), clusterVersion: "v1.37.2", reconfigure: pending, ops: map[string]opView{name: {Phase: "Succeeded", Mode: v1alpha1.ExecutionAuto}}}, "", "Progressing", ReasonAwaitingObservedVersion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := decide(&tt.in)
			got := ""
			if d.create != nil {
				got = d.create.Name
			}
			if got != tt.create || string(d.status.Phase) != tt.phase {
				t.Fatalf("created %q phase %s, want %q %s; conditions %+v", got, d.status.Phase, tt.create, tt.phase, d.status.Conditions)
			}
			if c := meta.FindStatusCondition(d.status.Conditions, v1alpha1.ConditionUpToDate); c == nil || c.Reason != tt.reason {
				t.Errorf("UpToDate condition %+v, want reason %s", c, tt.reason)
			}
			if d.create != nil && d.create.Kind == v1alpha1.GeneratedReconfigure {
				op := Operation(tt.in.ct, d.create)
				r := op.Spec.Reconfigure
				if r == nil || r.KubeletConfiguration != "maxPods: 150\n" || r.ClusterConfiguration.APIServer.ExtraArgs[0].Value != "30" {
					t.Errorf("generated spec %+v", op.Spec)
				}
			}
		})
	}
}

// The controlPlane section carries etcd's flags and the API server certificate's names into the
// reconfigure it generates, whose plan regenerates etcd and re-issues the certificate.
func TestGeneratedReconfigureCarriesEtcdAndCertSANs(t *testing.T) {
	ct := target("v1.37.2", func(ct *v1alpha1.ClusterTarget) {
		ct.Spec.ControlPlane = &v1alpha1.ClusterConfigurationPatch{
			APIServer: &v1alpha1.APIServerPatch{CertSANs: []string{"api.example.com"}},
			Etcd:      &v1alpha1.EtcdPatch{ExtraArgs: []v1alpha1.ExtraArg{{Name: "snapshot-count", Value: "5000"}}},
		}
	})
	d := decide(&input{ct: ct, clusterVersion: "v1.37.2", reconfigure: []string{"kubeadm-config (apiServer, etcd)"}})
	if d.create == nil || d.create.Kind != v1alpha1.GeneratedReconfigure {
		t.Fatalf("created %+v, want a reconfigure", d.create)
	}
	op := Operation(ct, d.create)
	groups, err := plan.Expand(&op.Spec)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, g := range groups {
		if g.Name != plan.GroupFirstControlPlane {
			continue
		}
		for _, c := range g.Commands {
			kinds = append(kinds, c.Kind())
			if n := c.KubeadmReconfigureNode; n != nil && (n.ClusterConfiguration.Etcd == nil || !n.ControlPlane) {
				t.Errorf("kubeadmReconfigureNode %+v does not regenerate etcd", n)
			}
			if r := c.KubeadmReissueAPIServerCertificate; r != nil && strings.Join(r.CertSANs, ",") != "api.example.com" {
				t.Errorf("re-issued with %v", r.CertSANs)
			}
		}
	}
	if got := strings.Join(kinds, " "); got != "kubeadmUpdateConfig kubeadmReconfigureNode kubeadmReissueAPIServerCertificate restartStaticPods waitNodeReady" {
		t.Errorf("the first control plane runs %s", got)
	}
}

const caRotation1 = "cluster-rotate-certificate-authorities-1-1"

// withCARotation raises certificateAuthorities.rotationCount to n.
func withCARotation(n int32) func(*v1alpha1.ClusterTarget) {
	return func(ct *v1alpha1.ClusterTarget) { ct.Spec.CertificateAuthorities.RotationCount = n }
}

// generated records g in the ClusterTarget's history, with the count it acted on.
func generated(g v1alpha1.GeneratedOperation, lastCA int32) func(*v1alpha1.ClusterTarget) {
	return func(ct *v1alpha1.ClusterTarget) {
		if g.Generation == 0 {
			g.Generation = 1
		}
		ct.Status.Operations = append(ct.Status.Operations, g)
		ct.Status.LastCertificateAuthorityRotationCount = lastCA
	}
}

// Raising certificateAuthorities.rotationCount generates one rotation per raise, before an upgrade
// or renewal due, never while a generated (or hand-made) upgrade or renewal runs; while a rotation
// is unfinished, or ended without succeeding, no upgrade or renewal is generated; a rotation recorded
// but not created (a restart between the status write and the create) is created as recorded, and
// one already made (a lost status, a stale view) is never made again.
func TestDecideCertificateAuthorityRotation(t *testing.T) {
	rot := func(phase v1alpha1.OperationPhase, rotationPhase string) v1alpha1.GeneratedOperation {
		return v1alpha1.GeneratedOperation{Name: caRotation1, Kind: v1alpha1.GeneratedRotateCertificateAuthorities, Phase: phase,
			Reason: ReasonCARotationRequested, ExecutionMode: v1alpha1.ExecutionAuto, RotationPhase: rotationPhase}
	}
	upgrade := v1alpha1.GeneratedOperation{Name: "cluster-upgrade-v1.37.2-1", Kind: v1alpha1.GeneratedUpgrade, Phase: "Running", KubernetesVersion: "v1.37.2", ExecutionMode: v1alpha1.ExecutionAuto}
	renewal := v1alpha1.GeneratedOperation{Name: "cluster-rotate-certificates-1-1", Kind: v1alpha1.GeneratedRenewCertificates, Phase: "Running", Reason: ReasonRotationRequested, ExecutionMode: v1alpha1.ExecutionAuto}
	expiring := func(ct *v1alpha1.ClusterTarget) { ct.Spec.Certificates.AutoRenew = true }
	tests := []struct {
		name string
		in   input
		// create is the operation generated, "" for none; lastCA the count recorded as acted on.
		create, phase, reason string
		lastCA                int32
		// says is a part of the UpToDate condition's message.
		says string
	}{
		{name: "raised: one rotation", in: input{ct: target("v1.37.2", withCARotation(1)), clusterVersion: "v1.37.2"},
			create: caRotation1, phase: "Progressing", reason: ReasonOperationCreated, lastCA: 1, says: "certificateAuthorities.rotationCount raised to 1"},
		{name: "raised by three at once: one rotation", in: input{ct: target("v1.37.2", withCARotation(3)), clusterVersion: "v1.37.2"},
			create: "cluster-rotate-certificate-authorities-3-1", phase: "Progressing", reason: ReasonOperationCreated, lastCA: 3},
		{name: "acted on", in: input{ct: target("v1.37.2", withCARotation(1), generated(rot("Succeeded", ""), 1)), clusterVersion: "v1.37.2",
			ops: map[string]opView{caRotation1: {Phase: "Succeeded", Mode: v1alpha1.ExecutionAuto}}},
			phase: "UpToDate", reason: ReasonUpToDate, lastCA: 1},
		{name: "raised again after a rotation succeeded", in: input{ct: target("v1.37.2", withCARotation(2), generated(rot("Succeeded", ""), 1)), clusterVersion: "v1.37.2",
			ops: map[string]opView{caRotation1: {Phase: "Succeeded", Mode: v1alpha1.ExecutionAuto}}},
			create: "cluster-rotate-certificate-authorities-2-1", phase: "Progressing", reason: ReasonOperationCreated, lastCA: 2},
		{name: "asked with an upgrade: the rotation first", in: input{ct: target("v1.37.2", withCARotation(1)), clusterVersion: "v1.37.0"},
			create: caRotation1, phase: "Progressing", reason: ReasonOperationCreated, lastCA: 1},
		{name: "asked with a renewal due: the rotation first", in: input{ct: target("v1.37.2", withCARotation(1), expiring), clusterVersion: "v1.37.2", certs: certs(now.Add(24 * time.Hour))},
			create: caRotation1, phase: "Progressing", reason: ReasonOperationCreated, lastCA: 1},
		{name: "not while a generated upgrade runs", in: input{ct: target("v1.37.2", withCARotation(1), generated(upgrade, 0)), clusterVersion: "v1.37.0",
			ops: map[string]opView{upgrade.Name: {Phase: "Running"}}},
			phase: "Progressing", reason: ReasonOperationRunning, says: "cluster-upgrade-v1.37.2-1 is Running"},
		{name: "not while a generated renewal runs", in: input{ct: target("v1.37.2", withCARotation(1), generated(renewal, 0)), clusterVersion: "v1.37.2",
			ops: map[string]opView{renewal.Name: {Phase: "Running"}}},
			phase: "Progressing", reason: ReasonOperationRunning},
		{name: "not while an upgrade made by hand runs", in: input{ct: target("v1.37.2", withCARotation(1)), clusterVersion: "v1.37.2",
			others: map[v1alpha1.GeneratedOperationKind]string{v1alpha1.GeneratedUpgrade: "by-hand"}},
			phase: "Waiting", reason: ReasonOtherOperationRunning, says: "waits for NodeOperation by-hand"},
		{name: "no upgrade while a rotation runs", in: input{ct: target("v1.37.2", withCARotation(1), generated(rot("Running", ""), 1)), clusterVersion: "v1.37.0",
			ops: map[string]opView{caRotation1: {Phase: "Running", RotationPhase: "trust-both"}}},
			phase: "Progressing", reason: ReasonOperationRunning, lastCA: 1, says: "in phase trust-both"},
		{name: "no renewal while a rotation waits for approval", in: input{ct: target("v1.37.2", withCARotation(1), expiring, generated(rot("Running", "complete"), 1)), clusterVersion: "v1.37.2",
			certs: certs(now.Add(24 * time.Hour)), ops: map[string]opView{caRotation1: {Phase: "Running", RotationPhase: "complete", AwaitingApproval: true}}},
			phase: "Progressing", reason: ReasonRotationAwaitingApproval, lastCA: 1, says: "kubectl nodeops approve " + caRotation1 + " --gate complete-rotation"},
		{name: "a blocked rotation blocks", in: input{ct: target("v1.37.2", withCARotation(1), generated(rot("Running", "re-issue"), 1)), clusterVersion: "v1.37.0",
			ops: map[string]opView{caRotation1: {Phase: "Blocked", Reason: "CommandFailed", RotationPhase: "re-issue"}}},
			phase: "Blocked", reason: ReasonOperationBlocked, lastCA: 1},
		{name: "no upgrade after a rotation aborted", in: input{ct: target("v1.37.2", withCARotation(1), generated(rot("Running", "trust-both"), 1)), clusterVersion: "v1.37.0",
			ops: map[string]opView{caRotation1: {Phase: "Aborted", Mode: v1alpha1.ExecutionAuto, RotationPhase: "trust-both"}}},
			phase: "Waiting", reason: ReasonRotationUnfinished, lastCA: 1, says: caRotation1 + " ended Aborted in phase trust-both"},
		{name: "no renewal after a rotation deleted by hand", in: input{ct: target("v1.37.2", withCARotation(1), expiring, generated(rot("Running", "prepare"), 1)), clusterVersion: "v1.37.2",
			certs: certs(now.Add(24 * time.Hour))},
			phase: "Waiting", reason: ReasonRotationUnfinished, lastCA: 1, says: "ended Deleted"},
		{name: "raised again after a rotation aborted: a new rotation", in: input{ct: target("v1.37.2", withCARotation(2), generated(rot("Aborted", "trust-both"), 1)), clusterVersion: "v1.37.0",
			ops: map[string]opView{caRotation1: {Phase: "Aborted", Mode: v1alpha1.ExecutionAuto}}},
			create: "cluster-rotate-certificate-authorities-2-1", phase: "Progressing", reason: ReasonOperationCreated, lastCA: 2},
		{name: "an upgrade after a dry run's rotation", in: input{ct: target("v1.37.2", withCARotation(1), generated(rot("Succeeded", ""), 1)), clusterVersion: "v1.37.0",
			ops: map[string]opView{caRotation1: {Phase: "Aborted", Mode: v1alpha1.ExecutionDryRun}}},
			create: "cluster-upgrade-v1.37.2-1", phase: "Progressing", reason: ReasonOperationCreated, lastCA: 1},
		{name: "an upgrade after a rotation succeeded", in: input{ct: target("v1.37.2", withCARotation(1), generated(rot("Succeeded", ""), 1)), clusterVersion: "v1.37.0",
			ops: map[string]opView{caRotation1: {Phase: "Succeeded", Mode: v1alpha1.ExecutionAuto}}},
			create: "cluster-upgrade-v1.37.2-1", phase: "Progressing", reason: ReasonOperationCreated, lastCA: 1},
		{name: "nothing while a rotation made by hand runs", in: input{ct: target("v1.37.2", expiring), clusterVersion: "v1.37.0", certs: certs(now.Add(24 * time.Hour)),
			others: map[v1alpha1.GeneratedOperationKind]string{v1alpha1.GeneratedRotateCertificateAuthorities: "rotate-cas"}},
			phase: "Waiting", reason: ReasonOtherOperationRunning, says: "NodeOperation rotate-cas"},
		{name: "restart after the record, before the create: created as recorded", in: input{ct: target("v1.37.2", withCARotation(1), generated(rot("", ""), 1)), clusterVersion: "v1.37.2"},
			create: caRotation1, phase: "Progressing", reason: ReasonOperationCreated, lastCA: 1},
		{name: "recorded, then paused: still created as recorded", in: input{ct: target("v1.37.2", withCARotation(1), generated(rot("", ""), 1), func(ct *v1alpha1.ClusterTarget) { ct.Spec.Paused = true }), clusterVersion: "v1.37.2"},
			create: caRotation1, phase: "Progressing", reason: ReasonOperationCreated, lastCA: 1},
		{name: "status lost: the rotation is adopted, not made again", in: input{ct: target("v1.37.2", withCARotation(1)), clusterVersion: "v1.37.2",
			ops: map[string]opView{caRotation1: {Phase: "Running", RotationPhase: "prepare"}}, opOrder: []string{caRotation1},
			opKinds: map[string]v1alpha1.GeneratedOperationKind{caRotation1: v1alpha1.GeneratedRotateCertificateAuthorities}},
			phase: "Progressing", reason: ReasonOperationRunning, lastCA: 1},
		{name: "status lost after it succeeded: not made again", in: input{ct: target("v1.37.2", withCARotation(1)), clusterVersion: "v1.37.2",
			ops: map[string]opView{caRotation1: {Phase: "Succeeded", Mode: v1alpha1.ExecutionAuto}}, opOrder: []string{caRotation1},
			opKinds: map[string]v1alpha1.GeneratedOperationKind{caRotation1: v1alpha1.GeneratedRotateCertificateAuthorities}},
			phase: "UpToDate", reason: ReasonUpToDate, lastCA: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, got := decideAt(&tt.in, now)
			st := d.status
			up := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionUpToDate)
			if got != tt.create || string(st.Phase) != tt.phase || up.Reason != tt.reason || st.LastCertificateAuthorityRotationCount != tt.lastCA {
				t.Fatalf("created %q phase %s reason %s lastCA %d; want %q %s %s %d\n%+v",
					got, st.Phase, up.Reason, st.LastCertificateAuthorityRotationCount, tt.create, tt.phase, tt.reason, tt.lastCA, st.Conditions)
			}
			if !strings.Contains(up.Message, tt.says) {
				t.Errorf("message %q lacks %q", up.Message, tt.says)
			}
			if d.create != nil && d.create.Kind == v1alpha1.GeneratedRotateCertificateAuthorities {
				if n := len(st.Operations); n == 0 || st.Operations[n-1].Name != got {
					t.Errorf("the rotation is not recorded in the status written before its create: %+v", st.Operations)
				}
			}
			// Deciding again from the status written, the operation created (or not yet seen in the
			// cache) or the status write lost to a conflict (the stale object again), never makes a
			// second operation: the name is the same, and a create of it finds it there.
			ct := tt.in.ct.DeepCopy()
			ct.Status = st
			for _, seen := range []bool{true, false} {
				again := tt.in
				again.ct = ct
				again.ops = map[string]opView{}
				for k, v := range tt.in.ops {
					again.ops[k] = v
				}
				if d.create != nil && seen {
					again.ops[d.create.Name] = opView{Phase: ""}
				}
				if d2 := decide(&again); d2.create != nil && (seen || d2.create.Name != got) {
					t.Errorf("deciding again (operation seen %v) generates %s too", seen, d2.create.Name)
				}
			}
			stale := tt.in
			if d2 := decide(&stale); (d2.create == nil) != (d.create == nil) || d.create != nil && d2.create.Name != got {
				t.Errorf("deciding on the same (stale) object again generates %+v, not %q", d2.create, got)
			}
		})
	}
}

// The generated rotation carries the target's authorities, serviceAccountKey and completion
// (Manual when unset), its executionMode, windows and workers' maxUnavailable; its plan is the
// rotation's four phases.
func TestGeneratedRotationSpec(t *testing.T) {
	ct := target("v1.37.2", withCARotation(1), func(ct *v1alpha1.ClusterTarget) {
		ct.Spec.CertificateAuthorities.Authorities = []string{v1alpha1.AuthorityCluster, v1alpha1.AuthorityFrontProxy}
		ct.Spec.CertificateAuthorities.ServiceAccountKey = true
		ct.Spec.ExecutionMode = v1alpha1.ExecutionControlled
		mu := intstr.FromString("25%")
		ct.Spec.Upgrade.MaxUnavailable = &mu
	})
	d := decide(&input{ct: ct, clusterVersion: "v1.37.2", ops: map[string]opView{}})
	if d.create == nil {
		t.Fatal("no rotation generated")
	}
	op := Operation(ct, d.create)
	r := op.Spec.RotateCertificateAuthorities
	if r == nil || strings.Join(r.Authorities, ",") != "cluster,front-proxy" || !r.ServiceAccountKey || r.Completion != v1alpha1.CompletionManual ||
		op.Spec.Upgrade != nil || op.Spec.RenewCertificates != nil {
		t.Fatalf("generated spec %+v", op.Spec)
	}
	if op.Spec.ExecutionMode != v1alpha1.ExecutionControlled || op.Spec.MaxUnavailable.String() != "25%" || op.Labels[LabelClusterTarget] != "cluster" {
		t.Errorf("mode %s, maxUnavailable %v, labels %v", op.Spec.ExecutionMode, op.Spec.MaxUnavailable, op.Labels)
	}
	groups, err := plan.Expand(&op.Spec)
	if err != nil {
		t.Fatal(err)
	}
	var phases []string
	for _, g := range groups {
		if p := plan.RotationPhaseOf(g.Name); p != "" && (len(phases) == 0 || phases[len(phases)-1] != p) {
			phases = append(phases, p)
		}
	}
	if got := strings.Join(phases, " "); got != "prepare trust-both re-issue complete" {
		t.Errorf("the plan's rotation phases: %s", got)
	}
	ct.Spec.CertificateAuthorities.Completion = v1alpha1.CompletionAuto
	if r := Operation(ct, d.create).Spec.RotateCertificateAuthorities; r.Completion != v1alpha1.CompletionAuto {
		t.Errorf("completion %s, want Auto", r.Completion)
	}
}

// A rotation's phase follows its first group not yet succeeded; the gate complete-rotation waiting
// is seen as such.
func TestRotationView(t *testing.T) {
	op := &v1alpha1.NodeOperation{Spec: v1alpha1.NodeOperationSpec{RotateCertificateAuthorities: &v1alpha1.RotateCertificateAuthoritiesOperation{}}}
	op.Status.Groups = []v1alpha1.GroupStatus{{Name: plan.GroupCAPrepareGenerate, Phase: v1alpha1.GroupSucceeded}, {Name: plan.GroupCAPrepareCopy, Phase: v1alpha1.GroupSucceeded},
		{Name: plan.GroupCATrustBothControlPlanes, Phase: v1alpha1.GroupRunning}, {Name: plan.GroupCATrustBothCluster, Phase: v1alpha1.GroupPending}}
	if v := viewOf(op); v.RotationPhase != plan.RotationTrustBoth || v.AwaitingApproval {
		t.Errorf("view %+v, want trust-both", v)
	}
	op.Status.Groups = []v1alpha1.GroupStatus{{Name: plan.GroupCAReissueWorkers, Phase: v1alpha1.GroupSucceeded}, {Name: plan.GroupCACompleteControlPlanes, Phase: v1alpha1.GroupPending}}
	op.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: reasonWaitingForGate}}
	op.Status.Gates = []v1alpha1.GateStatus{{Group: plan.GroupCACompleteControlPlanes, Name: plan.GateCompleteRotation, State: v1alpha1.GateWaiting}}
	if v := viewOf(op); v.RotationPhase != plan.RotationComplete || !v.AwaitingApproval {
		t.Errorf("view %+v, want complete, awaiting approval", v)
	}
	up := &v1alpha1.NodeOperation{Spec: v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{}}, Status: op.Status}
	if v := viewOf(up); v.RotationPhase != "" || v.AwaitingApproval {
		t.Errorf("an upgrade's view %+v", v)
	}
}

// decideAt runs decide on a table case's input at the time at (no ops observed unless it names some) and
// returns the decision with the name of the operation it creates, "" for none.
func decideAt(in *input, at time.Time) (decision, string) {
	in.now = at
	if in.ops == nil {
		in.ops = map[string]opView{}
	}
	d := decide(in)
	if d.create == nil {
		return d, ""
	}
	return d, d.create.Name
}
