package localcluster

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strconv"
	"text/template"
	"time"
)

// Network ranges of the local cluster, the same as a default kubeadm cluster's.
const (
	ServiceSubnet = "10.96.0.0/12"
	PodSubnet     = "10.244.0.0/16"
	ClusterDNS    = "10.96.0.10"
	// clusterAddress is the advertise address of the cluster-level PKI (the local apiserver's serving
	// certificate also carries 127.0.0.1); 192.0.2.0/24 is a documentation range nothing is sent to.
	clusterAddress = "192.0.2.1"
	clusterName    = "kubernetes"
)

// kubeadmConfigParams fill the kubeadm InitConfiguration + ClusterConfiguration of a node root or of the cluster PKI.
type kubeadmConfigParams struct {
	NodeName          string
	AdvertiseAddress  string
	ControlPlane      bool
	KubernetesVersion string
	// Endpoint is host:port of the local apiserver; every kubeconfig kubeadm writes points there.
	Endpoint        string
	CertificatesDir string
}

var kubeadmConfigTemplate = template.Must(template.New("kubeadm").Parse(`apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: {{.AdvertiseAddress}}
  bindPort: 6443
nodeRegistration:
  name: {{.NodeName}}
  criSocket: ` + CRISocket + `
{{- if .ControlPlane}}
  taints:
  - key: node-role.kubernetes.io/control-plane
    effect: NoSchedule
{{- else}}
  taints: []
{{- end}}
---
{{.ClusterConfiguration}}`))

var clusterConfigTemplate = template.Must(template.New("cluster").Parse(`apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
clusterName: ` + clusterName + `
kubernetesVersion: {{.KubernetesVersion}}
controlPlaneEndpoint: {{.Endpoint}}
certificatesDir: {{.CertificatesDir}}
imageRepository: registry.k8s.io
encryptionAlgorithm: ECDSA-P256
networking:
  dnsDomain: cluster.local
  serviceSubnet: ` + ServiceSubnet + `
  podSubnet: ` + PodSubnet + `
apiServer:
  certSANs:
  - 127.0.0.1
  - localhost
etcd:
  local:
    dataDir: /var/lib/etcd
`))

// ClusterConfiguration renders the kubeadm ClusterConfiguration stored in kube-system/kubeadm-config
// and in every control-plane root (ECDSA keys: generating them is much cheaper than RSA).
func ClusterConfiguration(kubernetesVersion, endpoint, certificatesDir string) string {
	return execute(clusterConfigTemplate, kubeadmConfigParams{KubernetesVersion: kubernetesVersion, Endpoint: endpoint, CertificatesDir: certificatesDir})
}

// KubeadmConfig renders an InitConfiguration followed by the ClusterConfiguration, the file kubeadm's
// init phases read.
func KubeadmConfig(p kubeadmConfigParams) string {
	type withCluster struct {
		kubeadmConfigParams
		ClusterConfiguration string
	}
	return execute(kubeadmConfigTemplate, withCluster{p, ClusterConfiguration(p.KubernetesVersion, p.Endpoint, p.CertificatesDir)})
}

// KubeletConfiguration is the kubelet configuration kubeadm keeps in kube-system/kubelet-config,
// byte for byte as `kubeadm init phase upload-config kubelet` (v1.37) uploads it: defaulted by
// kubeadm, with no node's CRI socket. TestKubeletConfigurationIsKubeadms compares it with the real
// kubeadm's output.
func KubeletConfiguration() string { return kubeletConfiguration(`""`) }

// NodeKubeletConfig is a node's /var/lib/kubelet/config.yaml as `kubeadm init phase kubelet-start`
// (and join) writes it: the ConfigMap's configuration with the node's instance configuration
// (its CRI socket) patched in. kubeadm upgrade node and the drift reader render the same file.
func NodeKubeletConfig() string { return kubeletConfiguration(CRISocket) }

// kubeletConfiguration is kubeadm's defaulted KubeletConfiguration with containerRuntimeEndpoint
// set to endpoint (a YAML scalar). The zero durations are kubeadm's: it marshals the whole struct.
func kubeletConfiguration(endpoint string) string {
	return `apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- ` + ClusterDNS + `
clusterDomain: cluster.local
containerRuntimeEndpoint: ` + endpoint + `
cpuManagerReconcilePeriod: 0s
crashLoopBackOff: {}
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMaximumGCAge: 0s
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
memorySwap: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
`
}

