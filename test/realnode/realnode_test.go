//go:build realnode

// Package realnode is the real-node end-to-end test: on the single-node kubeadm cluster that
// `make realnode` starts (real kubelet, containerd and runc; Kubernetes v1.36), it renews the
// certificates by hand as kubeadm's documentation says and then through `kubectl nodeops`
// (printing both times and their ratio), installs and uninstalls a runtime handler through a
// NodeProfile, and upgrades the cluster to v1.37.2 through the ClusterTarget, then checks what an
// administrator would: versions, static pod images, kubelet, node readiness, certificates, a
// workload and the manager; last it rotates the certificate authorities (issue 29). Run it with `make e2e-realnode`, which also brings the node up and
// tears it down, even on failure.
package realnode

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// realnodePoll is how often the real-node test checks a condition: a real kubelet and upgrade take minutes.
const realnodePoll = 2 * time.Second

const (
	fromVersion = "v1.36.3"
	toVersion   = "v1.37.2"
	kubeconfig  = "/etc/kubernetes/admin.conf"
	apiCertFile = "/etc/kubernetes/pki/apiserver.crt"
	logDir      = "/var/lib/nodeops-realnode/logs"
	managerNS   = "nodeops-system"
	workloadNS  = "default"
	pauseImage  = "registry.k8s.io/pause:3.10.2"
	// installerImage is hack/realnode/cmd/installer-test on scratch, imported by `make realnode`.
	installerImage = "localhost/nodeops/installer-test:realnode"
)

type env struct {
	t      *testing.T
	ctx    context.Context
	c      client.Client
	disco  *discovery.DiscoveryClient
	bin    string // the checkout's bin/: kubectl, kubectl-nodeops and the v1.37.2 binaries
	node   string
	nodeIP string
}

// The scenarios share the one node that `make realnode` brought up and run in this order (go test
// runs a file's tests in order, and the files in name order): nodeops' images, renewal, a runtime
// handler through a NodeProfile, a reconfigure, the upgrade, a pod command, a script's Secret from
// the kubelet, and last the rotation of the certificate authorities (rotation_test.go).

// TestRealNode0NodeopsRunsTheImagesMakeImagesBuilt: the manager and agent run the images `make
// images` built, by the index digests its digests.env names (the chart installed with its
// values.yaml, never pulling), and containerd holds each as the multi-arch index.
func TestRealNode0NodeopsRunsTheImagesMakeImagesBuilt(t *testing.T) {
	e := setup(t)
	dir := os.Getenv("NODEOPS_IMAGES")
	if dir == "" {
		dir = filepath.Join(e.bin, "images")
	}
	env := map[string]string{}
	for _, line := range strings.Split(framework.ReadFile(t, filepath.Join(dir, "digests.env")), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			env[k] = v
		}
	}
	for _, w := range []struct{ image, label string }{{"manager", "nodeops-manager"}, {"agent", "nodeops-agent"}} {
		ref := env["NODEOPS_"+strings.ToUpper(w.image)+"_IMAGE"]
		if !strings.Contains(ref, "@sha256:") {
			t.Fatalf("%s/digests.env names no %s image by digest: %q", dir, w.image, ref)
		}
		pod := e.waitRunningPod(managerNS, map[string]string{"app.kubernetes.io/name": w.label}, 3*time.Minute)
		c, cs := pod.Spec.Containers[0], pod.Status.ContainerStatuses[0]
		if c.Image != ref || c.ImagePullPolicy != corev1.PullNever || cs.ImageID != ref {
			t.Errorf("pod %s: image %s (pull %s), running image ID %s; want %s, never pulled", pod.Name, c.Image, c.ImagePullPolicy, cs.ImageID, ref)
		}
		out, err := exec.CommandContext(e.ctx, ctrBinary, "--address", containerdSocket, "-n", "k8s.io", "images", "ls", "name=="+ref).Output()
		if err != nil || !strings.Contains(string(out), "application/vnd.oci.image.index.v1+json") || !strings.Contains(string(out), "linux/amd64,linux/arm64") {
			t.Errorf("ctr images ls name==%s: want the OCI index of linux/amd64 and linux/arm64 (%v):\n%s", ref, err, out)
		}
		t.Logf("pod %s runs %s (image ID %s, status image %s); containerd holds its index for linux/amd64 and linux/arm64", pod.Name, c.Image, cs.ImageID, cs.Image)
	}
}

// TestRealNode1RenewCertificates renews the certificates twice, measured the same way: first by
// hand, as kubeadm's documentation says (the baseline, issue 30), then through `kubectl nodeops
// renew-certs --watch`; it prints both times and their ratio, and where nodeops' time went.
func TestRealNode1RenewCertificates(t *testing.T) {
	e := setup(t)
	var manual time.Duration
	t.Run("by hand as kubeadm's documentation says", func(t *testing.T) {
		byHand := *e
		byHand.t = t
		manual = byHand.manualRenewal()
	})
	fileBefore := certNotBefore(t, framework.ParseCertificate(t, apiCertFile, []byte(framework.ReadFile(t, apiCertFile))))
	time.Sleep(2 * time.Second) // notBefore has second precision: a renewal must be seen to move it
	e.nodeops("plan", "renew-certs")
	begin := time.Now()
	name := e.runOperation("renew-certs")
	end := time.Now()
	// The moment the watch exits Succeeded, before any other request, the restarted API server
	// serves the cluster admin.
	e.controlPlaneServesAtOnce("kubectl nodeops renew-certs --watch")
	e.operationSucceeded(name)
	// Where the renewal's time went: per command, the time the work ran and each wait.
	e.nodeops("describe", name)
	e.timeBreakdown("renewal", name, begin, end)
	took := end.Sub(begin)
	if manual > 0 {
		figure("renewal: manual %s, nodeops %s, ratio %.2f", manual.Round(100*time.Millisecond), took.Round(100*time.Millisecond), took.Seconds()/manual.Seconds())
	} else {
		figure("renewal: manual failed (no baseline), nodeops %s", took.Round(100*time.Millisecond))
	}
	fileAfterRenew := certNotBefore(t, framework.ParseCertificate(t, apiCertFile, []byte(framework.ReadFile(t, apiCertFile))))
	if !fileAfterRenew.After(fileBefore) {
		t.Fatalf("%s notBefore did not move: %s before, %s after renewCertificates", apiCertFile, fileBefore, fileAfterRenew)
	}
	t.Logf("certificates renewed: %s notBefore %s -> %s", apiCertFile, fileBefore, fileAfterRenew)
}

func TestRealNode2RuntimeProfile(t *testing.T) {
	setup(t).runtimeProfile()
}

