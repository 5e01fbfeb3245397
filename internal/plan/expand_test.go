package plan

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func kinds(cmds []v1alpha1.Command) []string {
	out := make([]string, 0, len(cmds))
	for i := range cmds {
		out = append(out, cmds[i].Kind())
	}
	return out
}

func TestExpand(t *testing.T) {
	source := &v1alpha1.BinarySource{BaseURL: "http://bins.local"}
	type group struct {
		name     string
		filter   v1alpha1.NodeFilter
		commands []string
	}
	tests := []struct {
		name    string
		spec    v1alpha1.NodeOperationSpec
		want    []group
		wantErr bool
	}{
		{
			name: "upgrade with kubelet",
			spec: v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", BinarySource: source}},
			want: []group{
				{GroupPreflight, v1alpha1.NodeFilterAll, []string{"preflight"}},
				{GroupFirstControlPlane, v1alpha1.NodeFilterHead, []string{"installBinaries", "kubeadmUpgradePlan", "kubeadmUpgradeApply", "installBinaries", "restartService", "waitNodeReady"}},
				{GroupOtherControlPlanes, v1alpha1.NodeFilterTail, []string{"installBinaries", "kubeadmUpgradeNode", "installBinaries", "restartService", "waitNodeReady"}},
				{GroupWorkers, v1alpha1.NodeFilterAll, []string{"installBinaries", "cordon", "drain", "kubeadmUpgradeNode", "installBinaries", "restartService", "waitNodeReady", "uncordon"}},
			},
		},
		{
			name: "upgrade without kubelet, kubeadm from the binary source",
			spec: v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", UpgradeKubeletAndKubectl: ptr.To(false), BinarySource: source}},
			want: []group{
				{GroupPreflight, v1alpha1.NodeFilterAll, []string{"preflight"}},
				{GroupFirstControlPlane, v1alpha1.NodeFilterHead, []string{"installBinaries", "kubeadmUpgradePlan", "kubeadmUpgradeApply", "waitNodeReady"}},
				{GroupOtherControlPlanes, v1alpha1.NodeFilterTail, []string{"installBinaries", "kubeadmUpgradeNode", "waitNodeReady"}},
				{GroupWorkers, v1alpha1.NodeFilterAll, []string{"installBinaries", "cordon", "drain", "kubeadmUpgradeNode", "waitNodeReady", "uncordon"}},
			},
		},
		{
			name: "upgrade without kubelet or binary source: the nodes' kubeadm is used",
			spec: v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", UpgradeKubeletAndKubectl: ptr.To(false)}},
			want: []group{
				{GroupPreflight, v1alpha1.NodeFilterAll, []string{"preflight"}},
				{GroupFirstControlPlane, v1alpha1.NodeFilterHead, []string{"kubeadmUpgradePlan", "kubeadmUpgradeApply", "waitNodeReady"}},
				{GroupOtherControlPlanes, v1alpha1.NodeFilterTail, []string{"kubeadmUpgradeNode", "waitNodeReady"}},
				{GroupWorkers, v1alpha1.NodeFilterAll, []string{"cordon", "drain", "kubeadmUpgradeNode", "waitNodeReady", "uncordon"}},
			},
		},
		{
			name:    "upgrade with kubelet needs a binary source",
			spec:    v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2"}},
			wantErr: true,
		},
		{
			name: "renew certificates",
			spec: v1alpha1.NodeOperationSpec{RenewCertificates: &v1alpha1.RenewCertificatesOperation{Certificates: []string{"apiserver"}}},
			want: []group{{GroupPreflight, v1alpha1.NodeFilterAll, []string{"preflight"}}, {GroupControlPlanes, v1alpha1.NodeFilterAll, []string{"kubeadmRenewCertificates", "restartStaticPods", "waitNodeReady"}}},
		},
		{
			name: "custom passes through",
			spec: v1alpha1.NodeOperationSpec{Custom: &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{
				{Name: "a", Commands: []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}}},
				{Name: "b", NodeFilter: v1alpha1.NodeFilterTail, Commands: []v1alpha1.Command{{Cordon: &v1alpha1.CordonCommand{}}, {Uncordon: &v1alpha1.UncordonCommand{}}}},
			}}},
			want: []group{{"a", v1alpha1.NodeFilterAll, []string{"wait"}}, {"b", v1alpha1.NodeFilterTail, []string{"cordon", "uncordon"}}},
		},
		{
			name: "reconfigure the control plane and the kubelet",
			spec: v1alpha1.NodeOperationSpec{Reconfigure: reconfigureBoth()},
			want: []group{
				{GroupPreflight, v1alpha1.NodeFilterAll, []string{"preflight"}},
				{GroupFirstControlPlane, v1alpha1.NodeFilterHead, []string{"kubeadmUpdateConfig", "kubeadmReconfigureNode", "restartService", "waitNodeReady"}},
				{GroupOtherControlPlanes, v1alpha1.NodeFilterTail, []string{"kubeadmReconfigureNode", "restartService", "waitNodeReady"}},
				{GroupWorkers, v1alpha1.NodeFilterAll, []string{"kubeadmReconfigureNode", "restartService", "waitNodeReady"}},
			},
		},
		{
			name: "reconfigure the kubelet, workers drained",
			spec: v1alpha1.NodeOperationSpec{Reconfigure: &v1alpha1.ReconfigureOperation{KubeletConfiguration: reconfigureBoth().KubeletConfiguration, Drain: &v1alpha1.DrainCommand{}}},
			want: []group{
				{GroupPreflight, v1alpha1.NodeFilterAll, []string{"preflight"}},
				{GroupFirstControlPlane, v1alpha1.NodeFilterHead, []string{"kubeadmUpdateConfig", "kubeadmReconfigureNode", "restartService", "waitNodeReady"}},
				{GroupOtherControlPlanes, v1alpha1.NodeFilterTail, []string{"kubeadmReconfigureNode", "restartService", "waitNodeReady"}},
				{GroupWorkers, v1alpha1.NodeFilterAll, []string{"cordon", "drain", "kubeadmReconfigureNode", "restartService", "waitNodeReady", "uncordon"}},
			},
		},
		{
			name: "reconfigure the control plane only: no worker group, no kubelet restart",
			spec: v1alpha1.NodeOperationSpec{Reconfigure: &v1alpha1.ReconfigureOperation{ClusterConfiguration: reconfigureBoth().ClusterConfiguration}},
			want: []group{
				{GroupPreflight, v1alpha1.NodeFilterAll, []string{"preflight"}},
				{GroupFirstControlPlane, v1alpha1.NodeFilterHead, []string{"kubeadmUpdateConfig", "kubeadmReconfigureNode", "waitNodeReady"}},
				{GroupOtherControlPlanes, v1alpha1.NodeFilterTail, []string{"kubeadmReconfigureNode", "waitNodeReady"}},
			},
		},
		{
			name: "reconfigure certSANs only: no manifest regenerated, the certificate re-issued and the API server restarted",
			spec: v1alpha1.NodeOperationSpec{Reconfigure: &v1alpha1.ReconfigureOperation{ClusterConfiguration: &v1alpha1.ClusterConfigurationPatch{
				APIServer: &v1alpha1.APIServerPatch{CertSANs: []string{"api.example.com"}}}}},
			want: []group{
				{GroupPreflight, v1alpha1.NodeFilterAll, []string{"preflight"}},
				{GroupFirstControlPlane, v1alpha1.NodeFilterHead, []string{"kubeadmUpdateConfig", "kubeadmReissueAPIServerCertificate", "restartStaticPods", "waitNodeReady"}},
				{GroupOtherControlPlanes, v1alpha1.NodeFilterTail, []string{"kubeadmReissueAPIServerCertificate", "restartStaticPods", "waitNodeReady"}},
			},
		},
		{
			name: "reconfigure etcd, certSANs and the kubelet: manifests first, then the certificate",
			spec: v1alpha1.NodeOperationSpec{Reconfigure: &v1alpha1.ReconfigureOperation{KubeletConfiguration: "maxPods: 150", ClusterConfiguration: &v1alpha1.ClusterConfigurationPatch{
				APIServer: &v1alpha1.APIServerPatch{CertSANs: []string{"10.0.0.7"}},
				Etcd:      &v1alpha1.EtcdPatch{ExtraArgs: []v1alpha1.ExtraArg{{Name: "snapshot-count", Value: "5000"}}}}}},
			want: []group{
				{GroupPreflight, v1alpha1.NodeFilterAll, []string{"preflight"}},
				{GroupFirstControlPlane, v1alpha1.NodeFilterHead, []string{"kubeadmUpdateConfig", "kubeadmReconfigureNode", "kubeadmReissueAPIServerCertificate", "restartStaticPods", "restartService", "waitNodeReady"}},
				{GroupOtherControlPlanes, v1alpha1.NodeFilterTail, []string{"kubeadmReconfigureNode", "kubeadmReissueAPIServerCertificate", "restartStaticPods", "restartService", "waitNodeReady"}},
				{GroupWorkers, v1alpha1.NodeFilterAll, []string{"kubeadmReconfigureNode", "restartService", "waitNodeReady"}},
			},
		},
		{name: "reconfigure with a certSAN kubeadm refuses", spec: v1alpha1.NodeOperationSpec{Reconfigure: &v1alpha1.ReconfigureOperation{ClusterConfiguration: &v1alpha1.ClusterConfigurationPatch{
			APIServer: &v1alpha1.APIServerPatch{CertSANs: []string{"a..b"}}}}}, wantErr: true},
		{name: "reconfigure with a kubelet patch that is no mapping", spec: v1alpha1.NodeOperationSpec{Reconfigure: &v1alpha1.ReconfigureOperation{KubeletConfiguration: "- maxPods: 150"}}, wantErr: true},
		{name: "reconfigure with a kubelet patch naming the kind", spec: v1alpha1.NodeOperationSpec{Reconfigure: &v1alpha1.ReconfigureOperation{KubeletConfiguration: `{"maxPods": 1, "kind": "X"}`}}, wantErr: true},
		{name: "nothing set", spec: v1alpha1.NodeOperationSpec{}, wantErr: true},
		{
			name: "two set",
			spec: v1alpha1.NodeOperationSpec{RenewCertificates: &v1alpha1.RenewCertificatesOperation{},
				Custom: &v1alpha1.CustomOperation{}},
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			groups, err := Expand(&tt.spec)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			var got []group
			for _, g := range groups {
				got = append(got, group{g.Name, g.NodeFilter, kinds(g.Commands)})
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %v\nwant %v", got, tt.want)
			}
		})
	}
}

