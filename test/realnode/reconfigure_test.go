//go:build realnode

package realnode

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// What the real node's reconfigure (issue 28) changes: an API server flag kubeadm does not set
// and the kubelet's maxPods (110 by default).
const (
	reconfFlag    = "audit-log-maxage"
	reconfValue   = "7"
	reconfMaxPods = 150
	kubeletConfig = "/var/lib/kubelet/config.yaml"
)

// reconfigureSpec is the operation a person writes to set the flag and maxPods.
func reconfigureSpec(mode nodeopsv1.ExecutionMode) nodeopsv1.NodeOperationSpec {
	return nodeopsv1.NodeOperationSpec{ExecutionMode: mode, Reconfigure: &nodeopsv1.ReconfigureOperation{
		ClusterConfiguration: &nodeopsv1.ClusterConfigurationPatch{APIServer: &nodeopsv1.APIServerPatch{
			ControlPlaneComponentPatch: nodeopsv1.ControlPlaneComponentPatch{ExtraArgs: []nodeopsv1.ExtraArg{{Name: reconfFlag, Value: reconfValue}}},
		}},
		KubeletConfiguration: fmt.Sprintf("maxPods: %d\n", reconfMaxPods),
	}}
}

// reconfigure runs a DryRun, which must change neither the API server's manifest nor the kubelet's
// configuration and must show both differences, then the reconfigure itself, after which the
// running kube-apiserver process carries the flag, the Node's capacity says maxPods, the node is
// Ready and the cluster admin is served at once; kubeadm's own `kubeadm upgrade plan` still passes.
func (e *env) reconfigure() {
	e.t.Helper()
	if args := e.apiServerArgs(); hasArg(args, "--"+reconfFlag) {
		e.t.Fatalf("kube-apiserver runs with --%s before the reconfigure: %q", reconfFlag, args)
	}
	if pods := e.capacityPods(); pods == reconfMaxPods {
		e.t.Fatalf("node %s has capacity pods %d before the reconfigure", e.node, pods)
	}

	step(e.t, "a DryRun shows the differences and changes nothing")
	manifest := filepath.Join(manifestsDir, "kube-apiserver.yaml")
	before := map[string]string{manifest: framework.ReadFile(e.t, manifest), kubeletConfig: framework.ReadFile(e.t, kubeletConfig)}
	dry := e.createOperation("reconfigure-dry-run-", reconfigureSpec(nodeopsv1.ExecutionDryRun))
	e.watchSucceeded(dry, "10m")
	for f, was := range before {
		if now := framework.ReadFile(e.t, f); now != was {
			e.t.Errorf("%s changed in a DryRun", f)
		}
	}
	out := e.commandStatus(objname.TaskName(dry, plan.GroupFirstControlPlane, e.node), "kubeadmReconfigureNode").OutputTail
	for _, want := range []string{
		e.node + " kube-apiserver.yaml would change:\n  flag --" + reconfFlag + ": (none) -> " + reconfValue,
	} {
		if !strings.Contains(out, want) {
			e.t.Errorf("the DryRun's kubeadmReconfigureNode output lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(fmt.Sprintf(`maxPods: \S+ -> %d\n`, reconfMaxPods)).MatchString(out) {
		e.t.Errorf("the DryRun's kubeadmReconfigureNode output does not show maxPods becoming %d:\n%s", reconfMaxPods, out)
	}

	step(e.t, "the reconfigure")
	kubeletBefore := e.kubeletPID()
	begin := time.Now()
	op := e.createOperation("reconfigure-", reconfigureSpec(nodeopsv1.ExecutionAuto))
	e.watchSucceeded(op, "15m")
	e.controlPlaneServesAtOnce("kubectl nodeops watch " + op + " exited Succeeded")
	figure("reconfigure (an API server flag and maxPods on one control plane): %s", time.Since(begin).Round(100*time.Millisecond))
	e.nodeops("describe", op)
	if after := e.kubeletPID(); after == kubeletBefore {
		e.t.Errorf("the kubelet was not restarted: pid %d before and after", after)
	}
	// The same kubelet binary keeps the static pods' UIDs: its restart stops none of their runs.
	if msg := e.commandStatus(objname.TaskName(op, plan.GroupFirstControlPlane, e.node), "restartService").Message; msg != "kubelet restarted with systemctl" {
		e.t.Errorf("the reconfigure's kubelet restart says %q; want only %q (the same binary keeps the static pods)", msg, "kubelet restarted with systemctl")
	}
	e.verifyReconfigured("after the reconfigure")
	e.upgradePlanPasses()
}

// verifyReconfigured checks that the running kube-apiserver has the flag and the Node's capacity
// says maxPods, with the node Ready.
func (e *env) verifyReconfigured(when string) {
	e.t.Helper()
	want := "--" + reconfFlag + "=" + reconfValue
	testutil.EventuallyEvery(e.t, 2*time.Minute, realnodePoll, "kube-apiserver running with "+want, func(context.Context) error {
		if args := e.apiServerArgs(); !hasArg(args, want) {
			return fmt.Errorf("kube-apiserver runs with %q", args)
		}
		return nil
	})
	testutil.EventuallyEvery(e.t, 2*time.Minute, realnodePoll, fmt.Sprintf("node capacity pods %d and Ready", reconfMaxPods), func(context.Context) error {
		var n corev1.Node
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: e.node}, &n); err != nil {
			return err
		}
		if got := n.Status.Capacity.Pods().Value(); got != reconfMaxPods {
			return fmt.Errorf("capacity pods %d", got)
		}
		if !plan.NodeReady(&n) {
			return fmt.Errorf("node not Ready")
		}
		return nil
	})
	if cfg := framework.ReadFile(e.t, kubeletConfig); !strings.Contains(cfg, fmt.Sprintf("maxPods: %d", reconfMaxPods)) {
		e.t.Errorf("%s lacks maxPods: %d", kubeletConfig, reconfMaxPods)
	}
	e.t.Logf("%s: kube-apiserver runs with %s; node %s Ready with capacity pods %d", when, want, e.node, reconfMaxPods)
}

