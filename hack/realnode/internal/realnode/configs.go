package realnode

import (
	"bufio"
	"fmt"
	"strings"
)

// ContainerdConfig is containerd's configuration (version 3, containerd 2.x) for the node: its own
// root, state and socket; runc and the CNI plugins from the state directory; no apparmor; and
// restrict_oom_score_adj, since root here lacks CAP_SYS_RESOURCE and runc could not set the
// -998 OOM score of pod sandboxes. NRI, CDI and the opt plugin are pointed away from /run, /etc
// and /opt so nothing outside the node's directories is created.
func ContainerdConfig(pauseImage string) string {
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins.'io.containerd.internal.v1.opt']
  path = %[5]q

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.cri.v1.images']
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[6]q

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false
  cdi_spec_dirs = [%[7]q]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %[8]q
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[9]q]
    conf_dir = %[10]q

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
`, ContainerdRoot, ContainerdState, ContainerdSock, ContainerdSock+".ttrpc", StateDir+"/opt", pauseImage,
		StateDir+"/cdi", RuntimeBinDir+"/runc", CNIBinDir, CNIConfDir)
}

// CNIConfig is the pod network: one bridge with the node's pod range. No IP masquerade and no
// port mapping, so no iptables rule is ever added; pods reach the API server at the node's
// address, which is local to the host.
func CNIConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "realnode",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
`, BridgeName, CNIDataDir, NodePodCIDR)
}

// KubeadmConfig is the `kubeadm init` configuration: images never pulled (they are imported),
// no taint (the one node runs the workloads too), containerd's own socket, the cgroupfs driver and
// cgroup v1 allowed (this machine has no systemd and cgroup v1 hierarchies), and disk thresholds
// fit for a machine whose disk the node shares.
func KubeadmConfig(version, advertiseAddress string) string {
	return fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: %[1]s
  bindPort: 6443
nodeRegistration:
  criSocket: unix://%[2]s
  imagePullPolicy: Never
  taints: []
skipPhases:
- addon/coredns
- addon/kube-proxy
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: %[3]s
networking:
  podSubnet: %[4]s
  serviceSubnet: %[5]s
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
# The node shares its disk with Go build caches: the default thresholds (imagefs 15%%, nodefs 10%%
# free) taint it disk-pressure on a large, busy disk with gigabytes free, and image garbage
# collection from 85%% used would delete the locally imported images, which cannot be pulled.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1Gi
  imagefs.available: 1Gi
  nodefs.inodesFree: 1%%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`, advertiseAddress, ContainerdSock, version, PodSubnet, ServiceSubnet)
}

// InitIgnoredPreflightErrors are the two checks `kubeadm init` fails on this machine and nothing
// more: SystemVerification, which kubeadm requires skipping explicitly on cgroup v1 (together
// with the kubelet's failCgroupV1: false), and ip_forward, which stays 0 here: pods only talk to
// the node itself, so nothing is forwarded.
var InitIgnoredPreflightErrors = []string{"SystemVerification", "FileContent--proc-sys-net-ipv4-ip_forward"}

// ParseEnvFile reads a systemd EnvironmentFile: KEY=VALUE lines, values optionally in double or
// single quotes, '#' and ';' comment lines.
func ParseEnvFile(content string) (map[string]string, error) {
	env := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(content))
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("line %d: %q is not KEY=VALUE", n, line)
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		env[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read environment file: %w", err)
	}
	return env, nil
}

// KubeletArgs is the command line of kubeadm's kubelet unit (10-kubeadm.conf): the fixed flags,
// then $KUBELET_KUBEADM_ARGS and $KUBELET_EXTRA_ARGS split on white space, as systemd does.
func KubeletArgs(binary string, kubeadmFlags, extra map[string]string) []string {
	args := []string{binary,
		"--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
		"--kubeconfig=/etc/kubernetes/kubelet.conf",
		"--config=/var/lib/kubelet/config.yaml"}
	args = append(args, strings.Fields(kubeadmFlags["KUBELET_KUBEADM_ARGS"])...)
	args = append(args, strings.Fields(extra["KUBELET_EXTRA_ARGS"])...)
	return args
}
