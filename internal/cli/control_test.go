package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/objname"
)

func TestApprove(t *testing.T) {
	cmds := []nodeopsv1.Command{script("one", "true"), script("two", "true"), script("three", "true")}
	op := createOperation(t, "approve-op", nodeopsv1.NodeOperationSpec{ExecutionMode: nodeopsv1.ExecutionControlled,
		Custom: &nodeopsv1.CustomOperation{Groups: []nodeopsv1.Group{{Name: "g", Commands: cmds}}}})
	a := createTask(t, op, "g", "a-1", cmds...)
	b := createTask(t, op, "g", "a-2", cmds...)
	// a-1 ran its first command and waits for the second; a-2 has not started.
	setTaskStatus(t, a.Name, func(s *nodeopsv1.NodeTaskStatus) {
		s.Phase, s.CurrentCommand, s.Progress = nodeopsv1.TaskRunning, 1, "1/3"
		s.Commands = []nodeopsv1.CommandStatus{{Name: "one", Phase: nodeopsv1.CommandSucceeded}, {Name: "two", Phase: nodeopsv1.CommandAwaitingApproval}}
	})
	if err := patchTask(ctx(t), k8s, a, func(t *nodeopsv1.NodeTask) { t.Spec.ApprovedCommands = 1 }); err != nil {
		t.Fatal(err)
	}

	out := mustRun(t, "approve", "approve-op")
	if !strings.Contains(out, "node a-1: approved command 2/3 two") || !strings.Contains(out, "node a-2: approved command 1/3 one") {
		t.Errorf("approve output:\n%s", out)
	}
	if got := getTask(t, a.Name).Spec.ApprovedCommands; got != 2 {
		t.Errorf("a-1 approvedCommands = %d, want 2", got)
	}
	if got := getTask(t, b.Name).Spec.ApprovedCommands; got != 1 {
		t.Errorf("a-2 approvedCommands = %d, want 1", got)
	}

	mustRun(t, "approve", "approve-op", "--all", "--node", "a-2")
	if got := getTask(t, b.Name).Spec.ApprovedCommands; got != 3 {
		t.Errorf("a-2 approvedCommands = %d after --all, want 3", got)
	}
	if got := getTask(t, a.Name).Spec.ApprovedCommands; got != 2 {
		t.Errorf("--node a-2 changed a-1: approvedCommands = %d", got)
	}
	if got := getOp(t, "approve-op").Spec.ExecutionMode; got != nodeopsv1.ExecutionControlled {
		t.Errorf("--all switched the operation to %s; only --auto does", got)
	}

	mustRun(t, "approve", "approve-op", "--auto")
	if got := getOp(t, "approve-op").Spec.ExecutionMode; got != nodeopsv1.ExecutionAuto {
		t.Errorf("operation mode %s after --auto", got)
	}
	if got := getTask(t, a.Name).Spec.ExecutionMode; got != nodeopsv1.ExecutionAuto {
		t.Errorf("task mode %s after --auto", got)
	}
	if _, errOut, code := run(t, "approve", "approve-op"); code != CodeError || !strings.Contains(errOut, "only Controlled operations wait for approval") {
		t.Errorf("approve of an Auto operation: exit %d, stderr %q", code, errOut)
	}
}

