package plan

import (
	"reflect"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// The preflight checks what the commands need and nothing else; an operation whose commands need
// none gets no preflight group, so it costs no task per node.
func TestPreflightChecks(t *testing.T) {
	source := v1alpha1.BinarySource{BaseURL: "https://bins.local"}
	wait := v1alpha1.Command{Wait: &v1alpha1.WaitCommand{}}
	custom := func(cmds ...v1alpha1.Command) *v1alpha1.CustomOperation {
		return &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{{Name: "g", Commands: cmds}}}
	}
	for _, tt := range []struct {
		name string
		spec v1alpha1.NodeOperationSpec
		want []string
	}{
		{"wait only: none", v1alpha1.NodeOperationSpec{Custom: custom(wait)}, nil},
		{"restart: init system", v1alpha1.NodeOperationSpec{Custom: custom(wait, v1alpha1.Command{RestartService: &v1alpha1.RestartServiceCommand{Name: "kubelet"}})},
			[]string{"init system known"}},
		{"explicit: package manager", v1alpha1.NodeOperationSpec{Custom: custom(wait), Preflight: &v1alpha1.OperationPreflight{Checks: []v1alpha1.PreflightCheck{{PackageManager: &v1alpha1.PackageManagerCheck{}}}}},
			[]string{"package manager known"}},
		{"explicit, empty: still one", v1alpha1.NodeOperationSpec{Custom: custom(wait), Preflight: &v1alpha1.OperationPreflight{}}, []string{"1 MiB free"}},
		{"upgrade with binaries", v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", BinarySource: &source}},
			[]string{"kubeadm runs", "https://bins.local reachable", "init system known", "512 MiB free", DefaultRuntimeSocket + " answers", "kubelet within skew of v1.37.2"}},
		{"upgrade with the nodes' kubeadm", v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", UpgradeKubeletAndKubectl: ptr.To(false)}},
			[]string{"kubeadm v1.37.2", DefaultRuntimeSocket + " answers", "kubelet within skew of v1.37.2"}},
		{"packages: room and a known package manager", v1alpha1.NodeOperationSpec{Custom: custom(v1alpha1.Command{InstallPackages: &v1alpha1.InstallPackagesCommand{Packages: []string{"kubeadm"}}})},
			[]string{"package manager known", "512 MiB free"}},
		{"upgrade through apt", v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", PackageSource: "apt"}},
			[]string{"kubeadm runs", "apt present", "init system known", "512 MiB free", DefaultRuntimeSocket + " answers", "kubelet within skew of v1.37.2"}},
		{"upgrade through auto", v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", PackageSource: "auto"}},
			[]string{"kubeadm runs", "package manager known", "init system known", "512 MiB free", DefaultRuntimeSocket + " answers", "kubelet within skew of v1.37.2"}},
		{"renew: kubeadm", v1alpha1.NodeOperationSpec{RenewCertificates: &v1alpha1.RenewCertificatesOperation{}}, []string{"kubeadm runs"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			groups, err := Expand(&tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			if groups[0].Name == GroupPreflight {
				for _, c := range groups[0].Commands[0].Preflight.Checks {
					got = append(got, v1alpha1.PreflightCheckText(c))
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("checks %q, want %q", got, tt.want)
			}
		})
	}
}

func TestPreflightGroupNameTaken(t *testing.T) {
	spec := v1alpha1.NodeOperationSpec{Custom: &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{{Name: GroupPreflight,
		Commands: []v1alpha1.Command{{RestartService: &v1alpha1.RestartServiceCommand{Name: "kubelet"}}}}}}}
	if _, err := Expand(&spec); err == nil {
		t.Fatal("a custom group named preflight was taken beside the operation's preflight")
	}
}