// A control plane is done only when it is healthy again (succeeded means served, rule 13): every
// control-plane group ends waiting for it, at the new version after an upgrade; a worker waits
// only for its node.
func TestSafetyRule13_ControlPlaneGroupsEndWaitingForAHealthyControlPlane(t *testing.T) {
	source := &v1alpha1.BinarySource{BaseURL: "https://bins.local"}
	for _, tt := range []struct {
		name string
		spec v1alpha1.NodeOperationSpec
		want map[string]*v1alpha1.ControlPlaneHealth // by group; nil: the node only
	}{
		{"upgrade", v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", BinarySource: source}},
			map[string]*v1alpha1.ControlPlaneHealth{GroupFirstControlPlane: {Version: "v1.37.2"}, GroupOtherControlPlanes: {Version: "v1.37.2"}, GroupWorkers: nil}},
		{"upgrade without kubelet", v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", UpgradeKubeletAndKubectl: ptr.To(false)}},
			map[string]*v1alpha1.ControlPlaneHealth{GroupFirstControlPlane: {Version: "v1.37.2"}, GroupOtherControlPlanes: {Version: "v1.37.2"}, GroupWorkers: nil}},
		{"renew certificates", v1alpha1.NodeOperationSpec{RenewCertificates: &v1alpha1.RenewCertificatesOperation{}},
			map[string]*v1alpha1.ControlPlaneHealth{GroupControlPlanes: {}}},
		{"reconfigure", v1alpha1.NodeOperationSpec{Reconfigure: reconfigureBoth()},
			map[string]*v1alpha1.ControlPlaneHealth{GroupFirstControlPlane: {}, GroupOtherControlPlanes: {}, GroupWorkers: nil}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			groups, err := expand(&tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range groups {
				want, ok := tt.want[g.Name]
				if !ok {
					t.Fatalf("unexpected group %s", g.Name)
				}
				var wait *v1alpha1.WaitNodeReadyCommand
				for i := range g.Commands {
					if w := g.Commands[i].WaitNodeReady; w != nil {
						wait = w
					}
				}
				if wait == nil {
					t.Fatalf("group %s %v never waits for its node", g.Name, kinds(g.Commands))
				}
				if !reflect.DeepEqual(wait.ControlPlane, want) {
					t.Errorf("group %s waits for controlPlane %+v, want %+v", g.Name, wait.ControlPlane, want)
				}
				if want != nil && g.Commands[len(g.Commands)-1].WaitNodeReady == nil {
					t.Errorf("group %s does not end with the wait: %v", g.Name, kinds(g.Commands))
				}
			}
		})
	}
}

