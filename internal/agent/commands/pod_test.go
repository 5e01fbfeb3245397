package commands_test

import (
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
)

// TestInstallerPod: the pod a pod command runs is bound to the task's node, reaches every node
// (tolerates every taint), runs once, has no token, and mounts the host only when asked.
func TestInstallerPod(t *testing.T) {
	c := &v1alpha1.PodCommand{Image: "ghcr.io/kwasm/kwasm-node-installer:v0.3.1", Privileged: true, HostPID: true, MountHostRoot: true,
		Env: []v1alpha1.PodEnvVar{{Name: "NODE_ROOT", Value: "/host"}}, ImagePullPolicy: corev1.PullIfNotPresent}
	pod := commands.InstallerPod("agents", "worker-1", "kwasm-install-worker-1", 2, c)
	s := pod.Spec
	if pod.Namespace != "agents" || s.NodeName != "worker-1" || s.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("namespace %q node %q restartPolicy %q", pod.Namespace, s.NodeName, s.RestartPolicy)
	}
	// One name per node, admission's (config/admission): no other node's agent can take it.
	if pod.Name != "installer-worker-1" || s.Hostname != "installer" {
		t.Errorf("name %q hostname %q, want installer-worker-1, installer", pod.Name, s.Hostname)
	}
	if errs := validation.IsDNS1123Subdomain(pod.Name); len(errs) > 0 {
		t.Errorf("name %q: %v", pod.Name, errs)
	}
	want := map[string]string{v1alpha1.LabelNode: "worker-1", v1alpha1.LabelTask: "kwasm-install-worker-1", commands.LabelCommand: "2",
		"app.kubernetes.io/name": "nodeops-installer", "app.kubernetes.io/part-of": "nodeops"}
	if !maps.Equal(pod.Labels, want) || len(pod.OwnerReferences) != 0 {
		t.Errorf("labels %v ownerReferences %v, want exactly %v and none (admission refuses others)", pod.Labels, pod.OwnerReferences, want)
	}
	if s.ServiceAccountName != commands.InstallerServiceAccount || s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
		t.Errorf("serviceAccountName %q automountServiceAccountToken %v", s.ServiceAccountName, s.AutomountServiceAccountToken)
	}
	if len(s.Tolerations) != 1 || s.Tolerations[0].Operator != corev1.TolerationOpExists || s.Tolerations[0].Key != "" {
		t.Errorf("tolerations %+v, want one tolerating every taint", s.Tolerations)
	}
	if !s.HostPID || s.HostNetwork {
		t.Errorf("hostPID %v hostNetwork %v", s.HostPID, s.HostNetwork)
	}
	ctr := s.Containers[0]
	if ctr.Image != c.Image || ctr.ImagePullPolicy != corev1.PullIfNotPresent || ctr.SecurityContext == nil || !*ctr.SecurityContext.Privileged {
		t.Errorf("container %+v", ctr)
	}
	if len(ctr.Env) != 1 || ctr.Env[0] != (corev1.EnvVar{Name: "NODE_ROOT", Value: "/host"}) {
		t.Errorf("env %+v", ctr.Env)
	}
	if len(s.Volumes) != 1 || s.Volumes[0].HostPath == nil || s.Volumes[0].HostPath.Path != "/" ||
		len(ctr.VolumeMounts) != 1 || ctr.VolumeMounts[0].MountPath != "/host" {
		t.Errorf("volumes %+v mounts %+v, want the host's / at /host", s.Volumes, ctr.VolumeMounts)
	}

	plain := commands.InstallerPod("agents", "worker-1", "t", 0, &v1alpha1.PodCommand{Image: "busybox"})
	if len(plain.Spec.Volumes) != 0 || plain.Spec.Containers[0].SecurityContext != nil || plain.Spec.HostPID {
		t.Errorf("a pod command asking for nothing got volumes %+v, securityContext %+v, hostPID %v",
			plain.Spec.Volumes, plain.Spec.Containers[0].SecurityContext, plain.Spec.HostPID)
	}
}