// TestRealNode2bReconfigure: a reconfigure (issue 28) sets an API server flag and the kubelet's
// maxPods; the upgrade after it must keep both.
func TestRealNode2bReconfigure(t *testing.T) {
	setup(t).reconfigure()
}

func TestRealNode3UpgradeThroughClusterTarget(t *testing.T) {
	e := setup(t)
	if v := e.kubeletVersion(); v != fromVersion {
		t.Fatalf("the node's kubelet is %s, want %s before the upgrade", v, fromVersion)
	}
	step(t, "a workload created before the upgrade")
	workload := e.createWorkload()
	servedBefore := certNotBefore(t, e.servedCert())
	managerBefore := e.managerPodUID()
	// kubeadm upgrade's preflight fails on this machine's cgroup v1 unless SystemVerification is
	// skipped explicitly (kubeadm says so; the kubelet runs with failCgroupV1: false), and on the
	// CoreDNS checks, since the cluster runs without CoreDNS.
	source := e.serveBinaries()
	// The binaries are served over plain http on the node's address: allowed only when asked for.
	e.nodeops("plan", "upgrade", toVersion, "--binary-source", source, "--insecure-http")
	op := e.upgradeThroughClusterTarget(source, "SystemVerification,CoreDNSUnsupportedPlugins,CoreDNSMigration")

	step(t, "verify the upgraded node")
	e.verifyVersion()
	e.verifyStaticPods(op)
	e.verifyKubelet()
	// What the reconfigure before it changed lives in kubeadm-config and kubelet-config, which
	// kubeadm upgrade keeps.
	e.verifyReconfigured("after the upgrade")
	e.upgradePlanPasses()
	servedAfter := certNotBefore(t, e.servedCert())
	if !servedAfter.After(servedBefore) {
		t.Errorf("the API server's served certificate notBefore did not move: %s before, %s after", servedBefore, servedAfter)
	} else {
		t.Logf("served API server certificate notBefore %s -> %s", servedBefore, servedAfter)
	}
	e.verifyWorkload(workload)
	e.verifyManager(managerBefore, op)
}

// TestRealNode4PodCommand: a NodeOperation's `pod` command runs the locally built installer image
// (hack/realnode/cmd/installer-test, imported into containerd, never pulled) on the node with the
// host's / at /host: it succeeds, its log tail and exit code 0 are in the task, the file it wrote is
// on the host and its pod is gone. The same image told to exit 3 blocks its operation, saying so.
func TestRealNode4PodCommand(t *testing.T) {
	e := setup(t)
	run := fmt.Sprintf("realnode-%d", time.Now().Unix())
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(installerMarker)) })
	op := e.podOperation("installer-test", []string{"--marker=/host" + installerMarker}, run)
	if out, code, err := e.nodeopsCode("watch", op, "--timeout", "5m"); err != nil || code != 0 {
		t.Fatalf("kubectl nodeops watch %s: exit %d %v, want 0 (Succeeded):\n%s", op, code, err, out)
	}
	e.operationSucceeded(op)
	c := e.onlyCommandStatus(op)
	for _, want := range []string{`installer-test: run "` + run + `" starting in pod`, "installer-test: wrote /host" + installerMarker, "installer-test: done"} {
		if !strings.Contains(c.OutputTail, want) {
			t.Errorf("task of %s: outputTail lacks %q:\n%s", op, want, c.OutputTail)
		}
	}
	if c.ExitCode == nil || *c.ExitCode != 0 {
		t.Errorf("task of %s: exitCode %v, want 0", op, c.ExitCode)
	}
	if logs := e.nodeops("logs", op); !strings.Contains(logs, "installer-test: done") {
		t.Errorf("kubectl nodeops logs %s does not show the pod's log", op)
	}
	if got := framework.ReadFile(t, installerMarker); got != "installed by installer-test run "+run+"\n" {
		t.Errorf("%s on the host holds %q, want the run %s", installerMarker, got, run)
	}
	e.noPodsLeft("nodeops-installer")
	t.Logf("pod command of %s: exit code 0, %s written on the host, pod deleted; output tail:\n%s", op, installerMarker, c.OutputTail)

	step(t, "a pod command that exits 3")
	failing := e.podOperation("installer-fails", []string{"--exit=3"}, run)
	if out, code, err := e.nodeopsCode("watch", failing, "--timeout", "5m"); err != nil || code != 3 {
		t.Fatalf("kubectl nodeops watch %s: exit %d %v, want 3 (Blocked):\n%s", failing, code, err, out)
	}
	var blocked nodeopsv1.NodeOperation
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: failing}, &blocked); err != nil {
		t.Fatal(err)
	}
	cond := meta.FindStatusCondition(blocked.Status.Conditions, nodeopsv1.ConditionBlocked)
	if blocked.Status.Phase != nodeopsv1.OperationBlocked || cond == nil || !strings.Contains(cond.Message, "exited with code 3") {
		t.Errorf("operation %s: phase %s, Blocked condition %+v; want Blocked saying the pod exited with code 3", failing, blocked.Status.Phase, cond)
	}
	fc := e.onlyCommandStatus(failing)
	if fc.Phase != nodeopsv1.CommandFailed || fc.ExitCode == nil || *fc.ExitCode != 3 || !strings.Contains(fc.OutputTail, "failing with exit code 3") {
		t.Errorf("task of %s: command %s, exit code %v, output tail:\n%s", failing, fc.Phase, fc.ExitCode, fc.OutputTail)
	}
	e.noPodsLeft("nodeops-installer")
	t.Logf("operation %s is Blocked: %s", failing, cond.Message)
	e.nodeops("abort", failing)
	for _, name := range []string{op, failing} {
		if err := e.c.Delete(e.ctx, &nodeopsv1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			t.Error(err)
		}
	}
}