func TestExpandUpgradeCarriesVersionAndSource(t *testing.T) {
	groups, err := expand(&v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{
		KubernetesVersion: "v1.37.2", BinarySource: &v1alpha1.BinarySource{BaseURL: "http://b", InsecureHTTP: true,
			CABundle: "-----BEGIN CERTIFICATE-----", SHA256: &v1alpha1.BinaryDigests{Kubeadm: "aa"}},
		IgnorePreflightErrors: []string{"all"}, AllowIgnoreAllPreflightErrors: true,
		Drain: &v1alpha1.DrainCommand{DeleteEmptyDirData: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	apply := groups[0].Commands[2].KubeadmUpgradeApply
	if apply.KubernetesVersion != "v1.37.2" || !reflect.DeepEqual(apply.IgnorePreflightErrors, []string{"all"}) || !apply.AllowIgnoreAllPreflightErrors {
		t.Errorf("apply = %+v", apply)
	}
	if p := groups[0].Commands[1].KubeadmUpgradePlan; p.KubernetesVersion != "v1.37.2" || !reflect.DeepEqual(p.IgnorePreflightErrors, []string{"all"}) || !p.AllowIgnoreAllPreflightErrors {
		t.Errorf("plan = %+v", p)
	}
	// Every node gets the new kubeadm before any kubeadm upgrade command runs on it.
	for _, g := range groups {
		kubeadm := g.Commands[0].InstallBinaries
		if kubeadm == nil || g.Commands[0].Name != "install-kubeadm" || kubeadm.Version != "v1.37.2" || kubeadm.Source.BaseURL != "http://b" || !kubeadm.Source.InsecureHTTP || kubeadm.Source.CABundle == "" || kubeadm.Source.SHA256.For("kubeadm") != "aa" || !reflect.DeepEqual(kubeadm.Components, []string{"kubeadm"}) {
			t.Errorf("group %s starts with %s %+v, want installBinaries kubeadm", g.Name, g.Commands[0].Kind(), kubeadm)
		}
	}
	bins := groups[2].Commands[4].InstallBinaries
	if bins.Version != "v1.37.2" || bins.Source.BaseURL != "http://b" || !reflect.DeepEqual(bins.Components, []string{"kubelet", "kubectl"}) {
		t.Errorf("installBinaries = %+v", bins)
	}
	if !groups[2].Commands[2].Drain.DeleteEmptyDirData {
		t.Errorf("drain settings were not carried")
	}
	if groups[0].MaxUnavailable.IntValue() != 1 || groups[1].MaxUnavailable.IntValue() != 1 || groups[2].MaxUnavailable != nil {
		t.Errorf("control planes must go one at a time and workers use the operation's maxUnavailable")
	}
}

// TestExpandUpgradeWithPackages: packageSource installs and holds packages where binaries were
// swapped, at the same places in every group, from the repository given, and needs no binarySource.
func TestExpandUpgradeWithPackages(t *testing.T) {
	repo := &v1alpha1.PackageRepository{Name: "kubernetes", URL: "https://pkgs.example/v1.37/deb/", SigningKey: "-----BEGIN PGP PUBLIC KEY BLOCK-----"}
	groups, err := Expand(&v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{
		KubernetesVersion: "v1.37.2", PackageSource: "apt", PackageRepository: repo}})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if g.Name == GroupPreflight {
			continue // it only checks, and installs nothing
		}
		var installs []string
		for _, c := range g.Commands {
			if c.InstallBinaries != nil {
				t.Errorf("group %s swaps binaries: %s", g.Name, c.DisplayName())
			}
			if p := c.InstallPackages; p != nil {
				if p.Version != "v1.37.2" || p.Manager != "apt" || !p.Hold || !reflect.DeepEqual(p.Repository, repo) {
					t.Errorf("group %s: %s = %+v", g.Name, c.DisplayName(), p)
				}
				installs = append(installs, c.Name+"="+strings.Join(p.Packages, ","))
			}
		}
		if want := "install-kubeadm=kubeadm install-kubelet-kubectl=kubelet,kubectl"; strings.Join(installs, " ") != want {
			t.Errorf("group %s installs %q, want %q", g.Name, installs, want)
		}
		if g.Commands[0].InstallPackages == nil {
			t.Errorf("group %s does not install kubeadm's package first", g.Name)
		}
	}
	if _, err := Expand(&v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", PackageSource: "binaries"}}); err == nil {
		t.Errorf("packageSource binaries without binarySource expanded")
	}
}

func node(name string, labels map[string]string) corev1.Node {
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func TestResolve(t *testing.T) {
	cp := map[string]string{LabelControlPlane: ""}
	nodes := []corev1.Node{
		node("worker-b", map[string]string{"pool": "b"}), node("cp-2", cp), node("worker-a", map[string]string{"pool": "a"}),
		node("cp-1", cp), node("cp-3", cp), node("worker-c", map[string]string{"pool": "a"}),
	}
	pct := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	tests := []struct {
		name  string
		spec  v1alpha1.NodeOperationSpec
		nodes map[string][]string
		limit map[string]int
	}{
		{
			name:  "upgrade: first control plane, the others, workers",
			spec:  v1alpha1.NodeOperationSpec{MaxUnavailable: pct("50%"), Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", UpgradeKubeletAndKubectl: ptr.To(false)}},
			nodes: map[string][]string{GroupPreflight: {"cp-1", "cp-2", "cp-3", "worker-a", "worker-b", "worker-c"}, GroupFirstControlPlane: {"cp-1"}, GroupOtherControlPlanes: {"cp-2", "cp-3"}, GroupWorkers: {"worker-a", "worker-b", "worker-c"}},
			limit: map[string]int{GroupPreflight: 6, GroupFirstControlPlane: 1, GroupOtherControlPlanes: 1, GroupWorkers: 1},
		},
		{
			name: "operation selector narrows every group",
			spec: v1alpha1.NodeOperationSpec{
				NodeSelector:   &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}},
				MaxUnavailable: pct("100%"),
				Upgrade:        &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", UpgradeKubeletAndKubectl: ptr.To(false)},
			},
			nodes: map[string][]string{GroupPreflight: {"worker-a", "worker-c"}, GroupFirstControlPlane: nil, GroupOtherControlPlanes: nil, GroupWorkers: {"worker-a", "worker-c"}},
			limit: map[string]int{GroupPreflight: 2, GroupFirstControlPlane: 1, GroupOtherControlPlanes: 1, GroupWorkers: 2},
		},
		{
			name:  "renew certificates: control planes one at a time",
			spec:  v1alpha1.NodeOperationSpec{MaxUnavailable: pct("100%"), RenewCertificates: &v1alpha1.RenewCertificatesOperation{}},
			nodes: map[string][]string{GroupPreflight: {"cp-1", "cp-2", "cp-3"}, GroupControlPlanes: {"cp-1", "cp-2", "cp-3"}},
			limit: map[string]int{GroupPreflight: 3, GroupControlPlanes: 1},
		},
		{
			name: "custom: group selector, group limit, head and tail",
			spec: v1alpha1.NodeOperationSpec{Custom: &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{
				{Name: "all", MaxUnavailable: pct("34%")},
				{Name: "pool-a-head", NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}}, NodeFilter: v1alpha1.NodeFilterHead},
				{Name: "pool-a-tail", NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}}, NodeFilter: v1alpha1.NodeFilterTail},
				{Name: "none", NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "z"}}},
			}}},
			nodes: map[string][]string{
				"all":         {"cp-1", "cp-2", "cp-3", "worker-a", "worker-b", "worker-c"},
				"pool-a-head": {"worker-a"}, "pool-a-tail": {"worker-c"}, "none": nil,
			},
			limit: map[string]int{"all": 2, "pool-a-head": 1, "pool-a-tail": 1, "none": 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			groups, err := Resolve(&tt.spec, nodes)
			if err != nil {
				t.Fatal(err)
			}
			if len(groups) != len(tt.nodes) {
				t.Fatalf("%d groups, want %d", len(groups), len(tt.nodes))
			}
			for _, g := range groups {
				if !reflect.DeepEqual(g.Nodes, tt.nodes[g.Name]) {
					t.Errorf("group %s nodes = %v, want %v", g.Name, g.Nodes, tt.nodes[g.Name])
				}
				if g.MaxUnavailable != tt.limit[g.Name] {
					t.Errorf("group %s maxUnavailable = %d, want %d", g.Name, g.MaxUnavailable, tt.limit[g.Name])
				}
			}
		})
	}
}

