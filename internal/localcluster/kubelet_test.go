package localcluster

import (
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/plan"
)

// A simulated node's kubelet reports the version its task installed only once a kubelet restart
// after that install succeeded, as a real kubelet does; a DryRun task installed nothing.
func TestRestartedKubeletVersion(t *testing.T) {
	install := func(v string, components ...string) v1alpha1.Command {
		return v1alpha1.Command{InstallBinaries: &v1alpha1.InstallBinariesCommand{Components: components, Version: v}}
	}
	restart := func(name string) v1alpha1.Command {
		return v1alpha1.Command{RestartService: &v1alpha1.RestartServiceCommand{Name: name}}
	}
	ok, failed, pending := v1alpha1.CommandSucceeded, v1alpha1.CommandFailed, v1alpha1.CommandPending
	for _, tc := range []struct {
		name   string
		mode   v1alpha1.ExecutionMode
		cmds   []v1alpha1.Command
		phases []v1alpha1.CommandPhase
		want   string
	}{
		{"a DryRun task changed nothing", v1alpha1.ExecutionDryRun, []v1alpha1.Command{install("v1.37.2", "kubelet"), restart("kubelet")},
			[]v1alpha1.CommandPhase{ok, ok}, ""},
		{"installed and restarted", "", []v1alpha1.Command{install("v1.37.2", "kubeadm"), install("v1.37.2", "kubelet", "kubectl"), restart("kubelet")},
			[]v1alpha1.CommandPhase{ok, ok, ok}, "v1.37.2"},
		{"installed, restart not run yet", "", []v1alpha1.Command{install("v1.37.2", "kubelet"), restart("kubelet")},
			[]v1alpha1.CommandPhase{ok, pending}, ""},
		{"restart failed", "", []v1alpha1.Command{install("v1.37.2", "kubelet"), restart("kubelet")},
			[]v1alpha1.CommandPhase{ok, failed}, ""},
		{"only kubeadm installed", "", []v1alpha1.Command{install("v1.37.2", "kubeadm"), restart("kubelet")},
			[]v1alpha1.CommandPhase{ok, ok}, ""},
		{"another service restarted", "", []v1alpha1.Command{install("v1.37.2", "kubelet"), restart("containerd")},
			[]v1alpha1.CommandPhase{ok, ok}, ""},
		{"status shorter than spec", "", []v1alpha1.Command{install("v1.37.2", "kubelet"), restart("kubelet")},
			[]v1alpha1.CommandPhase{ok}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			task := &v1alpha1.NodeTask{Spec: v1alpha1.NodeTaskSpec{Commands: tc.cmds, ExecutionMode: tc.mode}}
			for _, p := range tc.phases {
				task.Status.Commands = append(task.Status.Commands, v1alpha1.CommandStatus{Phase: p})
			}
			if got := RestartedKubeletVersion(task); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// Only operations whose plan restarts the kubelet are read: an upgrade that replaces the kubelet
// does, a custom operation that does not touch it does not.
func TestRestartsKubelet(t *testing.T) {
	up := &v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2",
		BinarySource: &v1alpha1.BinarySource{BaseURL: "https://dl.example"}}}
	if !restartsKubelet(up) {
		groups, err := plan.Expand(up)
		t.Errorf("an upgrade with binaries does not restart the kubelet: %+v %v", groups, err)
	}
	custom := &v1alpha1.NodeOperationSpec{Custom: &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{{Name: "g",
		Commands: []v1alpha1.Command{{RestartService: &v1alpha1.RestartServiceCommand{Name: "containerd"}}}}}}}
	if restartsKubelet(custom) {
		t.Error("a custom operation restarting containerd is said to restart the kubelet")
	}
}