func TestRecoveryPauseResumeAbort(t *testing.T) {
	blockedRollout(t, "steer-op")
	out := mustRun(t, "skip", "steer-op")
	if !strings.Contains(out, "node b-3: Skip requested for command 2/3 restart-app (task "+objname.TaskName("steer-op", "rest", "b-3")+")") {
		t.Errorf("skip output:\n%s", out)
	}
	if got := getTask(t, objname.TaskName("steer-op", "rest", "b-3")).Spec.RecoveryMode; got != nodeopsv1.RecoverySkip {
		t.Errorf("recoveryMode = %q", got)
	}
	if got := getTask(t, objname.TaskName("steer-op", "rest", "b-4")).Spec.RecoveryMode; got != "" {
		t.Errorf("a running task got recoveryMode %q", got)
	}
	// A task by name works too; a node without a failed task is an error.
	mustRun(t, "retry", objname.TaskName("steer-op", "rest", "b-3"))
	if got := getTask(t, objname.TaskName("steer-op", "rest", "b-3")).Spec.RecoveryMode; got != nodeopsv1.RecoveryRetry {
		t.Errorf("recoveryMode = %q after retry by task name", got)
	}
	if _, errOut, code := run(t, "retry", "steer-op", "--node", "b-2"); code != CodeError || !strings.Contains(errOut, "has no failed task") {
		t.Errorf("retry of a node without failure: exit %d, stderr %q", code, errOut)
	}

	mustRun(t, "pause", "steer-op")
	if !getOp(t, "steer-op").Spec.Paused {
		t.Error("not paused")
	}
	mustRun(t, "resume", "steer-op")
	if getOp(t, "steer-op").Spec.Paused {
		t.Error("still paused after resume")
	}
	mustRun(t, "abort", "steer-op")
	if !getOp(t, "steer-op").Spec.Abort {
		t.Error("abort not set")
	}
}

func TestCreateOperations(t *testing.T) {
	deleteAtEnd(t, &nodeopsv1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "up-1"}})
	out := mustRun(t, "upgrade", "v1.37.2", "--name", "up-1", "--dry-run", "-l", "pool=blue", "--max-unavailable", "20%", "--binary-source", "https://bins.local")
	if !strings.Contains(out, "nodeoperation/up-1 created (upgrade v1.37.2, DryRun)") {
		t.Errorf("upgrade output:\n%s", out)
	}
	op := getOp(t, "up-1")
	if op.Spec.ExecutionMode != nodeopsv1.ExecutionDryRun || op.Spec.MaxUnavailable.String() != "20%" ||
		op.Spec.NodeSelector.MatchLabels["pool"] != "blue" || op.Spec.Upgrade.BinarySource.BaseURL != "https://bins.local" {
		t.Errorf("upgrade created %+v", op.Spec)
	}

	js := mustRun(t, "renew-certs", "--controlled", "--certificates", "apiserver", "--generate-name", "certs-", "-o", "json")
	var created nodeopsv1.NodeOperation
	if err := json.Unmarshal([]byte(js), &created); err != nil {
		t.Fatalf("renew-certs -o json: %v\n%s", err, js)
	}
	deleteAtEnd(t, &created)
	if !strings.HasPrefix(created.Name, "certs-") || created.Kind != "NodeOperation" || created.Spec.ExecutionMode != nodeopsv1.ExecutionControlled ||
		strings.Join(created.Spec.RenewCertificates.Certificates, ",") != "apiserver" {
		t.Errorf("renew-certs created %s %s %+v", created.Kind, created.Name, created.Spec)
	}

	// The API server's validation reaches the user.
	if _, errOut, code := run(t, "renew-certs", "--max-unavailable", "0"); code != CodeError || !strings.Contains(errOut, "maxUnavailable") {
		t.Errorf("renew-certs --max-unavailable 0: exit %d, stderr %q", code, errOut)
	}
}