// TestRealNode5ScriptSecretFromTheKubelet: a script takes its env from a Secret in nodeops-system
// (valueFrom one key, envFrom all of them) that no nodeops ServiceAccount may read: the manager creates
// the task's secret holder pod on the node, the real kubelet mounts the Secret for it (the Node
// authorizer lets it, for a pod bound to its node), and the agent reads the values from that mount
// through its /host. The script prints the value, redacted in the task, and its sha256, which matches;
// the holder pod is gone once the operation Succeeded; and the agent's ServiceAccount may not get the Secret.
func TestRealNode5ScriptSecretFromTheKubelet(t *testing.T) {
	e := setup(t)
	const name = "nodeops-script-realnode"
	value := fmt.Sprintf("realnode-secret-%d", time.Now().UnixNano())
	sum := sha256.Sum256([]byte(value))
	want := hex.EncodeToString(sum[:])
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: managerNS},
		StringData: map[string]string{"token": value, "REALNODE_GREETING": "hello from the kubelet"}}
	if err := e.c.Create(e.ctx, sec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.Background(), sec) })

	for _, sa := range []string{"nodeops-agent", "nodeops-manager"} {
		can, err := e.kubectlOnce("auth", "can-i", "get", "secrets/"+name, "-n", managerNS, "--as=system:serviceaccount:"+managerNS+":"+sa)
		if can != "no" {
			t.Errorf("kubectl auth can-i get secrets/%s -n %s --as=system:serviceaccount:%s:%s: %q (%v), want no", name, managerNS, managerNS, sa, can, err)
		}
	}

	op := &nodeopsv1.NodeOperation{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "script-secret-"},
		Spec: nodeopsv1.NodeOperationSpec{Custom: &nodeopsv1.CustomOperation{Groups: []nodeopsv1.Group{{
			Name: "secret",
			Commands: []nodeopsv1.Command{{Name: "use-secret", Timeout: &metav1.Duration{Duration: 3 * time.Minute}, Script: &nodeopsv1.ScriptCommand{
				Inline: `echo "token=$TOKEN"; echo "greeting=$REALNODE_GREETING"
printf %s "$TOKEN" | sha256sum | cut -d' ' -f1 | sed 's/^/sha256=/'`,
				Env:     []nodeopsv1.EnvVar{{Name: "TOKEN", ValueFrom: &nodeopsv1.EnvVarSource{SecretKeyRef: nodeopsv1.SecretKeySelector{Name: name, Key: "token"}}}},
				EnvFrom: []nodeopsv1.EnvFromSource{{SecretRef: nodeopsv1.SecretEnvSource{Name: name}}},
			}}},
		}}}},
	}
	if err := e.c.Create(e.ctx, op); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.Background(), op) })
	if out, code, err := e.nodeopsCode("watch", op.Name, "--timeout", "5m"); err != nil || code != 0 {
		t.Fatalf("kubectl nodeops watch %s: exit %d %v, want 0 (Succeeded):\n%s", op.Name, code, err, out)
	}
	e.operationSucceeded(op.Name)
	c := e.onlyCommandStatus(op.Name)
	for _, w := range []string{"token=[redacted]", "greeting=[redacted]", "sha256=" + want, "from pod " + managerNS + "/"} {
		if !strings.Contains(c.OutputTail, w) {
			t.Errorf("task of %s: outputTail lacks %q:\n%s", op.Name, w, c.OutputTail)
		}
	}
	if strings.Contains(c.OutputTail, value) {
		t.Errorf("task of %s: outputTail shows the Secret's value:\n%s", op.Name, c.OutputTail)
	}
	e.noPodsLeft("nodeops-secret-holder")
	t.Logf("script of %s read Secret %s/%s through the kubelet's mount (sha256 %s matches); holder pod gone; output tail:\n%s", op.Name, managerNS, name, want, c.OutputTail)
}

// installerMarker is the host file the installer test image writes (under the node's state
// directory, which realnode down removes).
const installerMarker = "/var/lib/nodeops-realnode/installer-test/installed"

// podOperation creates a NodeOperation whose one group runs a pod command with the installer test
// image on the node, the host's / mounted, and returns its name.
func (e *env) podOperation(name string, args []string, run string) string {
	e.t.Helper()
	op := &nodeopsv1.NodeOperation{
		ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-"},
		Spec: nodeopsv1.NodeOperationSpec{Custom: &nodeopsv1.CustomOperation{Groups: []nodeopsv1.Group{{
			Name: "installer",
			Commands: []nodeopsv1.Command{{Name: "install", Pod: &nodeopsv1.PodCommand{
				Image:           installerImage,
				ImagePullPolicy: corev1.PullNever,
				Args:            args,
				Env:             []nodeopsv1.PodEnvVar{{Name: "INSTALLER_TEST_RUN", Value: run}},
				MountHostRoot:   true,
				Timeout:         &metav1.Duration{Duration: 3 * time.Minute},
			}}},
		}}}},
	}
	if err := e.c.Create(e.ctx, op); err != nil {
		e.t.Fatal(err)
	}
	e.t.Logf("created NodeOperation %s: pod command, image %s, args %q", op.Name, installerImage, args)
	return op.Name
}

// onlyCommandStatus is the status of the one command of the operation's one task.
func (e *env) onlyCommandStatus(op string) nodeopsv1.CommandStatus {
	e.t.Helper()
	var tasks nodeopsv1.NodeTaskList
	if err := e.c.List(e.ctx, &tasks, client.MatchingLabels{nodeopsv1.LabelOperation: op}); err != nil {
		e.t.Fatal(err)
	}
	if len(tasks.Items) != 1 || len(tasks.Items[0].Status.Commands) != 1 {
		e.t.Fatalf("operation %s: want one task with one command status, got %d tasks: %+v", op, len(tasks.Items), tasks.Items)
	}
	return tasks.Items[0].Status.Commands[0]
}

// noPodsLeft waits until no pod labelled app.kubernetes.io/name=name (a pod command's
// nodeops-installer, a task's nodeops-secret-holder) is left in the agent's namespace.
func (e *env) noPodsLeft(name string) {
	e.t.Helper()
	testutil.EventuallyEvery(e.t, time.Minute, realnodePoll, "no "+name+" pod", func(context.Context) error {
		var pods corev1.PodList
		if err := e.c.List(e.ctx, &pods, client.InNamespace(managerNS), client.MatchingLabels{"app.kubernetes.io/name": name}); err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("pod %s is left (%s)", pods.Items[0].Name, pods.Items[0].Status.Phase)
		}
		return nil
	})
}

func (e *env) kubeletVersion() string {
	e.t.Helper()
	var n corev1.Node
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: e.node}, &n); err != nil {
		e.t.Fatal(err)
	}
	return n.Status.NodeInfo.KubeletVersion
}

// controlPlaneServesAtOnce checks, once and with no retry (issue 18, point 10; docs/design.md,
// succeeded means served, rule 13), that the cluster admin is authorized and the API server is ready: what an
// operation's Succeeded promises.
func (e *env) controlPlaneServesAtOnce(after string) {
	e.t.Helper()
	can, err := e.kubectlOnce("auth", "can-i", "list", "nodes")
	if err != nil || can != "yes" {
		e.t.Errorf("right after %s: the cluster admin's kubectl auth can-i list nodes said %q (%v), want yes", after, can, err)
	}
	ready, err := e.kubectlOnce("get", "--raw", "/readyz")
	if err != nil || ready != "ok" {
		e.t.Errorf("right after %s: GET /readyz answered %q (%v), want ok", after, ready, err)
	}
	if !e.t.Failed() {
		e.t.Logf("right after %s, checked once: kubectl auth can-i list nodes: %s; /readyz: %s", after, can, ready)
	}
}

