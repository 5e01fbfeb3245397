// Package realnode builds and runs one real single-node kubeadm cluster on this machine (real
// containerd, runc, kubelet and control plane from images built locally) and tears it down again.
// The verified facts it follows are in docs/realnode.md.
package realnode

import "path/filepath"

// Versions the real node is built from. The node starts at From and nodeops upgrades it to To.
const (
	FromVersion       = "v1.36.3"
	ToVersion         = "v1.37.2"
	ContainerdVersion = "v2.4.2"
	RuncVersion       = "v1.5.3"
	CNIVersion        = "v1.9.1"
)

// Host paths. They are fixed (not under the checkout) so that `down` finds and removes what an
// `up` from any checkout left, and so the running node never depends on a checkout.
const (
	StateDir       = "/var/lib/nodeops-realnode"
	RunDir         = "/run/nodeops-realnode"
	SupervisorSock = RunDir + "/supervisor.sock"
	ContainerdSock = RunDir + "/containerd/containerd.sock"
	BridgeName     = "realnode0"
	PodSubnet      = "10.244.0.0/16"
	NodePodCIDR    = "10.244.0.0/24"
	ServiceSubnet  = "10.96.0.0/12"
	KubeconfigPath = "/etc/kubernetes/admin.conf"
	// ShimPath is where the host's systemctl lives (also /bin/systemctl: /bin is /usr/bin here);
	// the node's stand-in replaces it while the node is up and hands other units to the original.
	ShimPath = "/usr/bin/systemctl"
	// ContainerdConf is plain containerd's default config path: containerd runs without --config,
	// so a NodeProfile's containerdRuntime finds it without configPath, as on any plain node.
	ContainerdConf = "/etc/containerd/config.toml"
)

// State-directory paths.
var (
	RuntimeBinDir   = filepath.Join(StateDir, "bin")
	CNIBinDir       = filepath.Join(StateDir, "cni", "bin")
	CNIConfDir      = filepath.Join(StateDir, "cni", "net.d")
	CNIDataDir      = filepath.Join(StateDir, "cni", "ipam")
	ContainerdRoot  = filepath.Join(StateDir, "containerd")
	ContainerdState = filepath.Join(RunDir, "containerd")
	KubeadmConf     = filepath.Join(StateDir, "kubeadm.yaml")
	LogDir          = filepath.Join(StateDir, "logs")
	BackupDir       = filepath.Join(StateDir, "backup")
	OwnedList       = filepath.Join(StateDir, "owned")
	SupervisorPID   = filepath.Join(RunDir, "supervisor.pid")
	RootMadeShared  = filepath.Join(StateDir, "root-made-shared") // present when up changed / to shared
)

// HostBinaries are installed on the host where a package manager would put them; the agent
// replaces kubeadm, kubelet and kubectl there during the upgrade. Originals are kept in BackupDir.
var HostBinaries = []string{"/usr/bin/kubeadm", "/usr/bin/kubelet", "/usr/bin/kubectl", ShimPath}

// HostFiles are the host files up replaces (originals kept in BackupDir) and down restores.
var HostFiles = append(append([]string{}, HostBinaries...), ContainerdConf)

// OwnedCandidates are host paths that the node (kubeadm, kubelet, containerd, CNI) may create.
// Those absent before `up` are recorded in OwnedList and removed by `down`; present ones are left.
var OwnedCandidates = []string{
	StateDir, RunDir,
	"/etc/kubernetes", "/var/lib/kubelet", "/var/lib/etcd", "/var/lib/cni", "/etc/cni", "/opt/cni",
	"/var/log/pods", "/var/log/containers", "/usr/libexec/kubernetes", "/var/run/nri", "/run/nri",
	"/etc/cdi", "/var/run/cdi", "/run/cdi", "/opt/containerd", "/var/run/netns", "/run/netns",
	"/var/run/kubernetes", "/run/kubernetes", "/etc/default/kubelet", "/run/containerd", "/var/lib/containerd",
	"/etc/containerd", "/run/flannel", "/var/lib/kubeadm", "/run/mount", // libmount's utab, from the kubelet's mounts
	// nodeops' installBinaries keeps each replaced binary beside it.
	"/usr/bin/kubeadm.nodeops-prev", "/usr/bin/kubelet.nodeops-prev", "/usr/bin/kubectl.nodeops-prev",
	// The runtime handler test/realnode's NodeProfile installs (its uninstall leaves the binary).
	"/usr/local/bin/containerd-shim-nodeopstest-v2",
}

// Layout is where the builds of one checkout go (bin/realnode-build; bin/realnode is the driver itself).
type Layout struct {
	Repo   string // checkout root
	Bin    string // checkout's bin/, holding the v1.37.2 tools from hack/tools.sh
	Images string // what `make images` wrote: nodeops' OCI layouts, digests.env, values.yaml
}

// Out is the realnode build directory.
func (l Layout) Out() string { return filepath.Join(l.Bin, "realnode-build") }

// KubeDir holds the Kubernetes binaries and etcd of version v.
func (l Layout) KubeDir(v string) string {
	if v == ToVersion {
		return l.Bin // built by hack/tools.sh
	}
	return filepath.Join(l.Out(), v)
}

// RuntimeOut holds containerd, ctr, the runc shim and runc.
func (l Layout) RuntimeOut() string { return filepath.Join(l.Out(), "runtime") }

// CNIOut holds the CNI plugins.
func (l Layout) CNIOut() string { return filepath.Join(l.Out(), "cni") }

// ToolOut holds pause, the systemctl stand-in and the installer test binary.
func (l Layout) ToolOut() string { return filepath.Join(l.Out(), "tools") }

// ImageOut holds the image tarballs.
func (l Layout) ImageOut() string { return filepath.Join(l.Out(), "images") }