func TestProfileStatus(t *testing.T) {
	p := &nodeopsv1.NodeProfile{ObjectMeta: metav1.ObjectMeta{Name: "wasm"}, Spec: nodeopsv1.NodeProfileSpec{
		Trigger: &nodeopsv1.ProfileTrigger{Annotation: "kwasm.sh/kwasm-node=true"},
		Install: []nodeopsv1.Command{script("install-shim", "true")},
		Windows: []nodeopsv1.MaintenanceWindow{{Start: "22:00", End: "04:00"}}}}
	if err := k8s.Create(ctx(t), p); err != nil {
		t.Fatal(err)
	}
	deleteAtEnd(t, p)
	p.Status.Nodes = nodeopsv1.ProfileNodeCounts{Matched: 3, Provisioned: 1, Provisioning: 1, Failed: 1}
	p.Status.Conditions = []metav1.Condition{cond(nodeopsv1.ConditionReady, metav1.ConditionFalse, "Degraded", "1 node failed"),
		cond(nodeopsv1.ConditionProvisioning, metav1.ConditionTrue, "WaitingForWindow", "1 waiting outside the maintenance windows")}
	p.Status.NextStart = &metav1.Time{Time: time.Date(2026, 12, 2, 22, 0, 0, 0, time.UTC)}
	if err := k8s.Status().Update(ctx(t), p); err != nil {
		t.Fatal(err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "wasm-1", Labels: map[string]string{nodeopsv1.ProfileLabelPrefix + "wasm": nodeopsv1.ProvisionedValue}}}
	if err := k8s.Create(ctx(t), n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), n) }) // plan tests count the cluster's nodes
	for _, tc := range []struct {
		node  string
		phase nodeopsv1.TaskPhase
	}{{"wasm-2", nodeopsv1.TaskRunning}, {"wasm-3", nodeopsv1.TaskFailed}} {
		task := &nodeopsv1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "wasm-install-" + tc.node,
			Labels: map[string]string{nodeopsv1.LabelProfile: "wasm", nodeopsv1.LabelNode: tc.node}},
			Spec: nodeopsv1.NodeTaskSpec{NodeName: tc.node, Commands: p.Spec.Install, ExecutionMode: nodeopsv1.ExecutionAuto}}
		if err := k8s.Create(ctx(t), task); err != nil {
			t.Fatal(err)
		}
		deleteAtEnd(t, task)
		setTaskStatus(t, task.Name, func(s *nodeopsv1.NodeTaskStatus) {
			s.Phase, s.Progress = tc.phase, "0/1"
			if tc.phase == nodeopsv1.TaskFailed {
				s.Message = "command install-shim failed: exit status 1"
				s.Commands = []nodeopsv1.CommandStatus{{Name: "install-shim", Phase: nodeopsv1.CommandFailed, ExitCode: exit(1)}}
			}
		})
	}
	out := mustRun(t, "profile", "status", "wasm")
	for _, want := range []string{"annotated kwasm.sh/kwasm-node=true", "Provisioned (1):\n  wasm-1",
		"daily 22:00-04:00 UTC (no new task starts outside them)", "True (WaitingForWindow)", "2026-12-02T22:00:00Z", "Provisioning (1):", "wasm-2", "Running",
		"Failed (1):\n  wasm-3: node wasm-3, command install-shim, exit 1: command install-shim failed: exit status 1 (task wasm-install-wasm-3)"} {
		if !strings.Contains(out, want) {
			t.Errorf("profile status lacks %q:\n%s", want, out)
		}
	}
	list := mustRun(t, "profile", "status")
	if !strings.Contains(list, "wasm") || !strings.Contains(list, "PROVISIONED") {
		t.Errorf("profile status (all):\n%s", list)
	}
	var st ProfileStatus
	if err := json.Unmarshal([]byte(mustRun(t, "profile", "status", "wasm", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Provisioned) != 1 || len(st.Provisioning) != 1 || len(st.Failed) != 1 {
		t.Errorf("profile status -o json: %+v", st)
	}
}

func TestHelpHasExamples(t *testing.T) {
	root := NewCommand(testOptions(&syncBuffer{}, &syncBuffer{}, ""))
	for _, c := range root.Commands() {
		if c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		subs := c.Commands()
		if len(subs) == 0 && c.Example == "" {
			t.Errorf("%s has no examples in --help", c.CommandPath())
		}
		for _, s := range subs {
			if s.Example == "" {
				t.Errorf("%s has no examples in --help", s.CommandPath())
			}
		}
	}
	out := mustRun(t, "watch", "--help")
	if !strings.Contains(out, "Exit codes: 0 Succeeded, 2 Failed, 3 Blocked, 4 Aborted") {
		t.Errorf("watch --help:\n%s", out)
	}
}

// An operation Blocked only by another owner's failed task has nothing of its own to retry or
// skip: retry and skip say so and pass on the condition's words (the holder, what to do).
func TestRecoveryOfAnOperationBlockedByAnotherOwnersTask(t *testing.T) {
	cmds := []nodeopsv1.Command{script("one", "true")}
	op := createOperation(t, "held-op", nodeopsv1.NodeOperationSpec{Custom: &nodeopsv1.CustomOperation{Groups: []nodeopsv1.Group{{Name: "g", Commands: cmds}}}})
	done := createTask(t, op, "g", "h-1", cmds...)
	setTaskStatus(t, done.Name, func(s *nodeopsv1.NodeTaskStatus) {
		s.Phase, s.Progress = nodeopsv1.TaskSucceeded, "1/1"
		s.Commands = []nodeopsv1.CommandStatus{{Name: "one", Phase: nodeopsv1.CommandSucceeded}}
	})
	why := "nothing of this operation can run: node h-2 is held by NodeTask wasm-h-2 of NodeProfile/wasm, which failed at command install; retry or skip that task (kubectl nodeops retry|skip wasm-h-2), or abort this operation"
	setOperationStatus(t, "held-op", func(s *nodeopsv1.NodeOperationStatus) {
		s.Phase = nodeopsv1.OperationBlocked
		s.Conditions = []metav1.Condition{{Type: nodeopsv1.ConditionBlocked, Status: metav1.ConditionTrue, Reason: nodeopsv1.ReasonNodeHeldByFailedTask,
			Message: why, LastTransitionTime: metav1.Now()}}
	})
	for _, verb := range []string{"retry", "skip"} {
		if _, errOut, code := run(t, verb, "held-op"); code != CodeError || !strings.Contains(errOut, "held-op has no failed task of its own") || !strings.Contains(errOut, "wasm-h-2") {
			t.Errorf("%s: exit %d, stderr %q", verb, code, errOut)
		}
	}
	if got := getTask(t, done.Name).Spec.RecoveryMode; got != "" {
		t.Errorf("the succeeded task got recoveryMode %q", got)
	}
}

// approve, retry and skip --gate act on a NodeProfile named nodeprofile/NAME with the annotations
// the profile controller reads, and refuse a gate the profile does not have.
func TestGateCommandsOnAProfile(t *testing.T) {
	p := &nodeopsv1.NodeProfile{ObjectMeta: metav1.ObjectMeta{Name: "gated-prof"}, Spec: nodeopsv1.NodeProfileSpec{
		Trigger: &nodeopsv1.ProfileTrigger{Annotation: "kwasm.sh/kwasm-node=true"},
		Install: []nodeopsv1.Command{script("install-shim", "true")},
		Gates:   []nodeopsv1.Gate{{Name: "change-board", Approval: &nodeopsv1.ApprovalGate{}}}}}
	if err := k8s.Create(ctx(t), p); err != nil {
		t.Fatal(err)
	}
	deleteAtEnd(t, p)
	at := metav1.NewTime(time.Date(2026, 12, 2, 22, 0, 0, 0, time.UTC))
	p.Status.Gates = []nodeopsv1.GateStatus{{Name: "change-board", State: nodeopsv1.GateWaiting, Message: "waiting for approval", Since: at, LastChecked: at}}
	if err := k8s.Status().Update(ctx(t), p); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, "profile", "status", "gated-prof"); !strings.Contains(out, "change-board: approval") || !regexp.MustCompile(`change-board\s+Waiting\s+.*waiting for approval`).MatchString(out) {
		t.Errorf("profile status does not show the gate and its last result:\n%s", out)
	}
	if out := mustRun(t, "approve", "nodeprofile/gated-prof", "--gate", "change-board"); !strings.Contains(out, "nodeprofile/gated-prof: gate change-board approved") {
		t.Errorf("approve output: %s", out)
	}
	mustRun(t, "retry", "nprof/gated-prof", "--gate", "change-board")
	if out := mustRun(t, "skip", "nodeprofile/gated-prof", "--gate", "change-board"); !strings.Contains(out, "for the rest of the profile") {
		t.Errorf("skip output: %s", out)
	}
	got := &nodeopsv1.NodeProfile{}
	if err := k8s.Get(ctx(t), client.ObjectKey{Name: "gated-prof"}, got); err != nil {
		t.Fatal(err)
	}
	for _, prefix := range []string{nodeopsv1.AnnotationApproveGatePrefix, nodeopsv1.AnnotationRetryGatePrefix, nodeopsv1.AnnotationSkipGatePrefix} {
		if got.Annotations[prefix+"change-board"] == "" {
			t.Errorf("annotation %s missing: %v", prefix+"change-board", got.Annotations)
		}
	}
	if _, errOut, code := run(t, "approve", "nodeprofile/gated-prof", "--gate", "nope"); code != CodeError || !strings.Contains(errOut, `nodeprofile gated-prof has no gate "nope"`) {
		t.Errorf("unknown gate: code %d, %s", code, errOut)
	}
}

