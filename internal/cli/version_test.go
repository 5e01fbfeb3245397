package cli

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// `version` prints the plugin's own version and, from the cluster, the manager Deployment's image.
func TestVersion(t *testing.T) {
	out := mustRun(t, "version", "--client")
	if !strings.HasPrefix(out, "client: ") || strings.Contains(out, "server:") {
		t.Errorf("version --client printed %q", out)
	}

	out = mustRun(t, "version")
	if !strings.Contains(out, "server: no Deployment nodeops-system/nodeops-manager") {
		t.Errorf("version without a manager printed %q", out)
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: managerNamespace}}
	if err := k8s.Create(ctx(t), ns); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	replicas := int32(2)
	labels := map[string]string{"app.kubernetes.io/name": "nodeops-manager"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: managerNamespace, Name: managerDeployment},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "registry.example/nodeops/manager:v0.1.0"}}},
			},
		},
	}
	if err := k8s.Create(ctx(t), d); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx(t), d) })
	out = mustRun(t, "version")
	if !strings.Contains(out, "server: manager registry.example/nodeops/manager:v0.1.0, 0/2 replicas ready") {
		t.Errorf("version printed %q", out)
	}
}
