package secretholder

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func script(valueFrom, envFrom string) v1alpha1.Command {
	s := &v1alpha1.ScriptCommand{Inline: "true"}
	if valueFrom != "" {
		s.Env = []v1alpha1.EnvVar{{Name: "A", Value: "plain"}, {Name: "B", ValueFrom: &v1alpha1.EnvVarSource{SecretKeyRef: v1alpha1.SecretKeySelector{Name: valueFrom, Key: "k"}}}}
	}
	if envFrom != "" {
		s.EnvFrom = []v1alpha1.EnvFromSource{{SecretRef: v1alpha1.SecretEnvSource{Name: envFrom}}}
	}
	return v1alpha1.Command{Script: s}
}

func TestSecretNamesAndWanted(t *testing.T) {
	spec := v1alpha1.NodeTaskSpec{NodeName: "n", Commands: []v1alpha1.Command{
		{Cordon: &v1alpha1.CordonCommand{}},
		script("nodeops-script-b", "nodeops-script-a"),
		script("nodeops-script-a", ""),
		// From before admission required the prefix: never mounted.
		script("", "sh.helm.release.v1.nodeops.v1"),
	}}
	if got := SecretNames(&spec); !slices.Equal(got, []string{"nodeops-script-a", "nodeops-script-b"}) {
		t.Errorf("SecretNames = %v", got)
	}
	now := metav1.Now()
	for _, tt := range []struct {
		name  string
		phase v1alpha1.TaskPhase
		spec  v1alpha1.NodeTaskSpec
		del   *metav1.Time
		want  bool
	}{
		{"new", "", spec, nil, true},
		{"pending", v1alpha1.TaskPending, spec, nil, true},
		{"running", v1alpha1.TaskRunning, spec, nil, true},
		{"failed", v1alpha1.TaskFailed, spec, nil, false},
		{"succeeded", v1alpha1.TaskSucceeded, spec, nil, false},
		{"aborted", v1alpha1.TaskAborted, spec, nil, false},
		{"being deleted", v1alpha1.TaskRunning, spec, &now, false},
		{"no Secrets", v1alpha1.TaskRunning, v1alpha1.NodeTaskSpec{NodeName: "n", Commands: []v1alpha1.Command{script("", "")}}, nil, false},
	} {
		task := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "t", DeletionTimestamp: tt.del}, Spec: tt.spec}
		task.Status.Phase = tt.phase
		if got := Wanted(task); got != tt.want {
			t.Errorf("%s: Wanted = %v, want %v", tt.name, got, tt.want)
		}
	}
	task := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "t", UID: "u"}, Spec: spec}
	pod := Build(task, Options{Image: "agent"})
	if !OwnedBy(pod, "u") || OwnedBy(pod, "other") || VolumeOf(pod, "nodeops-script-a") != "nodeops-script-a" || VolumeOf(pod, "sh.helm.release.v1.nodeops.v1") != "" {
		t.Errorf("holder pod: owners %v, volumes %v", pod.OwnerReferences, pod.Spec.Volumes)
	}
}
