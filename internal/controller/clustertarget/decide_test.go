package clustertarget

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
		tt.in.now = now
		if tt.in.ops == nil {
			tt.in.ops = map[string]opView{}
		}
		d := decide(&tt.in)
		got := ""
		if d.create != nil {
			got = d.create.Name
		}
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
