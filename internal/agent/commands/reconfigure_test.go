package commands

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// recordingKubeadm records each kubeadm command line instead of running it.
type recordingKubeadm struct{ calls []string }

func (r *recordingKubeadm) Kubeadm(_ context.Context, _ io.Writer, args ...string) error {
	r.calls = append(r.calls, strings.Join(args, " "))
	return nil
}

// Regenerating a node's files passes its kubeadm patches directory when it has one, so kubeadm keeps
// the patches (the drift reader passes it too); upgrades do the same, or a later upgrade would undo them.
func TestKubeadmPassesThePatchesDirectory(t *testing.T) {
	cmds := []*v1alpha1.Command{
		{KubeadmReconfigureNode: &v1alpha1.KubeadmReconfigureNodeCommand{ControlPlane: true, Kubelet: true}},
		{KubeadmUpgradeNode: &v1alpha1.KubeadmUpgradeNodeCommand{}},
		{KubeadmUpgradeApply: &v1alpha1.KubeadmUpgradeApplyCommand{KubernetesVersion: "v1.37.2"}},
	}
	for _, withPatches := range []bool{false, true} {
		files := map[string]string{kubeAPIServerManifest: "kind: Pod\n"}
		if withPatches {
			files[KubeadmPatchesDir+"/kube-apiserver+strategic.yaml"] = "spec: {}\n"
		}
		env, _, _ := localEnv(t, files, false)
		rec := &recordingKubeadm{}
		env.Host.Kubeadm = rec
		for _, c := range cmds {
			if _, err := Run(context.Background(), env, c); err != nil {
				t.Fatalf("%s: %v", c.Kind(), err)
			}
		}
		want := []string{
			"upgrade node phase control-plane --certificate-renewal=false --etcd-upgrade=false",
			"upgrade node phase kubelet-config",
			"upgrade node",
			"upgrade apply v1.37.2 --yes",
		}
		for i := range want {
			if withPatches {
				want[i] += " --patches " + KubeadmPatchesDir
			}
		}
		if strings.Join(rec.calls, "\n") != strings.Join(want, "\n") {
			t.Errorf("patches directory %t: kubeadm ran\n%s\nwant\n%s", withPatches, strings.Join(rec.calls, "\n"), strings.Join(want, "\n"))
		}
	}
}

// A node command on a node that is no control plane fails before running kubeadm.
func TestKubeadmReconfigureNodeRefusesAWorkerAsControlPlane(t *testing.T) {
	env, _, _ := localEnv(t, nil, false)
	rec := &recordingKubeadm{}
	env.Host.Kubeadm = rec
	_, err := Run(context.Background(), env, &v1alpha1.Command{KubeadmReconfigureNode: &v1alpha1.KubeadmReconfigureNodeCommand{ControlPlane: true}})
	if err == nil || !strings.Contains(err.Error(), "no kubeadm control plane") || len(rec.calls) != 0 {
		t.Errorf("err %v, kubeadm ran %v", err, rec.calls)
	}
}

// A patch of etcd's flags lets kubeadm regenerate etcd's manifest (it checks etcd's health, backs up
// its data and waits for the cluster); any other patch leaves etcd alone.
func TestKubeadmReconfigureNodeUpgradesEtcdOnlyForAnEtcdPatch(t *testing.T) {
	for _, tc := range []struct {
		patch *v1alpha1.ClusterConfigurationPatch
		want  string
	}{
		{&v1alpha1.ClusterConfigurationPatch{Etcd: &v1alpha1.EtcdPatch{ExtraArgs: []v1alpha1.ExtraArg{{Name: "snapshot-count", Value: "5000"}}}}, "--etcd-upgrade=true"},
		{&v1alpha1.ClusterConfigurationPatch{Scheduler: &v1alpha1.ControlPlaneComponentPatch{ExtraArgs: []v1alpha1.ExtraArg{{Name: "v", Value: "2"}}}}, "--etcd-upgrade=false"},
	} {
		env, _, _ := localEnv(t, map[string]string{kubeAPIServerManifest: "kind: Pod\n"}, false)
		rec := &recordingKubeadm{}
		env.Host.Kubeadm = rec
		if _, err := Run(context.Background(), env, &v1alpha1.Command{KubeadmReconfigureNode: &v1alpha1.KubeadmReconfigureNodeCommand{ControlPlane: true, ClusterConfiguration: tc.patch}}); err != nil {
			t.Fatal(err)
		}
		if want := "upgrade node phase control-plane --certificate-renewal=false " + tc.want; len(rec.calls) != 1 || rec.calls[0] != want {
			t.Errorf("kubeadm ran %q, want %q", rec.calls, want)
		}
	}
}
