package clustertarget

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// The watches wake the controller for what changes its status, and not for heartbeats, progress
// counts or pod status.
func TestPredicates(t *testing.T) {
	node := func(kubelet string, hb metav1.Time) *corev1.Node {
		return &corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: kubelet},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: hb}}}}
	}
	op := func(phase v1alpha1.OperationPhase, progress string, blocked metav1.ConditionStatus) *v1alpha1.NodeOperation {
		return &v1alpha1.NodeOperation{Status: v1alpha1.NodeOperationStatus{Phase: phase, Progress: progress,
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionBlocked, Status: blocked, Reason: "r"}}}}
	}
	task := func(phase v1alpha1.TaskPhase, certs ...string) *v1alpha1.NodeTask {
		t := &v1alpha1.NodeTask{Status: v1alpha1.NodeTaskStatus{Phase: phase, Progress: "1/2"}}
		for _, c := range certs {
			t.Status.Certificates = append(t.Status.Certificates, v1alpha1.CertificateExpiry{Name: c})
		}
		return t
	}
	pod := func(image string, ready bool) *corev1.Pod {
		p := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "cp", Containers: []corev1.Container{{Image: image}}}}
		if ready {
			p.Status.Phase = corev1.PodRunning
		}
		return p
	}
	tests := []struct {
		name     string
		update   func(event.UpdateEvent) bool
		old, new client.Object
		want     bool
	}{
		{"node heartbeat", nodeChanged().Update, node("v1.37.2", metav1.Unix(1, 0)), node("v1.37.2", metav1.Unix(2, 0)), false},
		{"kubelet version", nodeChanged().Update, node("v1.37.0", metav1.Unix(1, 0)), node("v1.37.2", metav1.Unix(1, 0)), true},
		{"operation progress", operationChanged().Update, op("Running", "1/3", "False"), op("Running", "2/3", "False"), false},
		{"operation phase", operationChanged().Update, op("Running", "1/3", "False"), op("Succeeded", "3/3", "False"), true},
		{"operation condition", operationChanged().Update, op("Running", "1/3", "False"), op("Running", "1/3", "True"), true},
		{"task progress", certificatesChanged().Update, task("Running"), task("Running"), false},
		{"task succeeds without certificates", certificatesChanged().Update, task("Running"), task("Succeeded"), false},
		{"task succeeds with certificates", certificatesChanged().Update, task("Running"), task("Succeeded", "apiserver"), true},
		{"certificates change", certificatesChanged().Update, task("Succeeded", "apiserver"), task("Succeeded", "apiserver", "etcd-server"), true},
		{"mirror pod status", mirrorImageChanged().Update, pod("kube-apiserver:v1.37.2", false), pod("kube-apiserver:v1.37.2", true), false},
		{"mirror pod image", mirrorImageChanged().Update, pod("kube-apiserver:v1.37.0", true), pod("kube-apiserver:v1.37.2", true), true},
	}
	for _, tt := range tests {
		if got := tt.update(event.UpdateEvent{ObjectOld: tt.old, ObjectNew: tt.new}); got != tt.want {
			t.Errorf("%s: wakes %v, want %v", tt.name, got, tt.want)
		}
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kubeadm-config"}}
	ca := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-root-ca.crt"}}
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy"}}
	if !isClusterConfigMap().Update(event.UpdateEvent{ObjectOld: cm, ObjectNew: cm}) || !isClusterConfigMap().Update(event.UpdateEvent{ObjectOld: ca, ObjectNew: ca}) ||
		isClusterConfigMap().Update(event.UpdateEvent{ObjectOld: other, ObjectNew: other}) {
		t.Error("only kubeadm-config and kube-root-ca.crt wake it")
	}
}