// kubectlOnce runs kubectl once as the cluster admin and returns its trimmed standard output.
func (e *env) kubectlOnce(args ...string) (string, error) {
	cmd := exec.CommandContext(e.ctx, filepath.Join(e.bin, "kubectl"), append([]string{"--request-timeout=10s"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return strings.TrimSpace(string(out)), fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// upgradeThroughClusterTarget sets the ClusterTarget's version as a person would and waits with
// kubectl for UpToDate; it returns the NodeOperation the manager generated, Succeeded, and prints
// the upgrade's wall time (target set to the watch exiting Succeeded) beside the time kubeadm's own
// commands took, and per command where the rest went (issue 30).
func (e *env) upgradeThroughClusterTarget(source, ignore string) *nodeopsv1.NodeOperation {
	e.t.Helper()
	e.nodeops("target")
	begin := time.Now()
	e.nodeops("target", "set", "--version", toVersion, "--binary-source", source, "--insecure-http", "--ignore-preflight-errors", ignore)
	// The person watches the upgrade the target generated, as `kubectl nodeops upgrade --watch`
	// would show it: the moment the watch exits Succeeded, before any other request, the upgraded
	// API server serves the cluster admin.
	generated := ""
	testutil.EventuallyEvery(e.t, 2*time.Minute, realnodePoll, "the ClusterTarget's generated upgrade", func(context.Context) error {
		ct := &nodeopsv1.ClusterTarget{}
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: nodeopsv1.ClusterTargetName}, ct); err != nil {
			return err
		}
		if upgrades := generatedUpgrades(ct); len(upgrades) > 0 {
			generated = upgrades[0]
			return nil
		}
		return fmt.Errorf("status.operations %+v has no upgrade yet", ct.Status.Operations)
	})
	if _, code, err := e.nodeopsCode("watch", generated); err != nil || code != 0 {
		e.t.Fatalf("kubectl nodeops watch %s: exit %d %v, want 0 (Succeeded)", generated, code, err)
	}
	succeeded := time.Now()
	e.controlPlaneServesAtOnce("kubectl nodeops watch " + generated + " exited Succeeded")
	cmd := exec.CommandContext(e.ctx, filepath.Join(e.bin, "kubectl"), "wait", "clustertarget/cluster",
		"--for=condition=UpToDate", "--timeout=20m")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	err := cmd.Run()
	wall := time.Since(begin)
	if err != nil {
		e.t.Fatalf("kubectl wait clustertarget/cluster --for=condition=UpToDate: %v after %s", err, wall.Round(time.Second))
	}
	e.nodeops("target")

	ct := &nodeopsv1.ClusterTarget{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: nodeopsv1.ClusterTargetName}, ct); err != nil {
		e.t.Fatal(err)
	}
	upgrades := generatedUpgrades(ct)
	if len(upgrades) != 1 {
		e.t.Fatalf("the ClusterTarget generated upgrades %v, want exactly one", upgrades)
	}
	op := e.operationSucceeded(upgrades[0])
	e.nodeops("describe", op.Name) // per command, the time the work ran and each wait
	upgradeWall := succeeded.Sub(begin)
	parts := e.timeBreakdown("upgrade", op.Name, begin, succeeded)
	beyond := upgradeWall - parts.kubeadm
	figure("upgrade: wall %s, kubeadm's own commands %s, nodeops beyond kubeadm %s (%.1f%%)",
		upgradeWall.Round(100*time.Millisecond), parts.kubeadm.Round(100*time.Millisecond), beyond.Round(100*time.Millisecond), 100*beyond.Seconds()/upgradeWall.Seconds())
	rest := beyond - parts.restartToHealthy
	figure("upgrade: of the %s beyond kubeadm, %s from restartService's start until waitNodeReady found the control plane healthy again (the restarted kubelet starting every static pod anew), %s (%.1f%% of the wall) the rest",
		beyond.Round(100*time.Millisecond), parts.restartToHealthy.Round(100*time.Millisecond), rest.Round(100*time.Millisecond), 100*rest.Seconds()/upgradeWall.Seconds())
	e.afterTheLastCommand("upgrade", op.Name, parts.lastEnd, succeeded)
	e.t.Logf("upgrade %s: %s from target set to kubectl wait returning UpToDate", op.Name, wall.Round(time.Second))
	return op
}

// afterTheLastCommand splits the time from op's last command's end to the watch seeing Succeeded
// at seen: until the manager recorded Succeeded (the time of its Succeeded event, which it emits
// once the status write is done), and the rest (the watch seeing the write and exiting).
func (e *env) afterTheLastCommand(what, op string, lastEnd, seen time.Time) {
	e.t.Helper()
	var list eventsv1.EventList
	if err := e.c.List(e.ctx, &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
		e.t.Logf("%s: events not read: %v", what, err)
		return
	}
	for _, ev := range list.Items {
		if ev.Regarding.Kind != "NodeOperation" || ev.Regarding.Name != op || ev.Reason != "Succeeded" {
			continue
		}
		at := ev.EventTime.Time
		figure("%s: after the last command, %s until the manager recorded Succeeded (its event at %s), %s until the watch saw it and exited",
			what, at.Sub(lastEnd).Round(10*time.Millisecond), at.Format("15:04:05.000"), seen.Sub(at).Round(10*time.Millisecond))
		return
	}
	e.t.Logf("%s: no Succeeded event of NodeOperation %s found", what, op)
}

// generatedUpgrades names the upgrades the ClusterTarget generated, as its status lists them.
func generatedUpgrades(ct *nodeopsv1.ClusterTarget) []string {
	var upgrades []string
	for _, g := range ct.Status.Operations {
		if g.Kind == nodeopsv1.GeneratedUpgrade {
			upgrades = append(upgrades, g.Name)
		}
	}
	return upgrades
}

func step(t *testing.T, what string) {
	t.Helper()
	t.Logf("=== %s: %s", time.Now().Format(time.TimeOnly), what)
}

func setup(t *testing.T) *env {
	t.Helper()
	logf.SetLogger(testutil.Logger())
	bin := os.Getenv("NODEOPS_BIN")
	if bin == "" {
		t.Fatal("NODEOPS_BIN must name the checkout's bin/ (make e2e-realnode sets it)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("no real node (run make realnode first): %v", err)
	}
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := nodeopsv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx, c: c, disco: disco, bin: bin}
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil || len(nodes.Items) != 1 {
		t.Fatalf("want exactly one node: %d, %v", len(nodes.Items), err)
	}
	e.node = nodes.Items[0].Name
	for _, a := range nodes.Items[0].Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			e.nodeIP = a.Address
		}
	}
	start := time.Now()
	step(t, "scenario "+t.Name())
	t.Cleanup(func() {
		if t.Failed() {
			e.diagnose()
		}
		t.Logf("scenario %s took %s", t.Name(), time.Since(start).Round(time.Second))
	})
	return e
}

