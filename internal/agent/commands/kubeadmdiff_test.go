package commands_test

import (
	"strings"
	"testing"

	"github.com/nodeops/nodeops/internal/agent/commands"
)

const apiserverManifest = `apiVersion: v1
kind: Pod
metadata:
  annotations:
    kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint: 192.0.2.11:6443
  creationTimestamp: null
  labels:
    component: kube-apiserver
    tier: control-plane
  name: kube-apiserver
  namespace: kube-system
spec:
  containers:
  - command:
    - kube-apiserver
    - --advertise-address=192.0.2.11
    - --authorization-mode=Node,RBAC
    - --secure-port=6443
    image: registry.k8s.io/kube-apiserver:v1.37.2
    name: kube-apiserver
    resources:
      requests:
        cpu: 250m
    volumeMounts:
    - mountPath: /etc/kubernetes/pki
      name: k8s-certs
      readOnly: true
  hostNetwork: true
  volumes:
  - hostPath:
      path: /etc/kubernetes/pki
      type: DirectoryOrCreate
    name: k8s-certs
status: {}
`

// A manifest differs from kubeadm's in what decides how the component runs (flags, image, mounts,
// volumes), not in what kubeadm sets by itself or in the order of its flags; the reason names the
// difference in a line.
func TestDiffStaticPod(t *testing.T) {
	edit := func(old, new string) string { return strings.Replace(apiserverManifest, old, new, 1) }
	tests := []struct {
		name, have string
		want       string // "" when they match
	}{
		{"identical", apiserverManifest, ""},
		{"flags reordered, resources and annotations changed", edit("    - --authorization-mode=Node,RBAC\n    - --secure-port=6443\n", "    - --secure-port=6443\n    - --authorization-mode=Node,RBAC\n"), ""},
		{"resources and labels", edit("cpu: 250m", "cpu: 300m"), ""},
		{"a flag added by hand", edit("    - --secure-port=6443\n", "    - --secure-port=6443\n    - --audit-log-maxage=7\n"), "flag --audit-log-maxage=7, kubeadm's has none"},
		{"a flag changed", edit("--secure-port=6443", "--secure-port=6444"), "flag --secure-port=6444, kubeadm's 6443"},
		{"a flag removed", edit("    - --secure-port=6443\n", ""), "flag --secure-port missing, kubeadm's 6443"},
		{"the image", edit("kube-apiserver:v1.37.2", "kube-apiserver:v1.36.4"), "image registry.k8s.io/kube-apiserver:v1.36.4, kubeadm's registry.k8s.io/kube-apiserver:v1.37.2"},
		{"a volume's path", edit("      path: /etc/kubernetes/pki\n", "      path: /srv/pki\n"), "volume k8s-certs=/srv/pki (DirectoryOrCreate), kubeadm's /etc/kubernetes/pki (DirectoryOrCreate)"},
		{"a mount writable", edit("      readOnly: true\n", ""), "mount k8s-certs=/etc/kubernetes/pki, kubeadm's /etc/kubernetes/pki (read-only)"},
		{"many", edit("    - --advertise-address=192.0.2.11\n    - --authorization-mode=Node,RBAC\n    - --secure-port=6443\n", "    - --a=1\n    - --b=2\n    - --c=3\n    - --d=4\n"), "; and 4 more"},
		{"unreadable", "kind: Pod\nspec: [\n", "manifest unreadable"},
	}
	for _, tt := range tests {
		got := commands.DiffStaticPod([]byte(tt.have), []byte(apiserverManifest))
		if tt.want == "" && got != "" || tt.want != "" && !strings.Contains(got, tt.want) {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

// The kubelet's configuration is compared field by field, a zero value counting as absent.
func TestDiffKubeletConfig(t *testing.T) {
	const kubeadms = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 110\ncgroupDriver: systemd\nauthentication:\n  webhook:\n    enabled: true\n    cacheTTL: 0s\nclusterDNS:\n- 10.96.0.10\nlogging:\n  flushFrequency: 0\n"
	tests := []struct {
		name, have, want string
	}{
		{"identical", kubeadms, ""},
		{"zero values left out, keys reordered", "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\ncgroupDriver: systemd\nmaxPods: 110\nauthentication:\n  webhook:\n    enabled: true\nclusterDNS: [10.96.0.10]\n", ""},
		{"maxPods by hand", strings.Replace(kubeadms, "maxPods: 110", "maxPods: 120", 1), "maxPods=120, kubeadm's 110"},
		{"a nested field", strings.Replace(kubeadms, "    enabled: true\n", "    enabled: false\n", 1), "authentication.webhook.enabled missing, kubeadm's true"},
		{"a field added", kubeadms + "serializeImagePulls: false\nrotateCertificates: true\n", "rotateCertificates=true, kubeadm's has none"},
	}
	for _, tt := range tests {
		got := commands.DiffKubeletConfig([]byte(tt.have), []byte(kubeadms))
		if tt.want == "" && got != "" || tt.want != "" && !strings.Contains(got, tt.want) {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

// kubeadm's dry runs print each file after a marker; stderr's klog lines and kubeadm's own
// messages, which share the output, are no part of any file.
func TestParseDryRunFiles(t *testing.T) {
	out := "$ kubeadm --rootfs /r upgrade node phase control-plane --dry-run\n" +
		"W1202 12:00:00.123456   12345 dryrun.go:1] Using dry-run directory /etc/kubernetes/tmp/kubeadm-upgrade-node-dryrun1\n" +
		`[upgrade/control-plane] Upgrading your Static Pod-hosted control plane instance to version "v1.37.2"...` + "\n" +
		`[dryrun] Would upgrade your static Pod-hosted control plane to version "v1.37.2"[dryrun] Would write file "/etc/kubernetes/manifests/kube-apiserver.yaml" with content:` + "\n" +
		"kind: Pod\nmetadata:\n  name: kube-apiserver\n" +
		"I1202 12:00:00.2   12345 x.go:2] interleaved\n" +
		`[dryrun] Would write file "/var/lib/kubelet/config.yaml" with content:` + "\n" +
		"kind: KubeletConfiguration\nmaxPods: 110\n" +
		"[upgrade/kubelet-config] The kubelet configuration for this node was successfully upgraded!\n" +
		"removed kubeadm's dry-run files /etc/kubernetes/tmp/kubeadm-upgrade-node-dryrun1\n"
	got := commands.ParseDryRunFiles(out)
	if len(got) != 2 || got["/etc/kubernetes/manifests/kube-apiserver.yaml"] != "kind: Pod\nmetadata:\n  name: kube-apiserver\n" ||
		got["/var/lib/kubelet/config.yaml"] != "kind: KubeletConfiguration\nmaxPods: 110\n" {
		t.Errorf("files %q", got)
	}
}