func TestResolveRejectsBadSelector(t *testing.T) {
	spec := v1alpha1.NodeOperationSpec{
		NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}},
		Custom:       &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{{Name: "g"}}},
	}
	if _, err := Resolve(&spec, nil); err == nil {
		t.Fatal("an invalid selector was accepted")
	}
}

func TestMaxUnavailable(t *testing.T) {
	i := func(n int32) *intstr.IntOrString { v := intstr.FromInt32(n); return &v }
	s := func(p string) *intstr.IntOrString { v := intstr.FromString(p); return &v }
	tests := []struct {
		v     *intstr.IntOrString
		total int
		want  int
		err   bool
	}{
		{nil, 10, 1, false}, {i(3), 10, 3, false}, {i(30), 10, 30, false},
		{s("10%"), 10, 1, false}, {s("19%"), 10, 1, false}, {s("25%"), 10, 2, false}, {s("100%"), 7, 7, false},
		{s("1%"), 10, 1, false}, {s("50%"), 0, 1, false}, {s("ten"), 10, 0, true},
	}
	for _, tt := range tests {
		got, err := MaxUnavailable(tt.v, tt.total)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("MaxUnavailable(%v, %d) = %d, %v; want %d, err %v", tt.v, tt.total, got, err, tt.want, tt.err)
		}
	}
}

