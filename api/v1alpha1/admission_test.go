package v1alpha1_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/clustertarget"
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/testutil"
)

// admission is one manifest for the real API server: refused naming field with a message containing
// msg, or accepted when field is empty.
type admission struct {
	name     string
	manifest string
	field    string
	msg      string
}

// op wraps commands (YAML list items, indented as under "commands:") in a custom NodeOperation.
func op(name, commands string) string {
	return fmt.Sprintf(`apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: %s
spec:
  custom:
    groups:
    - name: g
      commands:
%s`, name, indent(commands, "      "))
}

// task wraps commands in a NodeTask for node n1.
func task(name, commands string) string {
	return fmt.Sprintf(`apiVersion: nodeops.io/v1alpha1
kind: NodeTask
metadata:
  name: %s
spec:
  nodeName: n1
  commands:
%s`, name, indent(commands, "  "))
}

// profile wraps commands in an auto-provisioning NodeProfile's install list.
func profile(name, install string) string {
	return fmt.Sprintf(`apiVersion: nodeops.io/v1alpha1
kind: NodeProfile
metadata:
  name: %s
spec:
  autoProvision: true
  install:
%s`, name, indent(install, "  "))
}

// rotation is a NodeOperation rotating the certificate authorities with the given settings (YAML flow).
func rotation(name, settings string) string {
	return fmt.Sprintf(`apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: %s
spec:
  rotateCertificateAuthorities: %s
`, name, settings)
}

// reconfigure is a NodeOperation reconfiguring the cluster with the given settings (YAML flow).
func reconfigure(name, settings string) string {
	return fmt.Sprintf(`apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: %s
spec:
  reconfigure: %s
`, name, settings)
}

// manyArgs is n extraArgs in YAML flow style.
func manyArgs(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf("{name: f%d, value: v}", i)
	}
	return strings.Join(parts, ", ")
}

func indent(s, by string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = by + l
	}
	return strings.Join(lines, "\n") + "\n"
}

const (
	cmdPath   = "spec.custom.groups[0].commands[0]"
	taskPath  = "spec.commands[0]"
	profPath  = "spec.install[0]"
	kubeadmOK = "- kubeadmUpgradeNode:\n    ignorePreflightErrors: [Swap, Port-6443, FileAvailable--etc-kubernetes-manifests-kube-apiserver.yaml]\n"
)