// nodeops runs `kubectl nodeops ARGS...` as a user would, printing its output, and returns it.
func (e *env) nodeops(args ...string) string {
	e.t.Helper()
	out, code, err := e.nodeopsCode(args...)
	if err != nil || code != 0 {
		e.t.Fatalf("kubectl nodeops %s failed: exit %d %v", strings.Join(args, " "), code, err)
	}
	return out
}

func (e *env) nodeopsCode(args ...string) (string, int, error) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 25*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"nodeops"}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+e.bin+":"+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig)
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(os.Stdout, &out)
	cmd.Stderr = io.MultiWriter(os.Stdout, &out)
	start := time.Now()
	err := cmd.Run()
	e.t.Logf("kubectl nodeops %s: %v after %s", strings.Join(args, " "), errText(err), time.Since(start).Round(time.Second))
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), ee.ExitCode(), nil
	}
	return out.String(), 0, err
}

// runOperation starts an operation with `kubectl nodeops ARGS... --watch` and follows it to its
// end. The API server restarts during these operations (the node is its only control plane): the
// watch rides that out by itself, as a person's would. Any exit but 0 fails the test.
func (e *env) runOperation(args ...string) string {
	e.t.Helper()
	out, code, err := e.nodeopsCode(append(args, "--watch")...)
	if err != nil {
		e.t.Fatal(err)
	}
	m := regexp.MustCompile(`nodeoperation[^/]*/([a-z0-9.-]+) created`).FindStringSubmatch(out)
	if m == nil {
		e.t.Fatalf("kubectl nodeops %s did not say what it created", strings.Join(args, " "))
	}
	if code != 0 {
		e.t.Fatalf("operation %s did not succeed: kubectl nodeops watch exit code %d", m[1], code)
	}
	return m[1]
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// operationSucceeded requires the operation Succeeded, as the API reports it.
func (e *env) operationSucceeded(name string) *nodeopsv1.NodeOperation {
	e.t.Helper()
	op := &nodeopsv1.NodeOperation{}
	testutil.EventuallyEvery(e.t, time.Minute, realnodePoll, "reading operation "+name, func(context.Context) error {
		return e.c.Get(e.ctx, client.ObjectKey{Name: name}, op)
	})
	if op.Status.Phase != nodeopsv1.OperationSucceeded {
		e.t.Fatalf("operation %s is %s, want Succeeded", op.Name, op.Status.Phase)
	}
	return op
}

// pauseDeployment is a one-replica Deployment of the pause image, already on the node, in workloadNS,
// its pods labelled app=name: the workload a scenario checks runs through what nodeops does.
func pauseDeployment(name string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: workloadNS},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](2),
					Containers:                    []corev1.Container{{Name: "app", Image: pauseImage, ImagePullPolicy: corev1.PullNever}},
				},
			},
		},
	}
}

func (e *env) createWorkload() *appsv1.Deployment {
	e.t.Helper()
	d := pauseDeployment("realnode-workload")
	if err := e.c.Create(e.ctx, d); err != nil {
		e.t.Fatal(err)
	}
	pod := e.waitRunningPod(workloadNS, d.Spec.Selector.MatchLabels, 3*time.Minute)
	e.t.Logf("workload pod %s runs (uid %s)", pod.Name, pod.UID)
	return d
}

// waitRunningPod waits for a Running, Ready pod with the labels.
func (e *env) waitRunningPod(ns string, labels map[string]string, timeout time.Duration) *corev1.Pod {
	e.t.Helper()
	var found *corev1.Pod
	testutil.EventuallyEvery(e.t, timeout, realnodePoll, fmt.Sprintf("a running pod %v in %s", labels, ns), func(context.Context) error {
		var pods corev1.PodList
		if err := e.c.List(e.ctx, &pods, client.InNamespace(ns), client.MatchingLabels(labels)); err != nil {
			return err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && podReady(p) {
				found = p
				return nil
			}
		}
		return fmt.Errorf("%d pods, none running and ready", len(pods.Items))
	})
	return found
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (e *env) managerPodUID() string {
	e.t.Helper()
	var pods corev1.PodList
	if err := e.c.List(e.ctx, &pods, client.InNamespace(managerNS)); err != nil {
		e.t.Fatal(err)
	}
	for _, p := range pods.Items {
		if isManagerPod(&p) {
			return string(p.UID)
		}
	}
	e.t.Fatal("no manager pod before the upgrade")
	return ""
}

func isManagerPod(p *corev1.Pod) bool {
	for _, r := range p.OwnerReferences {
		if r.Kind == "ReplicaSet" {
			return true
		}
	}
	return false
}

// serveBinaries serves the v1.37.2 kubeadm, kubelet and kubectl the way BinarySource names them
// ({baseURL}/{version}/bin/linux/amd64/{name} and {name}.sha256) on the node's address, where the
// agent's pod reaches it. It stops with the test.
func (e *env) serveBinaries() string {
	e.t.Helper()
	root := e.t.TempDir()
	dir := filepath.Join(root, toVersion, "bin", "linux", "amd64")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	for _, n := range []string{"kubeadm", "kubelet", "kubectl"} {
		src := filepath.Join(e.bin, n)
		versionArgs := map[string][]string{"kubeadm": {"version", "-o", "short"}, "kubelet": {"--version"}, "kubectl": {"version", "--client"}}[n]
		out, err := exec.Command(src, versionArgs...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), toVersion) {
			e.t.Fatalf("%s is not %s: %s %v", src, toVersion, out, err)
		}
		if err := os.Symlink(src, filepath.Join(dir, n)); err != nil {
			e.t.Fatal(err)
		}
		sum := framework.FileSHA256(e.t, src)
		if err := os.WriteFile(filepath.Join(dir, n+".sha256"), []byte(sum+"\n"), 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
	url := e.serveDir(root, "binary")
	e.t.Logf("serving %s binaries at %s", toVersion, url)
	return url
}

func logRequests(t *testing.T, what string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Logf("%s server: GET %s from %s", what, r.URL.Path, r.RemoteAddr)
		h.ServeHTTP(w, r)
	})
}

func (e *env) verifyVersion() {
	e.t.Helper()
	testutil.EventuallyEvery(e.t, 2*time.Minute, realnodePoll, "the API server at "+toVersion, func(context.Context) error {
		v, err := e.disco.ServerVersion()
		if err != nil {
			return err
		}
		if v.GitVersion != toVersion {
			return fmt.Errorf("/version says %s", v.GitVersion)
		}
		return nil
	})
	e.t.Logf("API server /version: %s", toVersion)
}

