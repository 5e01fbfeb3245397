package commands

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestOnlyStaticPodsTheNewKubeletRenamedAreStopped: after a kubelet restart, a control-plane static
// pod's old run is stopped only when the new kubelet lists that pod under another UID; a pod it
// kept, one it does not list (yet), one whose UID was not known before, and another pod of the
// same name in another namespace are left alone.
func TestOnlyStaticPodsTheNewKubeletRenamedAreStopped(t *testing.T) {
	pod := func(ns, name, uid string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
	}
	before := map[string]string{"etcd": "e1", "kube-apiserver": "a1", "kube-controller-manager": "c1"}
	pods := []corev1.Pod{
		pod("kube-system", "etcd-cp1", "e2"),
		pod("kube-system", "kube-apiserver-cp1", "a1"),
		pod("default", "kube-controller-manager-cp1", "c2"),
		pod("kube-system", "kube-scheduler-cp1", "s2"),
	}
	if got, want := replacedStaticPods(before, pods, "cp1"), []string{"etcd"}; !reflect.DeepEqual(got, want) {
		t.Errorf("replaced = %v, want %v", got, want)
	}
	if got := replacedStaticPods(before, nil, "cp1"); len(got) != 0 {
		t.Errorf("with no pods listed, replaced = %v, want none", got)
	}
	if got := replacedStaticPods(before, pods, "cp2"); len(got) != 0 {
		t.Errorf("on another node, replaced = %v, want none", got)
	}
}