// OSRelease is /etc/os-release of every node root.
const OSRelease = `PRETTY_NAME="Debian GNU/Linux 13 (trixie)"
NAME="Debian GNU/Linux"
VERSION_ID="13"
VERSION="13 (trixie)"
VERSION_CODENAME=trixie
DEBIAN_VERSION_FULL=13.1
ID=debian
HOME_URL="https://www.debian.org/"
SUPPORT_URL="https://www.debian.org/support"
BUG_REPORT_URL="https://bugs.debian.org/"
`

// ContainerdConfig is /etc/containerd/config.toml of every node root: containerd 2's version 3 format with runc.
const ContainerdConfig = `version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"

  [plugins.'io.containerd.cri.v1.runtime']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"

          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            SystemdCgroup = true
`

// KubeadmFlagsEnv is /var/lib/kubelet/kubeadm-flags.env, written by kubeadm init/join on a real node.
const KubeadmFlagsEnv = `KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=` + CRISocket + ` --pod-infra-container-image=registry.k8s.io/pause:3.10.1"
`

// KubeletInstanceConfig is /var/lib/kubelet/instance-config.yaml, the node-local kubelet settings
// kubeadm (v1.34+) writes beside config.yaml, in its form, and reads the node's CRI socket from.
const KubeletInstanceConfig = `containerRuntimeEndpoint: "` + CRISocket + `"
`

// placeholderBinary stands for the kubelet or kubectl a node had before nodeops replaces it; only
// its version output is meaningful.
func placeholderBinary(name, version string) string {
	return fmt.Sprintf("#!/bin/sh\n# %s %s placeholder written by nodeops-local; installBinaries replaces it with the real binary.\necho \"Kubernetes %s\"\n", name, version, version)
}

// clusterLayout holds the files and ports of one running local cluster.
type clusterLayout struct {
	Dir                                   string
	EtcdClientPort, EtcdPeerPort, APIPort int
	// ComponentKubeconfig replaces kubeconfig() for the manager and agents when set (Options.ComponentKubeconfig).
	ComponentKubeconfig string
	// PodBound gives the manager and each local node's agent their own kubeconfig in
	// DIR/credentials (Options.AgentCredentials CredentialsPodBound).
	PodBound bool
	// JobMode runs the manager with --agent-mode=Job (Options.AgentMode AgentModeJob).
	JobMode bool
	// ManagerPprof and SimAgentPprof are Options.ManagerPprofAddress and SimAgentPprofAddress.
	ManagerPprof, SimAgentPprof string
	// CAServerPorts are the loopback ports the control planes' agents serve a certificate authority
	// rotation's new authorities on (--ca-server-address), by node; a real agent serves on its pod's IP.
	CAServerPorts map[string]int
}

func (l clusterLayout) pki(name string) string { return filepath.Join(l.Dir, "pki", name) }
func (l clusterLayout) kubeconfig() string     { return filepath.Join(l.Dir, "kubeconfig") }
func (l clusterLayout) componentKubeconfig() string {
	if l.ComponentKubeconfig != "" {
		return l.ComponentKubeconfig
	}
	return l.kubeconfig()
}
func (l clusterLayout) managerKubeconfig() string {
	if l.PodBound {
		return CredentialsKubeconfig(l.Dir, "manager")
	}
	return l.componentKubeconfig()
}
func (l clusterLayout) endpoint() string { return "127.0.0.1:" + strconv.Itoa(l.APIPort) }
func (l clusterLayout) etcdURL() string  { return "https://127.0.0.1:" + strconv.Itoa(l.EtcdClientPort) }
func (l clusterLayout) etcdPeerURL() string {
	return "http://127.0.0.1:" + strconv.Itoa(l.EtcdPeerPort)
}