// upgradePlanPasses runs kubeadm's own `kubeadm upgrade plan` with the node's kubeadm, as a person
// would before an upgrade; it must exit 0. The machine has no route to the internet, so kubeadm
// falls back to its own version for "stable" (it says so); the preflight errors ignored are the
// ones the upgrade itself ignores on this machine (cgroup v1, no CoreDNS).
func (e *env) upgradePlanPasses() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, hostKubeadm, "upgrade", "plan", "--kubeconfig", kubeconfig,
		"--ignore-preflight-errors", "SystemVerification,CoreDNSUnsupportedPlugins,CoreDNSMigration")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		e.t.Fatalf("%s upgrade plan: %v\n%s", hostKubeadm, err, out.String())
	}
	e.t.Logf("%s upgrade plan passed:\n%s", hostKubeadm, out.String())
}

// createOperation creates a NodeOperation with the spec and returns its name.
func (e *env) createOperation(prefix string, spec nodeopsv1.NodeOperationSpec) string {
	e.t.Helper()
	op := &nodeopsv1.NodeOperation{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}, Spec: spec}
	if err := e.c.Create(e.ctx, op); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = e.c.Delete(context.Background(), op) })
	e.t.Logf("created NodeOperation %s", op.Name)
	return op.Name
}

// watchSucceeded follows the operation with `kubectl nodeops watch` until it ends; it must end Succeeded.
func (e *env) watchSucceeded(op, timeout string) {
	e.t.Helper()
	if _, code, err := e.nodeopsCode("watch", op, "--timeout", timeout); err != nil || code != 0 {
		e.t.Fatalf("kubectl nodeops watch %s: exit %d %v, want 0 (Succeeded)", op, code, err)
	}
	e.operationSucceeded(op)
}

// commandStatus is the status of the task's first command of the kind.
func (e *env) commandStatus(task, kind string) nodeopsv1.CommandStatus {
	e.t.Helper()
	var nt nodeopsv1.NodeTask
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: task}, &nt); err != nil {
		e.t.Fatal(err)
	}
	for i, c := range nt.Spec.Commands {
		if c.Kind() == kind && i < len(nt.Status.Commands) {
			return nt.Status.Commands[i]
		}
	}
	e.t.Fatalf("task %s has no %s command with a status", task, kind)
	return nodeopsv1.CommandStatus{}
}

// apiServerArgs is the command line of the node's running kube-apiserver process, read from /proc
// (other API servers may run on the machine, such as tests' own: the node's is kubeadm's, with its
// client CA under /etc/kubernetes/pki).
func (e *env) apiServerArgs() []string {
	e.t.Helper()
	args, _ := processArgs("kube-apiserver", "--client-ca-file="+pkiDir+"/ca.crt")
	return args
}

// kubeletPID is the node's running kubelet's process ID.
func (e *env) kubeletPID() int {
	e.t.Helper()
	_, pid := processArgs("kubelet", "--config="+kubeletConfig)
	if pid == 0 {
		e.t.Fatal("no kubelet process")
	}
	return pid
}

// processArgs finds a process whose command is name with the argument mark, and returns its
// arguments and PID.
func processArgs(name, mark string) ([]string, int) {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		raw, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if filepath.Base(args[0]) == name && hasArg(args, mark) {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return args, pid
		}
	}
	return nil, 0
}

func hasArg(args []string, want string) bool {
	for _, a := range args {
		if a == want || strings.HasPrefix(a, want+"=") {
			return true
		}
	}
	return false
}

// capacityPods is the Node's pod capacity, which the kubelet sets from its maxPods.
func (e *env) capacityPods() int64 {
	e.t.Helper()
	var n corev1.Node
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: e.node}, &n); err != nil {
		e.t.Fatal(err)
	}
	return n.Status.Capacity.Pods().Value()
}