func TestNodeReady(t *testing.T) {
	n := corev1.Node{}
	if NodeReady(&n) {
		t.Error("a node without conditions is not ready")
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse}}
	if NodeReady(&n) {
		t.Error("Ready=False is not ready")
	}
	n.Status.Conditions[0].Status = corev1.ConditionTrue
	if !NodeReady(&n) {
		t.Error("Ready=True is ready")
	}
}

func reconfigureBoth() *v1alpha1.ReconfigureOperation {
	return &v1alpha1.ReconfigureOperation{
		ClusterConfiguration: &v1alpha1.ClusterConfigurationPatch{APIServer: &v1alpha1.APIServerPatch{ControlPlaneComponentPatch: v1alpha1.ControlPlaneComponentPatch{
			ExtraArgs: []v1alpha1.ExtraArg{{Name: "audit-log-maxage", Value: "30"}}}}},
		KubeletConfiguration: "maxPods: 150\n",
	}
}

// The patch is patched once, on the first control plane only; every node's command carries it for
// its DryRun, and regenerates the manifests only on control planes and the kubelet's only when the
// kubelet's configuration changes.
func TestExpandReconfigure(t *testing.T) {
	r := reconfigureBoth()
	groups, err := expandReconfigure(r)
	if err != nil {
		t.Fatal(err)
	}
	updates := 0
	for _, g := range groups {
		for _, c := range g.Commands {
			if c.KubeadmUpdateConfig != nil {
				updates++
				if g.Name != GroupFirstControlPlane || !reflect.DeepEqual(c.KubeadmUpdateConfig.ClusterConfiguration, r.ClusterConfiguration) {
					t.Errorf("group %s updates the configuration %+v", g.Name, c.KubeadmUpdateConfig)
				}
			}
			if n := c.KubeadmReconfigureNode; n != nil {
				if n.ControlPlane != (g.Name != GroupWorkers) || !n.Kubelet || !reflect.DeepEqual(n.KubeletConfiguration, r.KubeletConfiguration) {
					t.Errorf("group %s: %+v", g.Name, n)
				}
			}
		}
	}
	if updates != 1 {
		t.Errorf("%d kubeadmUpdateConfig commands, want 1", updates)
	}
	sans := &v1alpha1.ReconfigureOperation{ClusterConfiguration: &v1alpha1.ClusterConfigurationPatch{
		APIServer: &v1alpha1.APIServerPatch{CertSANs: []string{"api.example.com", "10.0.0.7"}}}}
	sansGroups, err := expandReconfigure(sans)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range sansGroups {
		for _, c := range g.Commands {
			if rc := c.KubeadmReissueAPIServerCertificate; rc != nil && !reflect.DeepEqual(rc.CertSANs, []string{"api.example.com", "10.0.0.7"}) {
				t.Errorf("group %s re-issues with %v", g.Name, rc.CertSANs)
			}
			if rs := c.RestartStaticPods; rs != nil && !reflect.DeepEqual(rs.Components, []string{"kube-apiserver"}) {
				t.Errorf("group %s restarts %v, want the API server only", g.Name, rs.Components)
			}
		}
	}
	r.ClusterConfiguration.APIServer.ExtraArgs[0].Value = "changed"
	if groups[0].Commands[0].KubeadmUpdateConfig.ClusterConfiguration.APIServer.ExtraArgs[0].Value != "30" {
		t.Error("the plan shares the spec's patch instead of copying it")
	}
}