// etcd serves TLS with the cluster's etcd CA, like a kubeadm control plane's etcd, so kubeadm in a
// control-plane root can reach it with that root's certificates (kubeadm upgrade apply does);
// its peer port is loopback-only plain HTTP, as it has no peers.
func (l clusterLayout) etcdArgs() []string {
	return []string{
		"--cert-file=" + l.pki("etcd/server.crt"),
		"--key-file=" + l.pki("etcd/server.key"),
		"--client-cert-auth=true",
		"--trusted-ca-file=" + l.pki("etcd/ca.crt"),
		"--name=nodeops-local",
		"--data-dir=" + filepath.Join(l.Dir, "etcd"),
		"--listen-client-urls=" + l.etcdURL(),
		"--advertise-client-urls=" + l.etcdURL(),
		"--listen-peer-urls=" + l.etcdPeerURL(),
		"--initial-advertise-peer-urls=" + l.etcdPeerURL(),
		"--initial-cluster=nodeops-local=" + l.etcdPeerURL(),
		"--unsafe-no-fsync=true",
		"--quota-backend-bytes=8589934592",
		"--log-level=warn",
	}
}

func (l clusterLayout) apiserverArgs() []string {
	return []string{
		"--etcd-servers=" + l.etcdURL(),
		"--etcd-cafile=" + l.pki("etcd/ca.crt"),
		"--etcd-certfile=" + l.pki("apiserver-etcd-client.crt"),
		"--etcd-keyfile=" + l.pki("apiserver-etcd-client.key"),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(l.APIPort),
		// Loopback endpoints are invalid in the kubernetes Service's Endpoints; nothing in-cluster dials it.
		"--endpoint-reconciler-type=none",
		// Files that follow the first control plane's (see followFirstControlPlane).
		"--tls-cert-file=" + l.followedPKI(followed.servingCert),
		"--tls-private-key-file=" + l.followedPKI(followed.servingKey),
		"--client-ca-file=" + l.followedPKI(followed.clientCA),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + l.followedPKI(followed.saVerify),
		"--service-account-signing-key-file=" + l.followedPKI(followed.saSigning),
		"--service-cluster-ip-range=" + ServiceSubnet,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--max-requests-inflight=1000",
		"--max-mutating-requests-inflight=500",
		"--profiling=false",
		// A restart (the CA stand-in's, on new service-account keys) answers 429 Retry-After, which
		// clients retry, until the requests in flight are done, then stops within 2 s; by default the
		// listener closes at once and open watches hold the process for the 60 s request timeout.
		"--shutdown-send-retry-after=true",
	}
}

func (l clusterLayout) controllerManagerArgs() []string {
	return []string{
		"--kubeconfig=" + l.kubeconfig(),
		"--secure-port=0",
		"--leader-elect=false",
		"--controllers=*",
		// Files that follow the first control plane's (see followFirstControlPlane).
		"--root-ca-file=" + l.followedPKI(followed.rootCA),
		"--service-account-private-key-file=" + l.followedPKI(followed.saPrivate),
		"--cluster-signing-cert-file=" + l.followedPKI(followed.signingCert),
		"--cluster-signing-key-file=" + l.followedPKI(followed.signingKey),
		"--cluster-cidr=" + PodSubnet,
		"--service-cluster-ip-range=" + ServiceSubnet,
		// The defaults (20/30) throttle everything at hundreds of nodes.
		"--kube-api-qps=500",
		"--kube-api-burst=1000",
		// kwok renews node Leases every 75 s (see kwokArgs): allow four missed renewals.
		"--node-monitor-grace-period=5m",
		"--profiling=false",
	}
}

func (l clusterLayout) schedulerArgs() []string {
	return []string{
		"--kubeconfig=" + l.kubeconfig(),
		"--secure-port=0",
		"--leader-elect=false",
		"--kube-api-qps=500",
		"--kube-api-burst=1000",
		"--profiling=false",
	}
}

// kwokArgs: kwok plays the kubelet of every node; stages are the stage config files it must load.
func (l clusterLayout) kwokArgs(stages []string) []string {
	args := []string{
		"--kubeconfig=" + l.kubeconfig(),
		"--manage-all-nodes=true",
		"--cidr=" + PodSubnet,
		// Without this flag kwok renews no node Lease, so the node-lifecycle controller sees every
		// node's heartbeat go stale and flips nodes NotReady and back (tainting them) all the time.
		// A Lease renewed every 75 s (a quarter of its duration) keeps 5,000 nodes at about 70
		// writes/s; the controller-manager's grace period is raised to match.
		"--node-lease-duration-seconds=300",
	}
	for _, s := range stages {
		args = append(args, "--config="+s)
	}
	return args
}