// verifyStaticPods checks that each control-plane static pod runs the image kubeadm v1.37.2 lists
// and that the kubelet started the pod the test finds before the node's upgrade task succeeded: the
// new kubelet starts every static pod again (new pod UIDs), and a task that succeeded on the old
// kubelet's last statuses, before that restart, would break "succeeded means served" (rule 13).
func (e *env) verifyStaticPods(op *nodeopsv1.NodeOperation) {
	e.t.Helper()
	out, err := exec.Command(filepath.Join(e.bin, "kubeadm"), "config", "images", "list", "--kubernetes-version", toVersion).Output()
	if err != nil {
		e.t.Fatalf("kubeadm config images list: %v", err)
	}
	want := map[string]string{}
	for _, ref := range strings.Fields(string(out)) {
		repo := ref[:strings.LastIndex(ref, ":")]
		want[repo[strings.LastIndex(repo, "/")+1:]] = ref
	}
	var tasks nodeopsv1.NodeTaskList
	if err := e.c.List(e.ctx, &tasks, client.MatchingLabels{nodeopsv1.LabelOperation: op.Name}); err != nil {
		e.t.Fatal(err)
	}
	var done time.Time // when this node's task of the upgrade succeeded
	for _, task := range tasks.Items {
		if task.Spec.NodeName == e.node && task.Status.CompletionTime != nil && task.Status.CompletionTime.After(done) {
			done = task.Status.CompletionTime.Time
		}
	}
	if done.IsZero() {
		e.t.Fatalf("no completed task of %s on node %s", op.Name, e.node)
	}
	e.kubeletRestartStoppedReplacedPods(tasks.Items)
	for _, comp := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		image := want[comp]
		name := comp + "-" + e.node
		var started time.Time
		var restarts int32
		var running time.Time // when its container last started
		testutil.EventuallyEvery(e.t, 3*time.Minute, realnodePoll, name+" running "+image, func(context.Context) error {
			var p corev1.Pod
			if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: "kube-system", Name: name}, &p); err != nil {
				return err
			}
			if got := p.Spec.Containers[0].Image; got != image {
				return fmt.Errorf("spec image %s", got)
			}
			if len(p.Status.ContainerStatuses) == 0 {
				return fmt.Errorf("no container status")
			}
			cs := p.Status.ContainerStatuses[0]
			if cs.Image != image || !cs.Ready || cs.State.Running == nil {
				return fmt.Errorf("container status image %s ready %v running %v", cs.Image, cs.Ready, cs.State.Running != nil)
			}
			if p.Status.StartTime == nil {
				return fmt.Errorf("no start time")
			}
			// The pod's start (the kubelet's first sync of this pod UID), not its container's: an
			// in-place container restart (a controller-manager that lost its leader Lease) is
			// no new run of the static pod.
			started = p.Status.StartTime.Time
			restarts, running = cs.RestartCount, cs.State.Running.StartedAt.Time
			return nil
		})
		// Both times are whole seconds: a run started in the second the task completed counts.
		if started.After(done) {
			e.t.Errorf("rule 13, succeeded means served: the kubelet started %s at %s, after the node's upgrade task of %s succeeded at %s: the task succeeded before the kubelet's last restart of it", name, started.Format(time.RFC3339), op.Name, done.Format(time.RFC3339))
		}
		e.t.Logf("%s runs %s, started %s, its container started %s and restarted %d times (the node's task succeeded %s)", name, image, started.Format(time.RFC3339), running.Format(time.RFC3339), restarts, done.Format(time.RFC3339))
	}
}

// kubeletRestartStoppedReplacedPods checks that the upgrade's kubelet restart on this node, onto a
// new minor version that names every static pod anew, stopped the four static pods' old runs right
// after the restart (issue 30: a new etcd or API server that starts beside the old one fails on its
// ports and waits out a 10 s back-off), as the restartService command's message says.
func (e *env) kubeletRestartStoppedReplacedPods(tasks []nodeopsv1.NodeTask) {
	e.t.Helper()
	for _, task := range tasks {
		if task.Spec.NodeName != e.node {
			continue
		}
		for i, c := range task.Spec.Commands {
			if c.RestartService == nil || c.RestartService.Name != "kubelet" || i >= len(task.Status.Commands) {
				continue
			}
			msg := task.Status.Commands[i].Message
			e.t.Logf("the upgrade's kubelet restart: %s; its output:\n%s", msg, task.Status.Commands[i].OutputTail)
			if i+1 < len(task.Status.Commands) {
				// What the wait after it waited for, as it said while waiting (issue 30's evidence).
				e.t.Logf("what %s said while it waited:\n%s", task.Status.Commands[i+1].Name, task.Status.Commands[i+1].OutputTail)
			}
			if !strings.Contains(msg, "the kubelet went from "+fromVersion+" to "+toVersion+", a new minor version") ||
				!strings.Contains(msg, "stopped the old runs of etcd, kube-apiserver, kube-controller-manager, kube-scheduler at once") {
				e.t.Errorf("the kubelet restart of task %s says %q; want the four static pods' old runs stopped, the kubelet being of a new minor version", task.Name, msg)
			}
			return
		}
	}
	e.t.Errorf("no restartService of the kubelet on node %s in the upgrade's tasks", e.node)
}

func (e *env) verifyKubelet() {
	e.t.Helper()
	testutil.EventuallyEvery(e.t, 3*time.Minute, realnodePoll, "the kubelet at "+toVersion+" and the node Ready", func(context.Context) error {
		var n corev1.Node
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: e.node}, &n); err != nil {
			return err
		}
		if v := n.Status.NodeInfo.KubeletVersion; v != toVersion {
			return fmt.Errorf("kubelet reports %s", v)
		}
		if n.Spec.Unschedulable {
			return fmt.Errorf("node still cordoned")
		}
		if !plan.NodeReady(&n) {
			return fmt.Errorf("node not Ready")
		}
		return nil
	})
	out, err := exec.Command("/usr/bin/kubelet", "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), toVersion) {
		e.t.Errorf("the host's /usr/bin/kubelet is not %s: %s %v", toVersion, out, err)
	}
	e.t.Logf("node %s Ready, schedulable, kubelet %s (host binary replaced)", e.node, toVersion)
}

func (e *env) verifyWorkload(d *appsv1.Deployment) {
	e.t.Helper()
	pod := e.waitRunningPod(d.Namespace, d.Spec.Selector.MatchLabels, 3*time.Minute)
	e.t.Logf("workload runs again: pod %s (uid %s)", pod.Name, pod.UID)
}

