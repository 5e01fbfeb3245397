package confinement

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/secretholder"
	"github.com/nodeops/nodeops/internal/testutil/confine"
)

// holderPod is the secret holder pod the manager builds for a task on node-a whose script names a Secret.
func holderPod() *corev1.Pod {
	task := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: taskA, UID: "uid-task-a"},
		Spec: v1alpha1.NodeTaskSpec{NodeName: "node-a", Commands: []v1alpha1.Command{{Script: &v1alpha1.ScriptCommand{
			Inline:  "true",
			EnvFrom: []v1alpha1.EnvFromSource{{SecretRef: v1alpha1.SecretEnvSource{Name: "nodeops-script-db"}}},
		}}}},
	}
	return secretholder.Build(task, secretholder.Options{Image: "ghcr.io/nodeops/agent:latest"})
}

// TestManagerCreatesOnlySecretHolderPods: creating a pod that mounts a Secret reads it, so the
// manager's pods (config/admission/manager-pods.yaml) are held to the secret holder's shape; its
// holder pod is admitted (a dry run), every wider one refused, and no one else's pod is affected.
func TestManagerCreatesOnlySecretHolderPods(t *testing.T) {
	ctx := context.Background()
	// So that a pod in default meets the policy, not the ServiceAccount admission's refusal.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: secretholder.ServiceAccount, Namespace: "default"}}
	if err := admin.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := manager.Create(ctx, holderPod(), client.DryRunAll); err != nil {
		t.Fatalf("the manager creating its secret holder pod: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*corev1.Pod)
		want   string
	}{
		{"in another namespace", func(p *corev1.Pod) { p.Namespace = "default" }, "only in nodeops-system with spec.nodeName set"},
		{"bound to no node", func(p *corev1.Pod) { p.Spec.NodeName = "" }, "only in nodeops-system with spec.nodeName set"},
		{"as another ServiceAccount", func(p *corev1.Pod) { p.Spec.ServiceAccountName = agentSA }, "spec.serviceAccountName nodeops-installer"},
		{"mounting a token", func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = nil }, "spec.automountServiceAccountToken false"},
		{"mounting a Secret not named for scripts", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "kept", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "kept"}}})
		}, "only secret volumes of Secrets named nodeops-script-*"},
		{"mounting a host path", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}, "only secret volumes of Secrets named nodeops-script-*"},
		{"taking env from a Secret", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "T", ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "kept"}, Key: "k"}}}}
		}, "take no env from Secrets or ConfigMaps"},
		{"privileged", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		}, "containers are not privileged"},
		{"on the host's network", func(p *corev1.Pod) { p.Spec.HostNetwork = true }, "without spec.hostNetwork, spec.hostPID or spec.hostIPC"},
		{"in the host's PID namespace", func(p *corev1.Pod) { p.Spec.HostPID = true }, "without spec.hostNetwork, spec.hostPID or spec.hostIPC"},
	} {
		pod := holderPod()
		tc.change(pod)
		confine.Refused(t, "the manager creating a pod "+tc.name, manager.Create(ctx, pod, client.DryRunAll),
			[]string{"ValidatingAdmissionPolicy 'nodeops-manager-pods'", tc.want})
	}
	// Another user's pods are not the policy's business.
	other := holderPod()
	other.Spec.HostNetwork = true
	if err := admin.Create(ctx, other, client.DryRunAll); err != nil {
		t.Errorf("an administrator creating a pod on the host's network: %v", err)
	}
}