// TestReconfigureShortcut: `reconfigure` builds from its flags the operation a person would write by
// hand, `plan reconfigure` shows the same plan as `plan -f` of that manifest, and a bad flag is
// refused naming it before anything is created.
func TestReconfigureShortcut(t *testing.T) {
	planCluster(t)
	args := []string{"--apiserver-arg", "audit-log-maxage=30", "--kubelet-config", "maxPods: 150\n"}
	viaShortcut := mustRun(t, append([]string{"plan", "reconfigure"}, args...)...)
	viaFile := mustRun(t, "plan", "-f", "testdata/reconfigure.yaml")
	cut := func(s string) string { return s[:strings.LastIndex(s, "Nothing was created.")] }
	if cut(viaShortcut) != cut(viaFile) {
		t.Errorf("plan reconfigure %q:\n%s\nwant the plan of testdata/reconfigure.yaml:\n%s", args, viaShortcut, viaFile)
	}

	deleteAtEnd(t, &nodeopsv1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "reconf-1"}})
	out := mustRun(t, "reconfigure", "--name", "reconf-1", "--dry-run", "--scheduler-arg", "v=2", "--scheduler-arg", "profiling-",
		"--scheduler-arg", "v=3", "--controller-manager-arg", "bind-address-", "--feature-gate", "ControlPlaneKubeletLocalMode=true",
		"--kubelet-config", "maxPods: 120", "--drain")
	if !strings.Contains(out, "nodeoperation/reconf-1 created (reconfigure, DryRun)") {
		t.Errorf("reconfigure output:\n%s", out)
	}
	rc := getOp(t, "reconf-1").Spec.Reconfigure
	cc := rc.ClusterConfiguration
	if cc == nil || cc.APIServer != nil || cc.Scheduler == nil || fmt.Sprint(cc.Scheduler.ExtraArgs) != "[--v=3]" ||
		fmt.Sprint(cc.Scheduler.RemoveExtraArgs) != "[profiling]" || fmt.Sprint(cc.ControllerManager.RemoveExtraArgs) != "[bind-address]" ||
		!cc.FeatureGates["ControlPlaneKubeletLocalMode"] || rc.KubeletConfiguration != "maxPods: 120" || rc.Drain == nil {
		t.Errorf("reconfigure created %+v (cluster configuration %+v)", rc, cc)
	}

	for _, bad := range [][]string{
		{"reconfigure"},
		{"reconfigure", "--apiserver-arg", "--audit-log-maxage=30"},
		{"reconfigure", "--scheduler-arg", "v"},
		{"reconfigure", "--feature-gate", "X=maybe"},
		{"reconfigure", "--kubelet-config", "a: 1", "--kubelet-config-file", "x.yaml"},
	} {
		before := operationCount(t)
		_, errOut, code := run(t, bad...)
		flag := "nothing to reconfigure"
		if len(bad) > 1 {
			flag = bad[1]
		}
		if code != CodeError || !strings.Contains(errOut, flag) {
			t.Errorf("%q: exit %d, stderr %q; want an error naming %s", bad, code, errOut, flag)
		}
		if operationCount(t) != before {
			t.Errorf("%q created an operation", bad)
		}
	}
	// The API server's own refusal reaches the user, naming the field.
	if _, errOut, code := run(t, "reconfigure", "--kubelet-config", "kind: KubeletConfiguration"); code != CodeError || !strings.Contains(errOut, "kubeletConfiguration") {
		t.Errorf("reconfigure --kubelet-config 'kind: ...': exit %d, stderr %q", code, errOut)
	}
}