func (e *env) verifyManager(before string, op *nodeopsv1.NodeOperation) {
	e.t.Helper()
	var pods corev1.PodList
	if err := e.c.List(e.ctx, &pods, client.InNamespace(managerNS)); err != nil {
		e.t.Fatal(err)
	}
	for _, p := range pods.Items {
		if !isManagerPod(&p) || p.DeletionTimestamp != nil {
			continue
		}
		if p.Status.Phase != corev1.PodRunning || !podReady(&p) {
			e.t.Errorf("manager pod %s is %s, not running and ready", p.Name, p.Status.Phase)
		}
		if string(p.UID) != before {
			e.t.Logf("the manager was replaced during the upgrade (drained) and came back as %s, which finished %s", p.Name, op.Name)
		} else {
			e.t.Logf("the manager pod %s ran through the upgrade and finished %s", p.Name, op.Name)
		}
		return
	}
	e.t.Error("no manager pod after the upgrade")
}

// servedCert is the certificate the API server presents now.
func (e *env) servedCert() *x509.Certificate {
	e.t.Helper()
	var cert *x509.Certificate
	testutil.EventuallyEvery(e.t, 2*time.Minute, realnodePoll, "the API server's certificate", func(context.Context) error {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", net.JoinHostPort(e.nodeIP, "6443"),
			&tls.Config{InsecureSkipVerify: true}) // only the certificate's dates are read
		if err != nil {
			return err
		}
		defer conn.Close()
		cert = conn.ConnectionState().PeerCertificates[0]
		return nil
	})
	return cert
}

func certNotBefore(_ *testing.T, c *x509.Certificate) time.Time { return c.NotBefore }

// diagnose prints what a person would look at after a failure.
func (e *env) diagnose() {
	run := func(name string, args ...string) {
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), "PATH="+e.bin+":"+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig)
		out, err := cmd.CombinedOutput()
		fmt.Printf("--- %s %s (%v)\n%s\n", name, strings.Join(args, " "), errText(err), out)
	}
	run("kubectl", "nodeops", "get")
	var ops nodeopsv1.NodeOperationList
	if err := e.c.List(context.Background(), &ops); err == nil {
		for _, op := range ops.Items {
			run("kubectl", "nodeops", "describe", op.Name)
		}
	}
	run("kubectl", "get", "nodes,pods", "-A", "-o", "wide")
	run("kubectl", "get", "nodetasks", "-o", "yaml")
	run("kubectl", "-n", managerNS, "logs", "-l", "app.kubernetes.io/name=nodeops-manager", "--tail=80", "--all-containers")
	run("kubectl", "-n", managerNS, "logs", "-l", "app.kubernetes.io/name=nodeops-agent", "--tail=80", "--all-containers")
	run("kubectl", "get", "events", "-A", "--sort-by=.lastTimestamp")
	for _, f := range []string{"supervisor.log", "kubelet.log"} {
		run("tail", "-n", "60", filepath.Join(logDir, f))
	}
}

// The runtime handler the NodeProfile scenario installs: containerd's own runc shim under a new
// name, so its runtime type is io.containerd.nodeopstest.v2 (issue 15's real-node proof).
const (
	profileName      = "nodeopstest"
	profileTrigger   = "nodeops.io/test-runtime"
	runtimeHandler   = "nodeopstest"
	runtimeType      = "io.containerd.nodeopstest.v2"
	shimHostPath     = "/usr/local/bin/containerd-shim-nodeopstest-v2"
	runcShim         = "/var/lib/nodeops-realnode/bin/containerd-shim-runc-v2" // the node's containerd install
	ctrBinary        = "/var/lib/nodeops-realnode/bin/ctr"
	containerdSocket = "/run/nodeops-realnode/containerd/containerd.sock"
	// containerdConfig is plain containerd's default path, where the node's containerd reads its
	// (version 3) config: the profile's containerdRuntime finds it without configPath.
	containerdConfig = "/etc/containerd/config.toml"
)