// Leader election of nodeops-local's managers when it runs more than one (Options.Managers): the
// Lease, and timings shorter than the manager's defaults (15s/10s/2s) so that a failover is quick.
const (
	ManagerLeaseNamespace = "nodeops-system"
	ManagerLeaseName      = "nodeops-manager.nodeops.io" // cmd/manager's leaderElectionID
	ManagerLeaseDuration  = 6 * time.Second
	managerRenewDeadline  = 4 * time.Second
	managerRetryPeriod    = 1 * time.Second
)

// localAgentImage names the agent image in the manager's agent Jobs on nodeops-local.
const localAgentImage = "nodeops-local/agent:job"

// managerArgs are the flags of manager process name; elect turns leader election on, with name
// starting the holder identity in the Lease (name_UUID), so a test can tell which process leads.
func (l clusterLayout) managerArgs(name string, elect bool) []string {
	args := []string{
		"--kubeconfig=" + l.managerKubeconfig(),
		"--kube-api-qps=800",
		"--kube-api-burst=1600",
		"--metrics-bind-address=0",
		"--health-probe-bind-address=0",
	}
	if l.ManagerPprof != "" {
		args = append(args, "--pprof-bind-address="+l.ManagerPprof)
	}
	if l.JobMode {
		// Never pulled: nodeops-local runs bin/agent for the Jobs' pods (runAgentPods).
		args = append(args, "--agent-mode="+AgentModeJob, "--agent-image="+localAgentImage)
	}
	if !elect {
		return append(args, "--leader-elect=false")
	}
	return append(args,
		"--leader-elect=true",
		"--leader-election-namespace="+ManagerLeaseNamespace,
		"--leader-election-identity="+name,
		"--leader-elect-lease-duration="+ManagerLeaseDuration.String(),
		"--leader-elect-renew-deadline="+managerRenewDeadline.String(),
		"--leader-elect-retry-period="+managerRetryPeriod.String(),
	)
}

// ManagerNames are the process names of the managers nodeops-local starts for Options.Managers = n.
func ManagerNames(n int) []string {
	if n <= 1 {
		return []string{"manager"}
	}
	names := make([]string, n)
	for i := range names {
		names[i] = "manager-" + strconv.Itoa(i+1)
	}
	return names
}

func (l clusterLayout) agentArgs(node string) []string {
	args := []string{
		"--kubeconfig=" + l.componentKubeconfig(),
		"--node-name=" + node,
		"--host-root=" + filepath.Join(l.Dir, "nodes", node),
		"--service-manager=local",
		"--identity=nodeops-local-agent-" + node,
	}
	if port, ok := l.CAServerPorts[node]; ok {
		addr := "127.0.0.1:" + strconv.Itoa(port)
		args = append(args, "--ca-server-address="+addr, "--ca-server-advertise="+addr)
	}
	if l.PodBound {
		args[0] = "--kubeconfig=" + CredentialsKubeconfig(l.Dir, "agent-"+node)
		args = append(args, "--pod-name="+StandInAgentPodName(node), "--pod-namespace="+SystemNamespace)
	}
	return args
}

// simAgentArgs: the one agent of every simulated node keeps the administrator's kubeconfig even with
// pod-bound credentials, as a token is bound to one node.
func (l clusterLayout) simAgentArgs() []string {
	args := []string{
		"--kubeconfig=" + l.componentKubeconfig(),
		"--noop-host",
		"--node-prefix=sim-",
		"--identity=nodeops-local-agent-sim",
		// One directory per cluster: a second sim agent shares the nodes' locks, another cluster does not.
		"--lock-dir=" + filepath.Join(l.Dir, "sim-locks"),
	}
	if l.SimAgentPprof != "" {
		args = append(args, "--pprof-bind-address="+l.SimAgentPprof)
	}
	return args
}

func execute(t *template.Template, data any) string {
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		// The templates are fixed and their data plain strings: a failure is a bug in this file.
		return fmt.Sprintf("# rendering %s: %v\n", t.Name(), err)
	}
	return b.String()
}
