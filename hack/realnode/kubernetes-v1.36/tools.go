//go:build tools

// Package kubernetes pins the Kubernetes v1.36 binaries the real node starts at (its kubeadm,
// kubelet, kubectl and control-plane images), before nodeops upgrades it to v1.37.2.
package kubernetes

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