// runtimeProfile: annotating the node makes a NodeProfile install a runtime handler from an
// artifact served over local HTTP with its sha256, register it in containerd's real config,
// restart containerd through the host's init system (the node's systemctl stand-in), label the
// node and create the RuntimeClass; a Pod with it runs to completion under the new runtime, as
// containerd's own ctr shows. Removing the annotation uninstalls it, and a new Pod stays Pending.
func (e *env) runtimeProfile() {
	e.t.Helper()
	url, sum := e.serveFile(runcShim, "containerd-shim-nodeopstest-v2")
	if cfg := framework.ReadFile(e.t, containerdConfig); !strings.HasPrefix(cfg, "version = 3") || strings.Contains(cfg, runtimeType) {
		e.t.Fatalf("%s before the profile: want a version 3 config without %s:\n%s", containerdConfig, runtimeType, cfg)
	}
	containerdBefore := e.containerdPID()
	profile := &nodeopsv1.NodeProfile{
		ObjectMeta: metav1.ObjectMeta{Name: profileName},
		Spec: nodeopsv1.NodeProfileSpec{
			Trigger: &nodeopsv1.ProfileTrigger{Annotation: profileTrigger + "=true"},
			Install: []nodeopsv1.Command{
				// Served over plain http on the node's address: allowed only when asked for.
				{Name: "shim", InstallFile: &nodeopsv1.InstallFileCommand{URL: url, InsecureHTTP: true, SHA256: sum, Path: shimHostPath, Mode: "0755"}},
				// No configPath: containerd's default config is found.
				{Name: "handler", ContainerdRuntime: &nodeopsv1.ContainerdRuntimeCommand{Name: runtimeHandler, RuntimeType: runtimeType, BinaryPath: shimHostPath}},
			},
			Uninstall: []nodeopsv1.Command{
				{Name: "handler", ContainerdRuntime: &nodeopsv1.ContainerdRuntimeCommand{Name: runtimeHandler, Remove: true}},
				{Name: "shim", InstallFile: &nodeopsv1.InstallFileCommand{URL: url, SHA256: sum, Path: shimHostPath, Remove: true}},
			},
			RuntimeClasses: []nodeopsv1.RuntimeClassSpec{{Name: runtimeHandler, Handler: runtimeHandler}},
		},
	}
	if err := e.c.Create(e.ctx, profile); err != nil {
		e.t.Fatal(err)
	}
	e.annotateNode(profileTrigger, ptr.To("true"))
	label := nodeopsv1.ProfileLabelPrefix + profileName
	e.waitNodeLabel(label, "provisioned", 5*time.Minute)
	cfg := framework.ReadFile(e.t, containerdConfig)
	if !strings.Contains(cfg, "runtimes."+runtimeHandler+"]") || !strings.Contains(cfg, runtimeType) || !strings.Contains(cfg, shimHostPath) {
		e.t.Fatalf("%s after the install lacks the %s handler:\n%s", containerdConfig, runtimeHandler, cfg)
	}
	if after := e.containerdPID(); after == containerdBefore {
		e.t.Errorf("containerd still runs as pid %d: the install did not restart it", after)
	} else {
		e.t.Logf("containerd restarted through the host's systemctl (pid %d -> %d); %s holds handler %s (%s)", containerdBefore, after, containerdConfig, runtimeHandler, runtimeType)
	}
	testutil.EventuallyEvery(e.t, time.Minute, realnodePoll, "RuntimeClass "+runtimeHandler, func(context.Context) error {
		var rc nodev1.RuntimeClass
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: runtimeHandler}, &rc); err != nil {
			return err
		}
		if rc.Handler != runtimeHandler || rc.Scheduling == nil || rc.Scheduling.NodeSelector[label] != "provisioned" {
			return fmt.Errorf("RuntimeClass %+v", rc)
		}
		return nil
	})

	pod := e.runtimePod("runtime-before")
	testutil.EventuallyEvery(e.t, 3*time.Minute, realnodePoll, "pod "+pod.Name+" Succeeded", func(context.Context) error {
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodSucceeded {
			return fmt.Errorf("phase %s %v", pod.Status.Phase, pod.Status.ContainerStatuses)
		}
		return nil
	})
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	info, err := exec.CommandContext(e.ctx, ctrBinary, "--address", containerdSocket, "-n", "k8s.io", "containers", "info", id).Output()
	if err != nil {
		e.t.Fatalf("ctr containers info %s: %v", id, err)
	}
	m := regexp.MustCompile(`"Runtime":\s*\{\s*"Name":\s*"([^"]+)"`).FindSubmatch(info)
	if m == nil || string(m[1]) != runtimeType {
		e.t.Fatalf("ctr says container %s of pod %s ran under %q, want %s:\n%s", id, pod.Name, m, runtimeType, info)
	}
	e.t.Logf("pod %s ran to completion; ctr: container %s ran under runtime %s", pod.Name, id, m[1])

	e.annotateNode(profileTrigger, nil)
	e.waitNodeLabel(label, "", 5*time.Minute)
	if cfg := framework.ReadFile(e.t, containerdConfig); strings.Contains(cfg, runtimeType) || strings.Contains(cfg, "runtimes."+runtimeHandler+"]") {
		e.t.Fatalf("%s still holds the %s handler after the uninstall:\n%s", containerdConfig, runtimeHandler, cfg)
	}
	if _, err := os.Stat(shimHostPath); !errors.Is(err, os.ErrNotExist) {
		e.t.Errorf("%s still there after the uninstall: %v", shimHostPath, err)
	}
	after := e.runtimePod("runtime-after")
	testutil.EventuallyEvery(e.t, time.Minute, realnodePoll, "pod "+after.Name+" unschedulable", func(context.Context) error {
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(after), after); err != nil {
			return err
		}
		for _, c := range after.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return nil
			}
		}
		return fmt.Errorf("phase %s, conditions %v", after.Status.Phase, after.Status.Conditions)
	})
	if after.Status.Phase != corev1.PodPending || after.Spec.NodeName != "" {
		e.t.Errorf("pod %s after the uninstall: phase %s on node %q, want Pending and unscheduled", after.Name, after.Status.Phase, after.Spec.NodeName)
	}
	e.t.Logf("after the uninstall pod %s stays Pending: %s", after.Name, podScheduledMessage(after))
	if err := e.c.Delete(e.ctx, after); err != nil {
		e.t.Error(err)
	}
	if err := e.c.Delete(e.ctx, profile); err != nil {
		e.t.Error(err)
	}
}

func podScheduledMessage(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Message
		}
	}
	return ""
}

// runtimePod creates a pod that exits 0 (the pause image with -v) under the profile's RuntimeClass.
func (e *env) runtimePod(name string) *corev1.Pod {
	e.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: workloadNS},
		Spec: corev1.PodSpec{
			RuntimeClassName: ptr.To(runtimeHandler),
			RestartPolicy:    corev1.RestartPolicyNever,
			Containers:       []corev1.Container{{Name: "once", Image: pauseImage, Args: []string{"-v"}, ImagePullPolicy: corev1.PullNever}},
		},
	}
	if err := e.c.Create(e.ctx, pod); err != nil {
		e.t.Fatal(err)
	}
	return pod
}

// annotateNode sets (or, with nil, removes) an annotation on the node, as a person would.
func (e *env) annotateNode(key string, value *string) {
	e.t.Helper()
	arg := key + "-"
	if value != nil {
		arg = key + "=" + *value
	}
	if out, err := e.kubectlOnce("annotate", "--overwrite", "node", e.node, arg); err != nil {
		e.t.Fatalf("kubectl annotate node %s %s: %v %s", e.node, arg, err, out)
	}
}

// waitNodeLabel waits for the node's label to have value ("" for absent).
func (e *env) waitNodeLabel(key, value string, timeout time.Duration) {
	e.t.Helper()
	testutil.EventuallyEvery(e.t, timeout, realnodePoll, fmt.Sprintf("node label %s=%q", key, value), func(context.Context) error {
		var n corev1.Node
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: e.node}, &n); err != nil {
			return err
		}
		if got := n.Labels[key]; got != value {
			var p nodeopsv1.NodeProfile
			_ = e.c.Get(e.ctx, client.ObjectKey{Name: profileName}, &p)
			return fmt.Errorf("label is %q; profile status %+v", got, p.Status)
		}
		return nil
	})
}

// containerdPID is the pid of the node's containerd.
func (e *env) containerdPID() int {
	e.t.Helper()
	want := "/var/lib/nodeops-realnode/bin/containerd"
	entries, err := os.ReadDir("/proc")
	if err != nil {
		e.t.Fatal(err)
	}
	for _, d := range entries {
		var pid int
		if _, err := fmt.Sscanf(d.Name(), "%d", &pid); err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", d.Name(), "exe")); err == nil && exe == want {
			return pid
		}
	}
	e.t.Fatalf("no %s process", want)
	return 0
}

// serveFile serves a copy of src named name over HTTP on the node's address and returns its URL
// and sha256. It stops with the test.
func (e *env) serveFile(src, name string) (string, string) {
	e.t.Helper()
	dir := e.t.TempDir()
	data, err := os.ReadFile(src)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o755); err != nil {
		e.t.Fatal(err)
	}
	url := e.serveDir(dir, "artifact")
	return url + "/" + name, framework.FileSHA256(e.t, filepath.Join(dir, name))
}

// serveDir serves a directory over HTTP on the node's address, where the agent's pod reaches it.
func (e *env) serveDir(root, what string) string {
	e.t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(e.nodeIP, "0"))
	if err != nil {
		e.t.Fatal(err)
	}
	srv := &http.Server{Handler: logRequests(e.t, what, http.FileServer(http.Dir(root))), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	e.t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}