func admissionCases() []admission {
	return []admission{
		// Durations: negative, zero where meaningless, and huge.
		{"negative command timeout", op("t1", "- timeout: -5s\n  cordon: {}"), cmdPath + ".timeout", "timeout must be from 1s to 24h"},
		{"zero command timeout", op("t2", "- timeout: 0s\n  cordon: {}"), cmdPath + ".timeout", "timeout must be from 1s to 24h"},
		{"huge command timeout", task("t3", "- timeout: 8760h\n  cordon: {}"), taskPath + ".timeout", "timeout must be from 1s to 24h"},
		{"negative drain timeout", op("t4", "- drain:\n    timeout: -1m"), cmdPath + ".drain.timeout", "drain timeout must be from 1s to 24h"},
		{"huge drain timeout", profile("t5", "- drain:\n    timeout: 100h"), profPath + ".drain.timeout", "drain timeout must be from 1s to 24h"},
		{"negative grace period", op("t6", "- drain:\n    gracePeriodSeconds: -1"), cmdPath + ".drain.gracePeriodSeconds", "should be greater than or equal to 0"},
		{"huge grace period", op("t7", "- drain:\n    gracePeriodSeconds: 864000"), cmdPath + ".drain.gracePeriodSeconds", "should be less than or equal to 86400"},
		{"negative waitNodeReady timeout", task("t8", "- waitNodeReady:\n    timeout: -1s"), taskPath + ".waitNodeReady.timeout", "waitNodeReady timeout must be from 1s to 24h"},
		{"huge wait", op("t9", "- wait:\n    duration: 25h"), cmdPath + ".wait.duration", "wait duration must be from 0s to 24h"},
		{"negative wait", profile("t10", "- wait:\n    duration: -1s"), profPath + ".wait.duration", "wait duration must be from 0s to 24h"},
		{"upgrade drain timeout", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: t11
spec:
  upgrade:
    kubernetesVersion: v1.37.2
    upgradeKubeletAndKubectl: false
    drain:
      timeout: 48h
`, "spec.upgrade.drain.timeout", "drain timeout must be from 1s to 24h"},
		{"retries over 10", op("t12", "- retries: 11\n  cordon: {}"), cmdPath + ".retries", "should be less than or equal to 10"},

		// kubeadm's preflight check names, and "all" only with its flag.
		{"unknown preflight check", op("k1", "- kubeadmUpgradeNode:\n    ignorePreflightErrors: [NoSuchCheck]"), cmdPath + ".kubeadmUpgradeNode.ignorePreflightErrors[0]", "should match"},
		{"flag-like preflight check", task("k2", "- kubeadmUpgradeApply:\n    kubernetesVersion: v1.37.2\n    ignorePreflightErrors: [Swap, --force]"), taskPath + ".kubeadmUpgradeApply.ignorePreflightErrors[1]", "should match"},
		{"all without its flag", op("k3", "- kubeadmUpgradePlan:\n    kubernetesVersion: v1.37.2\n    ignorePreflightErrors: [all]"), cmdPath + ".kubeadmUpgradePlan.ignorePreflightErrors", "allowIgnoreAllPreflightErrors: true"},
		{"All in capitals without its flag", op("k4", "- kubeadmUpgradeNode:\n    ignorePreflightErrors: [All]"), cmdPath + ".kubeadmUpgradeNode.ignorePreflightErrors", "allowIgnoreAllPreflightErrors: true"},
		{"all with others", op("k5", "- kubeadmUpgradeNode:\n    allowIgnoreAllPreflightErrors: true\n    ignorePreflightErrors: [all, Swap]"), cmdPath + ".kubeadmUpgradeNode.ignorePreflightErrors", "only alone"},
		{"upgrade all without its flag", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: k6
spec:
  upgrade:
    kubernetesVersion: v1.37.2
    upgradeKubeletAndKubectl: false
    ignorePreflightErrors: [all]
`, "spec.upgrade.ignorePreflightErrors", "allowIgnoreAllPreflightErrors: true"},
		{"duplicate preflight check", op("k7", "- kubeadmUpgradeNode:\n    ignorePreflightErrors: [Swap, Swap]"), cmdPath + ".kubeadmUpgradeNode.ignorePreflightErrors[1]", "Duplicate value"},
		{"port check out of pattern", op("k8", "- kubeadmUpgradeNode:\n    ignorePreflightErrors: [Port-http]"), cmdPath + ".kubeadmUpgradeNode.ignorePreflightErrors[0]", "should match"},

		// Services, files and modes.
		{"service name starting with -", op("s1", "- restartService:\n    name: --now"), cmdPath + ".restartService.name", "should match"},
		{"service name starting with .", task("s2", "- restartService:\n    name: ../kubelet"), taskPath + ".restartService.name", "should match"},
		{"setuid mode", op("f1", "- installFile:\n    url: https://x/y\n    sha256: "+sha+"\n    path: /usr/local/bin/y\n    mode: \"4755\""), cmdPath + ".installFile.mode", "setuid, setgid or sticky"},
		{"setgid mode with leading 0", profile("f2", "- installFile:\n    url: https://x/y\n    sha256: "+sha+"\n    path: /usr/local/bin/y\n    mode: \"02755\""), profPath + ".installFile.mode", "setuid, setgid or sticky"},
		{"sticky mode", task("f3", "- installFile:\n    url: https://x/y\n    sha256: "+sha+"\n    path: /tmp/y\n    mode: \"1777\""), taskPath + ".installFile.mode", "setuid, setgid or sticky"},
		{"world-writable mode", op("f4", "- installFile:\n    url: https://x/y\n    sha256: "+sha+"\n    path: /etc/y\n    mode: \"0666\""), cmdPath + ".installFile.mode", "world-writable"},
		{"world-writable 3-digit mode", op("f5", "- installFile:\n    url: https://x/y\n    sha256: "+sha+"\n    path: /etc/y\n    mode: \"757\""), cmdPath + ".installFile.mode", "world-writable"},
		{"mode not octal", op("f6", "- installFile:\n    url: https://x/y\n    sha256: "+sha+"\n    path: /etc/y\n    mode: \"0855\""), cmdPath + ".installFile.mode", "should match"},
		{"relative installFile path", op("f7", "- installFile:\n    url: https://x/y\n    sha256: "+sha+"\n    path: etc/y"), cmdPath + ".installFile.path", "should match '^/'"},
		{"installFile path with ..", profile("f8", "- installFile:\n    url: https://x/y\n    sha256: "+sha+"\n    path: /opt/../../etc/shadow"), profPath + ".installFile.path", "must not contain '..'"},
		{"installFile path ending in ..", task("f9", "- installFile:\n    url: https://x/y\n    sha256: "+sha+"\n    path: /opt/..\n    remove: true"), taskPath + ".installFile.path", "must not contain '..'"},
		{"sha256 in capitals", op("f10", "- installFile:\n    url: https://x/y\n    sha256: "+strings.ToUpper(sha)+"\n    path: /etc/y"), cmdPath + ".installFile.sha256", "should match"},
		{"installFile from ftp", op("f11", "- installFile:\n    url: ftp://x/y\n    sha256: "+sha+"\n    path: /etc/y"), cmdPath + ".installFile.url", "should match"},
		{"installFile over plain http", op("h1", "- installFile:\n    url: http://mirror.local/y\n    sha256: "+sha+"\n    path: /etc/y"), cmdPath + ".installFile.url", "url is plain http: use https, or set insecureHTTP: true"},
		{"installFile over plain http in a profile", profile("h2", "- installFile:\n    url: http://mirror.local/y\n    sha256: "+sha+"\n    path: /etc/y\n    insecureHTTP: false"), profPath + ".installFile.url", "set insecureHTTP: true"},
		{"installFile with both url and platforms", profile("p1", "- installFile:\n    url: https://x/y\n    sha256: "+sha+"\n    platforms: [{arch: arm64, url: 'https://x/arm64', sha256: "+sha+"}]\n    path: /opt/y"), profPath + ".installFile", "set either url and sha256"},
		{"installFile with neither url nor platforms", profile("p2", "- installFile:\n    path: /opt/y"), profPath + ".installFile", "set either url and sha256"},
		{"installFile url without sha256", op("p3", "- installFile:\n    url: https://x/y\n    path: /opt/y"), cmdPath + ".installFile.sha256", "url and sha256 go together"},
		{"installFile platform with an unknown arch", profile("p4", "- installFile:\n    platforms: [{arch: x86, url: 'https://x/a', sha256: "+sha+"}]\n    path: /opt/y"), profPath + ".installFile.platforms[0].arch", "supported values"},
		{"installFile platform twice", profile("p5", "- installFile:\n    platforms: [{arch: arm64, url: 'https://x/a', sha256: "+sha+"}, {os: linux, arch: arm64, url: 'https://x/b', sha256: "+sha+"}]\n    path: /opt/y"), profPath + ".installFile.platforms", "each os and arch may appear once"},
		{"installFile platform over plain http", profile("p6", "- installFile:\n    platforms: [{arch: arm64, url: 'http://x/a', sha256: "+sha+"}]\n    path: /opt/y"), profPath + ".installFile.platforms", "a platform's url is plain http"},
		{"installFile platforms and sha256 alone", task("p7", "- installFile:\n    platforms: [{arch: arm64, url: 'https://x/a', sha256: "+sha+"}]\n    sha256: "+sha+"\n    path: /opt/y"), taskPath + ".installFile.sha256", "url and sha256 go together"},
		{"installFile per platform, accepted", profile("p8", "- installFile:\n    platforms: [{arch: arm64, url: 'https://x/a', sha256: "+sha+"}, {arch: amd64, url: 'https://x/b', sha256: "+sha+"}]\n    path: /opt/y"), "", ""},
		{"provisionedLabels in nodeops.io", profile("l1", "- wait: {duration: 1s}") + "  provisionedLabels:\n  - {key: nodeops.io/profile.other, value: provisioned}\n", "spec.provisionedLabels[0].key", "nodeops.io/ labels are nodeops' own"},
		{"provisionedLabels value not a label value", profile("l2", "- wait: {duration: 1s}") + "  provisionedLabels:\n  - {key: kwasm.sh/kwasm-provisioned, value: '$(NODE)'}\n", "spec.provisionedLabels[0].value", "should match"},
		{"provisionedLabels key not a label key", profile("l3", "- wait: {duration: 1s}") + "  provisionedLabels:\n  - {key: 'kwasm.sh/', value: x}\n", "spec.provisionedLabels[0].key", "should match"},
		{"installFile caBundle not PEM", task("h3", "- installFile:\n    url: https://x/y\n    sha256: "+sha+"\n    path: /etc/y\n    caBundle: not-a-certificate"), taskPath + ".installFile.caBundle", "should match '^\\s*-----BEGIN CERTIFICATE-----'"},
		{"binaries over plain http", op("h4", "- installBinaries:\n    components: [kubelet]\n    version: v1.37.2\n    source: {baseURL: 'http://mirror.local/release'}"), cmdPath + ".installBinaries.source.baseURL", "baseURL is plain http: use https, or set insecureHTTP: true"},
		{"upgrade binarySource over plain http", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: h5
spec:
  upgrade:
    kubernetesVersion: v1.37.2
    binarySource: {baseURL: 'http://mirror.local/release'}
`, "spec.upgrade.binarySource.baseURL", "set insecureHTTP: true"},
		{"cluster target binarySource over plain http", `apiVersion: nodeops.io/v1alpha1
kind: ClusterTarget
metadata:
  name: cluster
spec:
  kubernetesVersion: v1.37.2
  upgrade:
    binarySource: {baseURL: 'http://mirror.local/release'}
`, "spec.upgrade.binarySource.baseURL", "set insecureHTTP: true"},
		{"cluster target pins digests", `apiVersion: nodeops.io/v1alpha1
kind: ClusterTarget
metadata:
  name: cluster
spec:
  kubernetesVersion: v1.37.2
  upgrade:
    binarySource: {baseURL: 'https://mirror.local/release', sha256: {kubelet: ` + sha + `}}
`, "spec.upgrade.binarySource.sha256", "a ClusterTarget upgrades through several"},
		{"pinned digest not hex", op("h7", "- installBinaries:\n    components: [kubelet]\n    version: v1.37.2\n    source: {baseURL: 'https://x', sha256: {kubelet: "+strings.ToUpper(sha)+"}}"), cmdPath + ".installBinaries.source.sha256.kubelet", "should match"},
		{"binarySource caBundle not PEM", op("h8", "- installBinaries:\n    components: [kubelet]\n    version: v1.37.2\n    source: {baseURL: 'https://x', caBundle: 'MIIB'}"), cmdPath + ".installBinaries.source.caBundle", "should match '^\\s*-----BEGIN CERTIFICATE-----'"},

		// Script env from Secrets.
		{"secretKeyRef without a name", op("e1", "- script:\n    inline: echo\n    env:\n    - name: TOKEN\n      valueFrom: {secretKeyRef: {key: token}}"), cmdPath + ".script.env[0].valueFrom.secretKeyRef.name", "Required value"},
		{"secretKeyRef without a key", task("e2", "- script:\n    inline: echo\n    env:\n    - name: TOKEN\n      valueFrom: {secretKeyRef: {name: nodeops-script-creds}}"), taskPath + ".script.env[0].valueFrom.secretKeyRef.key", "Required value"},
		{"value and valueFrom together", op("e3", "- script:\n    inline: echo\n    env:\n    - name: TOKEN\n      value: plain\n      valueFrom: {secretKeyRef: {name: nodeops-script-creds, key: token}}"), cmdPath + ".script.env[0].valueFrom", "value and valueFrom are exclusive"},
		{"envFrom secretRef without a name", profile("e4", "- script:\n    inline: echo\n    envFrom:\n    - secretRef: {}"), profPath + ".script.envFrom[0].secretRef.name", "Required value"},
		// Only Secrets named nodeops-script-* reach a script: not Helm's release Secrets, nor any other in nodeops-system.
		{"secretKeyRef name without the prefix", op("e6", "- script:\n    inline: echo\n    env:\n    - name: RELEASE\n      valueFrom: {secretKeyRef: {name: sh.helm.release.v1.nodeops.v1, key: release}}"), cmdPath + ".script.env[0].valueFrom.secretKeyRef.name", "secretKeyRef.name must start with nodeops-script-"},
		{"envFrom secretRef name without the prefix", task("e7", "- script:\n    inline: echo\n    envFrom:\n    - secretRef: {name: db-creds}"), taskPath + ".script.envFrom[0].secretRef.name", "secretRef.name must start with nodeops-script-"},
		{"envFrom secretRef name with the prefix inside", profile("e8", "- script:\n    inline: echo\n    envFrom:\n    - secretRef: {name: x.nodeops-script-y}"), profPath + ".script.envFrom[0].secretRef.name", "secretRef.name must start with nodeops-script-"},
		{"envFrom secret name not a name", op("e5", "- script:\n    inline: echo\n    envFrom:\n    - secretRef: {name: ../other}"), cmdPath + ".script.envFrom[0].secretRef.name", "should match"},
		{"relative containerd binaryPath", op("c1", "- containerdRuntime:\n    name: wasm\n    runtimeType: io.containerd.wasmedge.v1\n    binaryPath: bin/shim"), cmdPath + ".containerdRuntime.binaryPath", "should match '^/'"},
		{"relative containerd configPath", profile("c2", "- containerdRuntime:\n    name: wasm\n    runtimeType: io.containerd.wasmedge.v1\n    configPath: config.toml"), profPath + ".containerdRuntime.configPath", "should match '^/'"},
		{"containerd configPath with ..", task("c3", "- containerdRuntime:\n    name: wasm\n    remove: true\n    configPath: /etc/../../x"), taskPath + ".containerdRuntime.configPath", "must not contain '..'"},
		{"containerd runtimeType with a quote", op("c4", "- containerdRuntime:\n    name: wasm\n    runtimeType: 'io.x\"]\n[evil'"), cmdPath + ".containerdRuntime.runtimeType", "should match"},
		{"containerd add without runtimeType", op("c5", "- containerdRuntime:\n    name: wasm"), cmdPath + ".containerdRuntime.runtimeType", "runtimeType is required"},
		{"containerd distro unknown", op("c6", "- containerdRuntime:\n    name: wasm\n    runtimeType: io.containerd.wasmedge.v1\n    distro: k8s"), cmdPath + ".containerdRuntime.distro", "Unsupported value"},
		{"containerd option name with a quote", profile("c7", "- containerdRuntime:\n    name: wasm\n    runtimeType: io.containerd.wasmedge.v1\n    options: {'a\"]': x}"), profPath + ".containerdRuntime.options", "option names are"},
		{"containerd option value too long", task("c8", "- containerdRuntime:\n    name: wasm\n    runtimeType: io.containerd.wasmedge.v1\n    options: {BinaryName: '"+strings.Repeat("x", 1025)+"'}"), taskPath + ".containerdRuntime.options", "at most 1024 characters"},
		{"containerd too many options", op("c9", "- containerdRuntime:\n    name: wasm\n    runtimeType: io.containerd.wasmedge.v1\n    options: {"+manyOptions(33)+"}"), cmdPath + ".containerdRuntime.options", "must have at most 32 items"},
		{"containerd pod annotation with a space", op("c10", "- containerdRuntime:\n    name: wasm\n    runtimeType: io.containerd.wasmedge.v1\n    podAnnotations: ['a b']"), cmdPath + ".containerdRuntime.podAnnotations[0]", "should match"},
		{"containerd drain with skipRestart", profile("c11", "- containerdRuntime:\n    name: wasm\n    runtimeType: io.containerd.wasmedge.v1\n    skipRestart: true\n    restart: {drain: true}"), profPath + ".containerdRuntime.restart", "restart.drain needs a restart"},
		{"relative preflight binary", op("p1", "- preflight:\n    checks:\n    - binary: usr/bin/kubeadm"), cmdPath + ".preflight.checks[0].binary", "should match '^/'"},
		{"preflight binary with ..", op("p2", "- preflight:\n    checks:\n    - binary: /usr/../../bin/sh"), cmdPath + ".preflight.checks[0].binary", "must not contain '..'"},
		{"huge free disk", op("p3", "- preflight:\n    checks:\n    - minFreeDiskMiB: 9007199254740993"), cmdPath + ".preflight.checks[0].minFreeDiskMiB", "should be less than or equal to 1073741824"},
		{"unknown OS family", op("p4", "- preflight:\n    checks:\n    - osFamily: [windows]"), cmdPath + ".preflight.checks[0].osFamily[0]", "Unsupported value"},

		// Names unique in each list; their defaults are their kinds.
		{"a name twice in a group", op("u1", "- name: x\n  cordon: {}\n- name: x\n  script: {inline: 'true'}"), "spec.custom.groups[0].commands", "command names must be unique"},
		{"a name equal to another's kind", task("u2", "- drain: {}\n- name: drain\n  cordon: {}"), "spec.commands", "command names must be unique"},
		{"two commands named alike in a profile", profile("u3", "- name: step\n  cordon: {}\n- name: step\n  uncordon: {}"), "spec.install", "command names must be unique"},
		{"duplicate group names", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: u4
spec:
  custom:
    groups:
    - name: g
      commands: [{cordon: {}}]
    - name: g
      commands: [{uncordon: {}}]
`, "spec.custom.groups[1]", "Duplicate value"},
		{"duplicate runtime classes", `apiVersion: nodeops.io/v1alpha1
kind: NodeProfile
metadata:
  name: u5
spec:
  autoProvision: true
  install: [{cordon: {}}]
  runtimeClasses:
  - {name: wasm, handler: wasm}
  - {name: wasm, handler: other}
`, "spec.runtimeClasses[1]", "Duplicate value"},
		// The pod command: an image, plain env with variable names, a pull policy and a bounded timeout.
		{"pod without an image", op("p1", "- pod: {privileged: true}"), cmdPath + ".pod.image", "Required value"},
		{"pod with an empty image", task("p2", "- pod: {image: ''}"), taskPath + ".pod.image", "should be at least 1 chars long"},
		{"pod env name not a variable name", profile("p3", "- pod:\n    image: busybox\n    env: [{name: 'NODE-ROOT', value: /host}]"), profPath + ".pod.env[0].name", "should match"},
		{"pod pull policy unknown", op("p5", "- pod: {image: busybox, imagePullPolicy: Sometimes}"), cmdPath + ".pod.imagePullPolicy", "Unsupported value"},
		{"pod negative timeout", task("p6", "- pod: {image: busybox, timeout: -1m}"), taskPath + ".pod.timeout", "pod timeout must be from 1s to 24h"},
		{"pod huge timeout", profile("p7", "- pod: {image: busybox, timeout: 48h}"), profPath + ".pod.timeout", "pod timeout must be from 1s to 24h"},
		{"duplicate pod env", op("p8", "- pod:\n    image: busybox\n    env: [{name: A, value: x}, {name: A, value: y}]"), cmdPath + ".pod.env[1]", "Duplicate value"},
		{"valid pod commands", op("p9", `- name: kwasm
  pod:
    image: ghcr.io/kwasm/kwasm-node-installer:v0.3.1
    imagePullPolicy: IfNotPresent
    privileged: true
    hostPID: true
    mountHostRoot: true
    env: [{name: NODE_ROOT, value: /host}]
    timeout: 15m
- pod: {image: busybox, command: [sh, -c], args: ['exit 0']}
`), "", ""},
		{"duplicate script env", op("u6", "- script:\n    inline: echo $A\n    env:\n    - {name: A, value: x}\n    - {name: A, value: y}"), cmdPath + ".script.env[1]", "Duplicate value"},
		{"duplicate uninstall names", `apiVersion: nodeops.io/v1alpha1
kind: NodeProfile
metadata:
  name: u7
spec:
  autoProvision: true
  install: [{cordon: {}}]
  uninstall: [{wait: {duration: 1s}}, {name: wait, script: {inline: 'true'}}]
`, "spec.uninstall", "command names must be unique"},
		{"duplicate binaries", op("u8", "- installBinaries:\n    components: [kubelet, kubelet]\n    version: v1.37.2\n    source: {baseURL: 'https://dl.k8s.io/release'}"), cmdPath + ".installBinaries.components[1]", "Duplicate value"},
		{"all with other certificates", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: u9
spec:
  renewCertificates:
    certificates: [all, apiserver]
`, "spec.renewCertificates.certificates", "list it alone"},

		// Names the manager builds from: node, operation and group of a task.
		{"task node name not a subdomain", `apiVersion: nodeops.io/v1alpha1
kind: NodeTask
metadata:
  name: n1
spec:
  nodeName: Worker_1
  commands: [{cordon: {}}]
`, "spec.nodeName", "should match"},
		{"task node name too long", `apiVersion: nodeops.io/v1alpha1
kind: NodeTask
metadata:
  name: n2
spec:
  nodeName: ` + strings.Repeat("n", 254) + `
  commands: [{cordon: {}}]
`, "spec.nodeName", "may not be more than 253"},
		{"task group with a dot", `apiVersion: nodeops.io/v1alpha1
kind: NodeTask
metadata:
  name: n3
spec:
  nodeName: n1
  group: a.b
  commands: [{cordon: {}}]
`, "spec.group", "should match"},

		{"more commands approved than there are", `apiVersion: nodeops.io/v1alpha1
kind: NodeTask
metadata:
  name: n4
spec:
  nodeName: n1
  executionMode: Controlled
  approvedCommands: 3
  commands: [{cordon: {}}, {uncordon: {}}]
`, "spec.approvedCommands", "at most the number of commands"},

		// The ClusterTarget's upgrade settings and renewal window.
		{"cluster target all without its flag", `apiVersion: nodeops.io/v1alpha1
kind: ClusterTarget
metadata:
  name: cluster
spec:
  kubernetesVersion: v1.37.2
  upgrade:
    ignorePreflightErrors: [all]
`, "spec.upgrade.ignorePreflightErrors", "allowIgnoreAllPreflightErrors: true"},
		{"cluster target unknown preflight check", `apiVersion: nodeops.io/v1alpha1
kind: ClusterTarget
metadata:
  name: cluster
spec:
  kubernetesVersion: v1.37.2
  upgrade:
    ignorePreflightErrors: [Swapp]
`, "spec.upgrade.ignorePreflightErrors[0]", "should match"},
		{"cluster target renewBefore negative", `apiVersion: nodeops.io/v1alpha1
kind: ClusterTarget
metadata:
  name: cluster
spec:
  kubernetesVersion: v1.37.2
  certificates: {autoRenew: true, renewBefore: -1h}
`, "spec.certificates.renewBefore", "renewBefore must be from 1h to 87600h"},
		{"cluster target drain timeout huge", `apiVersion: nodeops.io/v1alpha1
kind: ClusterTarget
metadata:
  name: cluster
spec:
  kubernetesVersion: v1.37.2
  upgrade:
    drain: {timeout: 1000h}
`, "spec.upgrade.drain.timeout", "drain timeout must be from 1s to 24h"},

		// Label selectors: an operator the API does not know, In or NotIn without values, Exists or
		// DoesNotExist with values are refused where they are written, not after a node was cordoned.
		{"operation selector with an unknown operator", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: sel1
spec:
  nodeSelector: {matchExpressions: [{key: zone, operator: Within, values: [a]}]}
  custom: {groups: [{name: g, commands: [{cordon: {}}]}]}
`, "spec.nodeSelector", "the operator must be In, NotIn, Exists or DoesNotExist"},
		{"group selector In without values", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: sel2
spec:
  custom: {groups: [{name: g, nodeSelector: {matchExpressions: [{key: zone, operator: In}]}, commands: [{cordon: {}}]}]}
`, "spec.custom.groups[0].nodeSelector", "In and NotIn need values"},
		{"group selector NotIn with empty values", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: sel3
spec:
  custom: {groups: [{name: g, nodeSelector: {matchExpressions: [{key: zone, operator: NotIn, values: []}]}, commands: [{cordon: {}}]}]}
`, "spec.custom.groups[0].nodeSelector", "In and NotIn need values"},
		{"profile selector Exists with values", `apiVersion: nodeops.io/v1alpha1
kind: NodeProfile
metadata:
  name: sel4
spec:
  autoProvision: true
  nodeSelector: {matchExpressions: [{key: wasm, operator: Exists, values: ["true"]}]}
  install: [{cordon: {}}]
`, "spec.nodeSelector", "Exists and DoesNotExist take none"},
		{"drain podSelector with an unknown operator", op("sel5", "- drain:\n    podSelector: {matchExpressions: [{key: app, operator: exists}]}"), cmdPath + ".drain.podSelector", "the operator must be In, NotIn, Exists or DoesNotExist"},
		{"task drain podSelector In without values", task("sel6", "- drain:\n    podSelector: {matchExpressions: [{key: app, operator: In}]}"), taskPath + ".drain.podSelector", "In and NotIn need values"},
		{"upgrade drain podSelector DoesNotExist with values", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: sel7
spec:
  upgrade:
    kubernetesVersion: v1.37.2
    upgradeKubeletAndKubectl: false
    drain: {podSelector: {matchExpressions: [{key: app, operator: DoesNotExist, values: [x]}]}}
`, "spec.upgrade.drain.podSelector", "Exists and DoesNotExist take none"},
		{"valid selectors of every operator", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: sel8
spec:
  nodeSelector:
    matchLabels: {pool: blue}
    matchExpressions: [{key: zone, operator: In, values: [a, b]}, {key: rack, operator: NotIn, values: [r1]}, {key: wasm, operator: Exists}, {key: gpu, operator: DoesNotExist, values: []}]
  custom: {groups: [{name: g, nodeSelector: {matchExpressions: [{key: zone, operator: In, values: [a]}]}, commands: [{drain: {podSelector: {matchExpressions: [{key: app, operator: Exists}]}}}]}]}
`, "", ""},

		// pod.image is an image reference, not any string without spaces.
		{"pod image with a shell metacharacter", op("img1", "- pod: {image: 'busybox;reboot'}"), cmdPath + ".pod.image", "should match"},
		{"pod image with capitals in its path", task("img2", "- pod: {image: ghcr.io/Kwasm/installer}"), taskPath + ".pod.image", "should match"},
		{"pod image with an empty tag", profile("img3", "- pod: {image: 'busybox:'}"), profPath + ".pod.image", "should match"},
		{"pod image starting with a dash", op("img4", "- pod: {image: '-busybox'}"), cmdPath + ".pod.image", "should match"},
		{"pod image with a short digest", op("img5", "- pod: {image: 'busybox@sha256:abc'}"), cmdPath + ".pod.image", "should match"},
		{"valid pod images", op("img6", `- pod: {image: busybox}
- name: tagged
  pod: {image: 'docker.io/library/busybox:1.36.1'}
- name: registry-port
  pod: {image: 'localhost:5000/kwasm/kwasm-node-installer:v0.3.1'}
- name: digest
  pod: {image: 'ghcr.io/kwasm/kwasm-node-installer@sha256:`+sha+`'}
- name: tag-and-digest
  pod: {image: 'registry.k8s.io/pause:3.10@sha256:`+sha+`'}
`), "", ""},

		// installFile names a file: never "/" nor a directory.
		{"installFile remove of /", op("f1", "- installFile: {path: /, remove: true}"), cmdPath + ".installFile.path", "must name a file"},
		{"installFile path ending in /", task("f2", "- installFile: {url: 'https://x/y', sha256: "+sha+", path: /usr/local/bin/}"), taskPath + ".installFile.path", "must name a file"},
		{"installFile path ending in /.", profile("f3", "- installFile: {path: /etc/., remove: true}"), profPath + ".installFile.path", "must name a file"},

		// selectorOnly: the nodeSelector alone decides, over labels no node may set on itself.
		{"selectorOnly with a trigger", `apiVersion: nodeops.io/v1alpha1
kind: NodeProfile
metadata:
  name: so1
spec:
  selectorOnly: true
  autoProvision: true
  trigger: {annotation: kwasm.sh/kwasm-node=true}
  nodeSelector: {matchLabels: {node-restriction.kubernetes.io/wasm: "true"}}
  install: [{cordon: {}}]
`, "spec.selectorOnly", "remove trigger and set autoProvision: true"},
		{"selectorOnly over a label nodes set themselves", `apiVersion: nodeops.io/v1alpha1
kind: NodeProfile
metadata:
  name: so2
spec:
  selectorOnly: true
  autoProvision: true
  nodeSelector: {matchLabels: {wasm: "true"}}
  install: [{cordon: {}}]
`, "spec.nodeSelector", "no node may set on itself"},
		{"selectorOnly without a selector", `apiVersion: nodeops.io/v1alpha1
kind: NodeProfile
metadata:
  name: so3
spec:
  selectorOnly: true
  autoProvision: true
  install: [{cordon: {}}]
`, "spec.nodeSelector", "no node may set on itself"},
		{"valid selectorOnly profile", `apiVersion: nodeops.io/v1alpha1
kind: NodeProfile
metadata:
  name: so4
spec:
  selectorOnly: true
  autoProvision: true
  nodeSelector:
    matchLabels: {node-restriction.kubernetes.io/wasm: "true"}
    matchExpressions: [{key: node-role.kubernetes.io/control-plane, operator: DoesNotExist}]
  install: [{cordon: {}}]
`, "", ""},

		// Accepted: the test must be able to fail both ways.
		{"valid operation with bounds at their limits", op("ok1", `- timeout: 24h
  drain: {timeout: 1s, gracePeriodSeconds: 86400}
- wait: {duration: 0s}
- name: wait-long
  wait: {duration: 24h}
- installFile: {url: 'https://x/y', sha256: `+sha+`, path: /usr/local/bin/y, mode: "0755"}
- script: {inline: 'true'}
- script: {inline: 'false', idempotent: true}
- name: with-secrets
  script:
    inline: 'echo "$TOKEN"'
    env: [{name: PLAIN, value: x}, {name: TOKEN, valueFrom: {secretKeyRef: {name: nodeops-script-creds, key: token}}}]
    envFrom: [{secretRef: {name: nodeops-script-more-creds}}]
- name: insecure-asked-for
  installFile: {url: 'http://mirror.local/y', insecureHTTP: true, sha256: `+sha+`, path: /usr/local/bin/w}
- name: with-ca
  installFile: {url: 'https://mirror.local/y', caBundle: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", sha256: `+sha+`, path: /usr/local/bin/v}
- name: remove-over-http
  installFile: {url: 'http://mirror.local/y', sha256: `+sha+`, path: /usr/local/bin/u, remove: true}
- installBinaries: {components: [kubelet, kubectl], version: v1.37.2, source: {baseURL: 'http://mirror.local', insecureHTTP: true, sha256: {kubelet: `+sha+`}}}
- name: setuid-asked-for
  installFile: {url: 'https://x/y', sha256: `+sha+`, path: /usr/local/bin/z, mode: "4755", allowUnsafeMode: true}
`+kubeadmOK), "", ""},
		{"valid task with all and its flag", task("ok2", "- kubeadmUpgradeApply:\n    kubernetesVersion: v1.37.2\n    allowIgnoreAllPreflightErrors: true\n    ignorePreflightErrors: [all]\n- containerdRuntime:\n    name: wasm\n    runtimeType: io.containerd.wasmedge.v1\n    binaryPath: /usr/local/bin/containerd-shim-wasmedge-v1\n- name: unload\n  containerdRuntime:\n    name: wasm\n    remove: true\n- name: k3s\n  containerdRuntime:\n    name: spin\n    runtimeType: io.containerd.spin.v2\n    distro: k3s\n    options: {SystemdCgroup: 'true', BinaryName: /usr/bin/spin}\n    podAnnotations: ['io.spin.*']\n    restart: {drain: true}\n- restartService: {name: kubelet.service}\n- name: getty\n  restartService: {name: getty@tty1}"), "", ""},
		{"valid profile with a 253-character node's task", `apiVersion: nodeops.io/v1alpha1
kind: NodeTask
metadata:
  name: ` + objname.TaskName("p", "install-abc", strings.Repeat("n", 253)) + `
  labels:
    nodeops.io/node: ` + objname.LabelValue(strings.Repeat("n", 253)) + `
spec:
  nodeName: ` + strings.Repeat("n", 253) + `
  group: install-abc
  operation: p
  commands: [{preflight: {checks: [{binary: /usr/bin/kubeadm}, {osFamily: [debian, rhel]}]}}]
`, "", ""},
		{"valid cluster target", `apiVersion: nodeops.io/v1alpha1
kind: ClusterTarget
metadata:
  name: cluster
spec:
  kubernetesVersion: v1.37.2
  certificates: {autoRenew: true, renewBefore: 2160h}
  upgrade:
    allowIgnoreAllPreflightErrors: true
    ignorePreflightErrors: [all]
    drain: {timeout: 30m}
`, "", ""},
		// The certificate authority rotation: admitted, it ran end to end (TestRotateCertificateAuthorities).
		{"rotation", rotation("r1", "{}"), "", ""},
		{"rotation of an unknown authority", rotation("r2", "{authorities: [kube-ca]}"), "spec.rotateCertificateAuthorities.authorities[0]", "Unsupported value"},
		{"rotation completion unknown", rotation("r3", "{completion: Later}"), "spec.rotateCertificateAuthorities.completion", "Unsupported value"},
		{"rotation beside an upgrade", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: r4
spec:
  renewCertificates: {}
  rotateCertificateAuthorities: {}
`, "spec", "exactly one of upgrade, renewCertificates, reconfigure, rotateCertificateAuthorities or custom"},
		{"target rotation of an unknown authority", `apiVersion: nodeops.io/v1alpha1
kind: ClusterTarget
metadata:
  name: cluster
spec:
  kubernetesVersion: v1.37.2
  certificateAuthorities: {authorities: [cluster, sa]}
`, "spec.certificateAuthorities.authorities[1]", "Unsupported value"},
		{"target rotation completion unknown", `apiVersion: nodeops.io/v1alpha1
kind: ClusterTarget
metadata:
  name: cluster
spec:
  kubernetesVersion: v1.37.2
  certificateAuthorities: {completion: Soon}
`, "spec.certificateAuthorities.completion", "Unsupported value"},
		{"target rotationCount negative", `apiVersion: nodeops.io/v1alpha1
kind: ClusterTarget
metadata:
  name: cluster
spec:
  kubernetesVersion: v1.37.2
  certificateAuthorities: {rotationCount: -1}
`, "spec.certificateAuthorities.rotationCount", "should be greater than or equal to 0"},
		{"valid complete command", task("ok-r5", "- trustCertificateAuthorities:\n    trust: NewOnly"), "", ""},
		{"valid complete command in a custom operation", op("ok-r5b", "- trustCertificateAuthorities:\n    trust: NewOnly\n    serviceAccountKey: true"), "", ""},
		{"trust of neither", op("r5c", "- trustCertificateAuthorities:\n    trust: Old"), cmdPath + ".trustCertificateAuthorities.trust", "Unsupported value"},
		{"valid trust-both command", op("ok-r2", "- trustCertificateAuthorities:\n    trust: OldAndNew\n    serviceAccountKey: true"), "", ""},
		{"valid re-issue command", op("ok-r7", "- reissueCertificates:\n    authorities: [cluster, etcd]\n    serviceAccountKey: true"), "", ""},
		{"re-issue of an unknown authority", task("r7", "- reissueCertificates:\n    authorities: [sa]"), taskPath + ".reissueCertificates.authorities[0]", "Unsupported value"},
		{"valid publish commands", op("ok-r6", "- publishCertificateAuthorities:\n    trust: OldAndNew\n- publishCertificateAuthorities:\n    trust: NewOnly\n    authorities: [cluster]"), "", ""},
		{"publish without trust", op("r6", "- publishCertificateAuthorities: {}"), cmdPath + ".publishCertificateAuthorities.trust", "Required value"},
		{"generate of an unknown authority", task("r8", "- generateCertificateAuthorities:\n    authorities: [sa]"), taskPath + ".generateCertificateAuthorities.authorities[0]", "Unsupported value"},
		{"copy of a repeated authority", task("r9", "- copyCertificateAuthorities:\n    authorities: [etcd, etcd]"), taskPath + ".copyCertificateAuthorities.authorities[1]", "Duplicate value"},
		{"valid prepare commands", task("ok-r1", "- generateCertificateAuthorities:\n    authorities: [cluster, front-proxy]\n    serviceAccountKey: true\n- copyCertificateAuthorities: {}"), "", ""},
		{"reconfigure with nothing", reconfigure("rc1", "{drain: {}}"), "spec.reconfigure", "there is nothing to reconfigure"},
		{"reconfigure with an empty clusterConfiguration", reconfigure("rc2", "{clusterConfiguration: {}}"), "spec.reconfigure.clusterConfiguration", "clusterConfiguration changes nothing"},
		{"reconfigure flag with its dashes", reconfigure("rc3", "{clusterConfiguration: {apiServer: {extraArgs: [{name: --audit-log-maxage, value: '30'}]}}}"), "spec.reconfigure.clusterConfiguration.apiServer.extraArgs[0].name", "should match"},
		{"reconfigure flag with its value in the name", reconfigure("rc4", "{clusterConfiguration: {scheduler: {extraArgs: [{name: v=2, value: '2'}]}}}"), "spec.reconfigure.clusterConfiguration.scheduler.extraArgs[0].name", "should match"},
		{"reconfigure flag set and removed", reconfigure("rc5", "{clusterConfiguration: {controllerManager: {extraArgs: [{name: v, value: '2'}], removeExtraArgs: [v]}}}"), "spec.reconfigure.clusterConfiguration.controllerManager", "either set in extraArgs or removed in removeExtraArgs"},
		{"reconfigure kubelet apiVersion", reconfigure("rc6", "{kubeletConfiguration: \"apiVersion: v1\\nmaxPods: 150\\n\"}"), "spec.reconfigure.kubeletConfiguration", "apiVersion and kind are kubeadm's"},
		{"reconfigure kubelet kind in JSON", reconfigure("rc7", `{kubeletConfiguration: '{"kind": "KubeletConfiguration", "maxPods": 150}'}`), "spec.reconfigure.kubeletConfiguration", "apiVersion and kind are kubeadm's"},
		{"valid reconfigure of etcd", reconfigure("ok-rc8", "{clusterConfiguration: {etcd: {extraArgs: [{name: quota-backend-bytes, value: '8589934592'}], removeExtraArgs: [snapshot-count]}}}"), "", ""},
		{"valid reconfigure of certSANs", reconfigure("ok-rc9", "{clusterConfiguration: {apiServer: {certSANs: [api.example.com, '*.apps.example.com', 10.0.0.7, 'fd00::7']}}}"), "", ""},
		{"reconfigure etcd with nothing", reconfigure("rc8", "{clusterConfiguration: {etcd: {}}}"), "spec.reconfigure.clusterConfiguration.etcd", "etcd changes nothing"},
		{"reconfigure etcd flag set and removed", reconfigure("rc8b", "{clusterConfiguration: {etcd: {extraArgs: [{name: snapshot-count, value: '5000'}], removeExtraArgs: [snapshot-count]}}}"), "spec.reconfigure.clusterConfiguration.etcd", "either set in extraArgs or removed in removeExtraArgs"},
		{"reconfigure etcd flag with its dashes", reconfigure("rc8c", "{clusterConfiguration: {etcd: {extraArgs: [{name: --snapshot-count, value: '5000'}]}}}"), "spec.reconfigure.clusterConfiguration.etcd.extraArgs[0].name", "should match"},
		{"reconfigure certSAN with a space", reconfigure("rc9", "{clusterConfiguration: {apiServer: {certSANs: ['api example.com']}}}"), "spec.reconfigure.clusterConfiguration.apiServer.certSANs[0]", "should match"},
		{"reconfigure certSAN in capitals", reconfigure("rc9b", "{clusterConfiguration: {apiServer: {certSANs: [API.example.com]}}}"), "spec.reconfigure.clusterConfiguration.apiServer.certSANs[0]", "should match"},
		{"reconfigure certSAN repeated", reconfigure("rc9c", "{clusterConfiguration: {apiServer: {certSANs: [api.example.com, api.example.com]}}}"), "spec.reconfigure.clusterConfiguration.apiServer.certSANs[1]", "Duplicate value"},
		{"reissue command without names", op("rc9d", "- kubeadmReissueAPIServerCertificate: {certSANs: []}"), cmdPath + ".kubeadmReissueAPIServerCertificate.certSANs", "should have at least 1 items"},
		{"reconfigure volume with a relative path", reconfigure("rc10", "{clusterConfiguration: {apiServer: {extraVolumes: [{name: audit, hostPath: var/log, mountPath: /var/log}]}}}"), "spec.reconfigure.clusterConfiguration.apiServer.extraVolumes[0].hostPath", "should match"},
		{"reconfigure too many flags", reconfigure("rc11", "{clusterConfiguration: {apiServer: {extraArgs: ["+manyArgs(33)+"]}}}"), "spec.reconfigure.clusterConfiguration.apiServer.extraArgs", "must have at most 32 items"},
		{"reconfigure and upgrade", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: rc12
spec:
  upgrade: {kubernetesVersion: v1.37.2, upgradeKubeletAndKubectl: false}
  reconfigure: {kubeletConfiguration: "maxPods: 150"}
`, "spec", "exactly one of upgrade, renewCertificates, reconfigure, rotateCertificateAuthorities or custom must be set"},
		{"cluster target kubelet kind", `apiVersion: nodeops.io/v1alpha1
kind: ClusterTarget
metadata:
  name: cluster
spec:
  kubernetesVersion: v1.37.2
  kubelet: {configuration: "kind: KubeletConfiguration"}
`, "spec.kubelet.configuration", "apiVersion and kind are kubeadm's"},
		{"valid cluster target controlPlane with certSANs and etcd", `apiVersion: nodeops.io/v1alpha1
kind: ClusterTarget
metadata:
  name: cluster
spec:
  kubernetesVersion: v1.37.2
  controlPlane: {apiServer: {certSANs: [api.example.com]}, etcd: {extraArgs: [{name: snapshot-count, value: '5000'}]}}
`, "", ""},
		{"valid reconfigure", reconfigure("ok-rc1", "{clusterConfiguration: {apiServer: {extraArgs: [{name: audit-log-maxage, value: '30'}], removeExtraArgs: [profiling], extraVolumes: [{name: audit, hostPath: /var/log/audit, mountPath: /var/log/audit, pathType: DirectoryOrCreate}]}, featureGates: {ControlPlaneKubeletLocalMode: true}}, kubeletConfiguration: \"maxPods: 150\\nevictionHard:\\n  memory.available: 200Mi\\n\", drain: {timeout: 5m}}"), "", ""},
		{"valid upgrade with all and its flag", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: ok4
spec:
  upgrade:
    kubernetesVersion: v1.37.2
    upgradeKubeletAndKubectl: false
    allowIgnoreAllPreflightErrors: true
    ignorePreflightErrors: [all]
    drain: {timeout: 10m}
`, "", ""},
	}
}

const sha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// TestAdmission applies each manifest with kubectl to a real API server carrying the generated CRDs:
// every bad one is refused naming its field, every good one is accepted.
func TestAdmission(t *testing.T) {
	env, kubectl, kubeconfig := startAPIServer(t)
	_ = env
	cases := append(append(append(admissionCases(), windowCases()...), gateCases()...), hookCases()...)
	refused := 0
	for _, tc := range cases {
		if tc.field != "" {
			refused++
		}
	}
	if refused < 40 {
		t.Fatalf("only %d invalid manifests; the table promises at least 40", refused)
	}
	// The samples people copy from must pass too.
	samples, err := filepath.Glob("../../config/samples/*.yaml")
	if err != nil || len(samples) == 0 {
		t.Fatalf("no samples in config/samples: %v", err)
	}
	for _, p := range samples {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, admission{name: "sample " + filepath.Base(p), manifest: string(data)})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(kubectl, "--kubeconfig", kubeconfig, "apply", "-f", "-")
			cmd.Stdin = strings.NewReader(tc.manifest)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			got := out.String()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("refused a valid manifest: %v\n%s\n%s", err, got, tc.manifest)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted an invalid manifest (want %s: %s):\n%s", tc.field, tc.msg, tc.manifest)
			}
			if !strings.Contains(got, tc.field+":") || !strings.Contains(got, tc.msg) {
				t.Fatalf("refused, but the message does not name %q with %q:\n%s", tc.field, tc.msg, got)
			}
		})
	}
}

// A task's operation and group name who owns it and which group's budget it spends: set at
// creation, never changed, as its node and commands are not.
func TestNodeTaskOwnerFieldsImmutable(t *testing.T) {
	env, _, _ := startAPIServer(t)
	ctx := context.Background()
	tk := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "owned"},
		Spec: v1alpha1.NodeTaskSpec{NodeName: "n1", Operation: "op", Group: "g", GateCheck: "resync", Commands: []v1alpha1.Command{{Cordon: &v1alpha1.CordonCommand{}}}}}
	if err := env.Client.Create(ctx, tk); err != nil {
		t.Fatal(err)
	}
	bare := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "bare"},
		Spec: v1alpha1.NodeTaskSpec{NodeName: "n1", Commands: []v1alpha1.Command{{Cordon: &v1alpha1.CordonCommand{}}}}}
	if err := env.Client.Create(ctx, bare); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, task, field string
		mutate            func(*v1alpha1.NodeTaskSpec)
	}{
		{"operation changed", "owned", "spec.operation", func(s *v1alpha1.NodeTaskSpec) { s.Operation = "other" }},
		{"operation cleared", "owned", "spec.operation", func(s *v1alpha1.NodeTaskSpec) { s.Operation = "" }},
		{"operation set", "bare", "spec.operation", func(s *v1alpha1.NodeTaskSpec) { s.Operation = "op" }},
		{"group changed", "owned", "spec.group", func(s *v1alpha1.NodeTaskSpec) { s.Group = "other" }},
		{"group set", "bare", "spec.group", func(s *v1alpha1.NodeTaskSpec) { s.Group = "g" }},
		// No edit turns a task into a gate check or a check into a task (v1alpha1.IsGateCheck).
		{"gateCheck changed", "owned", "spec.gateCheck", func(s *v1alpha1.NodeTaskSpec) { s.GateCheck = "other" }},
		{"gateCheck cleared", "owned", "spec.gateCheck", func(s *v1alpha1.NodeTaskSpec) { s.GateCheck = "" }},
		{"gateCheck set", "bare", "spec.gateCheck", func(s *v1alpha1.NodeTaskSpec) { s.GateCheck = "resync" }},
	} {
		var cur v1alpha1.NodeTask
		if err := env.Client.Get(ctx, client.ObjectKey{Name: tc.task}, &cur); err != nil {
			t.Fatal(err)
		}
		tc.mutate(&cur.Spec)
		err := env.Client.Update(ctx, &cur)
		if err == nil || !strings.Contains(err.Error(), tc.field+": Invalid value") || !strings.Contains(err.Error(), "immutable") {
			t.Errorf("%s: update returned %v; want it refused naming %s as immutable", tc.name, err, tc.field)
		}
	}
	// What may change still does.
	var cur v1alpha1.NodeTask
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "owned"}, &cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Paused = true
	if err := env.Client.Update(ctx, &cur); err != nil {
		t.Errorf("pausing the task: %v", err)
	}
}

// certificateAuthorities.rotationCount is admitted (the ClusterTarget generates a rotation per
// raise) and can only go up: lowering it or removing it is refused, naming the field.
func TestClusterTargetCARotationCountOnlyUp(t *testing.T) {
	env, kubectl, kubeconfig := startAPIServer(t)
	ctx := context.Background()
	cmd := exec.Command(kubectl, "--kubeconfig", kubeconfig, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(`apiVersion: nodeops.io/v1alpha1
kind: ClusterTarget
metadata:
  name: cluster
spec:
  kubernetesVersion: v1.37.2
  certificateAuthorities: {rotationCount: 1, authorities: [cluster, etcd], serviceAccountKey: true}
`)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("a raised certificateAuthorities.rotationCount refused: %v\n%s", err, out.String())
	}
	var ct v1alpha1.ClusterTarget
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "cluster"}, &ct); err != nil {
		t.Fatal(err)
	}
	if ca := ct.Spec.CertificateAuthorities; ca.RotationCount != 1 || ca.Completion != v1alpha1.CompletionManual || !ca.ServiceAccountKey {
		t.Fatalf("stored %+v; want completion defaulted to Manual", ca)
	}
	ct.Spec.CertificateAuthorities.RotationCount = 2
	if err := env.Client.Update(ctx, &ct); err != nil {
		t.Fatalf("raising certificateAuthorities.rotationCount: %v", err)
	}
	for _, tc := range []struct{ name, patch string }{
		{"lowered", `{"spec":{"certificateAuthorities":{"rotationCount":1}}}`},
		{"removed", `{"spec":{"certificateAuthorities":{"rotationCount":null}}}`},
		{"removed with its section", `{"spec":{"certificateAuthorities":null}}`},
	} {
		err := env.Client.Patch(ctx, &ct, client.RawPatch(types.MergePatchType, []byte(tc.patch)))
		if err == nil || !strings.Contains(err.Error(), "spec.certificateAuthorities.rotationCount") || !strings.Contains(err.Error(), "can only go up") {
			t.Errorf("certificateAuthorities.rotationCount %s: %v; want it refused naming the field", tc.name, err)
		}
	}
}

func startAPIServer(t *testing.T) (*testutil.Env, string, string) {
	t.Helper()
	// The CEL rules are the API server's to run: without one these tests fail, never skip, so that
	// `go test ./api/...` cannot pass without having checked them.
	env, err := testutil.Start()
	if err != nil {
		t.Fatal(err)
	}
	kubectl := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		_ = env.Stop()
		t.Fatalf("no kubectl beside the API server (KUBEBUILDER_ASSETS): %v; `make tools` builds it", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	kubeconfig, err := env.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return env, kubectl, kubeconfig
}

// TestNameRuleKnowsEveryKind: the uniqueness rule on command lists spells out each kind's default
// name, so a new kind must be added to it (in every CRD, all from the markers).
func TestNameRuleKnowsEveryKind(t *testing.T) {
	docs, err := testutil.CRDDocuments()
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	for _, doc := range docs {
		rules = append(rules, nameRules(doc)...)
	}
	if len(rules) != 4 {
		t.Errorf("found the command-name rule %d times, want 4 (group, task, install, uninstall)", len(rules))
	}
	typ := reflect.TypeFor[v1alpha1.Command]()
	for _, rule := range rules {
		for i := range typ.NumField() {
			f := typ.Field(i)
			if f.Type.Kind() != reflect.Pointer || f.Type.Elem().PkgPath() != typ.PkgPath() {
				continue
			}
			kind, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !strings.Contains(rule, "has(d."+kind+") ? '"+kind+"'") {
				t.Errorf("the command-name rule does not know kind %q", kind)
			}
		}
	}
}

func nameRules(node any) []string {
	var rules []string
	switch n := node.(type) {
	case map[string]any:
		if msg, _ := n["message"].(string); strings.HasPrefix(msg, "command names must be unique") {
			rule, _ := n["rule"].(string)
			rules = append(rules, rule)
		}
		for _, v := range n {
			rules = append(rules, nameRules(v)...)
		}
	case []any:
		for _, v := range n {
			rules = append(rules, nameRules(v)...)
		}
	}
	return rules
}

// TestPlannedTasksAreAdmitted checks that what a valid operation expands to passes the NodeTask CRD's
// rules, so an accepted operation is never half-applied because its tasks are refused.
func TestPlannedTasksAreAdmitted(t *testing.T) {
	env, _, _ := startAPIServer(t)
	yes := true
	specs := map[string]v1alpha1.NodeOperationSpec{
		"upgrade": {Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", UpgradeKubeletAndKubectl: &yes,
			BinarySource:          &v1alpha1.BinarySource{BaseURL: "https://dl.k8s.io/release"},
			IgnorePreflightErrors: []string{"all"}, AllowIgnoreAllPreflightErrors: true,
			Drain: &v1alpha1.DrainCommand{Timeout: &metav1.Duration{Duration: 3600e9}}}},
		"upgrade-checks": {Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", UpgradeKubeletAndKubectl: new(bool),
			IgnorePreflightErrors: []string{"Swap", "SystemVerification"}}},
		"renew":      {RenewCertificates: &v1alpha1.RenewCertificatesOperation{}},
		"renew-some": {RenewCertificates: &v1alpha1.RenewCertificatesOperation{Certificates: []string{"apiserver", "etcd-server"}}},
		"reconfigure": {Reconfigure: &v1alpha1.ReconfigureOperation{
			ClusterConfiguration: &v1alpha1.ClusterConfigurationPatch{
				APIServer: &v1alpha1.APIServerPatch{ControlPlaneComponentPatch: v1alpha1.ControlPlaneComponentPatch{
					ExtraArgs: []v1alpha1.ExtraArg{{Name: "audit-log-maxage", Value: "30"}}, RemoveExtraArgs: []string{"profiling"},
					ExtraVolumes: []v1alpha1.HostPathMount{{Name: "audit", HostPath: "/var/log/audit", MountPath: "/var/log/audit"}}}},
				FeatureGates: map[string]bool{"ControlPlaneKubeletLocalMode": true}},
			KubeletConfiguration: "maxPods: 150\nevictionHard:\n  memory.available: 200Mi\n",
			Drain:                &v1alpha1.DrainCommand{Timeout: &metav1.Duration{Duration: 300e9}}}},
	}
	// The operation a ClusterTarget with consent to "all" generates.
	ct := &v1alpha1.ClusterTarget{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterTargetName}, Spec: v1alpha1.ClusterTargetSpec{
		KubernetesVersion: "v1.37.2",
		Upgrade: v1alpha1.ClusterUpgrade{IgnorePreflightErrors: []string{"all"}, AllowIgnoreAllPreflightErrors: true,
			BinarySource: &v1alpha1.BinarySource{BaseURL: "https://dl.k8s.io/release"}},
	}}
	gen := clustertarget.Operation(ct, &v1alpha1.GeneratedOperation{Name: "cluster-upgrade-v1-37-2", Kind: v1alpha1.GeneratedUpgrade,
		KubernetesVersion: "v1.37.2", ExecutionMode: v1alpha1.ExecutionAuto})
	if err := env.Client.Create(context.Background(), gen, client.DryRunAll); err != nil {
		t.Errorf("the ClusterTarget's generated operation is refused: %v", err)
	}
	specs["cluster-target"] = gen.Spec
	// The reconfigure a ClusterTarget's controlPlane and kubelet sections generate.
	ct.Spec.ControlPlane = &v1alpha1.ClusterConfigurationPatch{Scheduler: &v1alpha1.ControlPlaneComponentPatch{ExtraArgs: []v1alpha1.ExtraArg{{Name: "v", Value: "3"}}}}
	ct.Spec.Kubelet = &v1alpha1.ClusterKubelet{Configuration: "maxPods: 150\n", Drain: &v1alpha1.DrainCommand{}}
	rec := clustertarget.Operation(ct, &v1alpha1.GeneratedOperation{Name: "cluster-reconfigure-0123456789-1", Kind: v1alpha1.GeneratedReconfigure, ExecutionMode: v1alpha1.ExecutionAuto})
	if err := env.Client.Create(context.Background(), rec, client.DryRunAll); err != nil {
		t.Errorf("the ClusterTarget's generated reconfigure is refused: %v", err)
	}
	specs["cluster-target-reconfigure"] = rec.Spec

	// A profile's install and uninstall tasks, on a node with the longest name there can be.
	long := strings.Repeat("n", 120) + "." + strings.Repeat("m", 132)
	prof := &v1alpha1.NodeProfile{ObjectMeta: metav1.ObjectMeta{Name: strings.Repeat("p", 50)}, Spec: v1alpha1.NodeProfileSpec{
		AutoProvision: true,
		Install:       []v1alpha1.Command{{InstallFile: &v1alpha1.InstallFileCommand{URL: "https://x/shim", SHA256: sha, Path: "/opt/bin/shim", Mode: "0755"}}, {Script: &v1alpha1.ScriptCommand{Inline: "true"}}, {Script: &v1alpha1.ScriptCommand{Inline: "true"}}},
		Uninstall:     []v1alpha1.Command{{InstallFile: &v1alpha1.InstallFileCommand{URL: "https://x/shim", SHA256: sha, Path: "/opt/bin/shim", Remove: true}}},
	}}
	for _, a := range []nodeprofile.Action{nodeprofile.ActionInstall, nodeprofile.ActionUninstall} {
		tk := nodeprofile.BuildTask(prof, long, a, nodeprofile.SpecHash(&prof.Spec))
		tk.OwnerReferences = nil
		if err := env.Client.Create(context.Background(), tk, client.DryRunAll); err != nil {
			t.Errorf("profile %s task: refused: %v", a, err)
		}
	}
	// Every task of a rotation is admitted.
	rot, err := plan.Expand(&v1alpha1.NodeOperationSpec{RotateCertificateAuthorities: &v1alpha1.RotateCertificateAuthoritiesOperation{ServiceAccountKey: true}})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range rot {
		tk := &v1alpha1.NodeTask{
			ObjectMeta: metav1.ObjectMeta{Name: objname.TaskName("rotation", g.Name, "node-1")},
			Spec:       v1alpha1.NodeTaskSpec{NodeName: "node-1", Operation: "rotation", Group: g.Name, Commands: g.Commands, ExecutionMode: v1alpha1.ExecutionAuto},
		}
		err := env.Client.Create(context.Background(), tk, client.DryRunAll)
		if err != nil {
			t.Errorf("rotation group %s: the task is refused: %v", g.Name, err)
		}
	}
	for name, spec := range specs {
		groups, err := plan.Expand(&spec)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, g := range groups {
			tk := &v1alpha1.NodeTask{
				ObjectMeta: metav1.ObjectMeta{Name: objname.TaskName(name, g.Name, "node-1")},
				Spec: v1alpha1.NodeTaskSpec{NodeName: "node-1", Operation: name, Group: g.Name, Commands: g.Commands,
					ExecutionMode: v1alpha1.ExecutionAuto},
			}
			if err := env.Client.Create(context.Background(), tk, client.DryRunAll); err != nil {
				t.Errorf("%s group %s: the task is refused: %v", name, g.Name, err)
			}
		}
	}
}

// manyOptions is n options in YAML flow style.
func manyOptions(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf("o%d: v", i)
	}
	return strings.Join(parts, ", ")
}

// A NodeTask written by hand without approvedCommands can still have its status and spec
// updated: the rule "approvedCommands cannot decrease" reads the field on both sides, so it is
// defaulted to 0 rather than left missing ("no such key: approvedCommands").
func TestNodeTaskWithoutApprovedCommandsCanBeUpdated(t *testing.T) {
	env, kubectl, kubeconfig := startAPIServer(t)
	ctx := context.Background()
	cmd := exec.Command(kubectl, "--kubeconfig", kubeconfig, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(task("by-hand", "- name: c\n  cordon: {}"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("create: %v\n%s", err, out.String())
	}
	var cur v1alpha1.NodeTask
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "by-hand"}, &cur); err != nil {
		t.Fatal(err)
	}
	cur.Status.Phase = v1alpha1.TaskRunning
	if err := env.Client.Status().Update(ctx, &cur); err != nil {
		t.Errorf("updating the status of a task written without approvedCommands: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "by-hand"}, &cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Paused = true
	if err := env.Client.Update(ctx, &cur); err != nil {
		t.Errorf("pausing a task written without approvedCommands: %v", err)
	}
}
