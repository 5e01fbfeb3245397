package cli

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/objname"
)

// blockedRollout: a custom operation whose second group stopped on a failed command.
func blockedRollout(t *testing.T, name string) {
	mu := intstr.FromString("50%")
	op := createOperation(t, name, nodeopsv1.NodeOperationSpec{
		NodeSelector:   &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "blue"}},
		MaxUnavailable: &mu,
		Custom: &nodeopsv1.CustomOperation{Groups: []nodeopsv1.Group{
			{Name: "canary", NodeFilter: nodeopsv1.NodeFilterHead, Commands: []nodeopsv1.Command{script("stop-app", "systemctl stop app")}},
			{Name: "rest", NodeFilter: nodeopsv1.NodeFilterTail, Commands: []nodeopsv1.Command{
				{Cordon: &nodeopsv1.CordonCommand{}}, script("restart-app", "systemctl restart app"), {Uncordon: &nodeopsv1.UncordonCommand{}}}},
		}},
	})
	canary := createTask(t, op, "canary", "b-1", op.Spec.Custom.Groups[0].Commands...)
	ok := createTask(t, op, "rest", "b-2", op.Spec.Custom.Groups[1].Commands...)
	bad := createTask(t, op, "rest", "b-3", op.Spec.Custom.Groups[1].Commands...)
	running := createTask(t, op, "rest", "b-4", op.Spec.Custom.Groups[1].Commands...)
	done := func(name string, d time.Duration) nodeopsv1.CommandStatus {
		return nodeopsv1.CommandStatus{Name: name, Phase: nodeopsv1.CommandSucceeded, Attempt: 1, ExitCode: exit(0),
			StartTime: microAt(d), CompletionTime: microAt(d + 5*time.Second)}
	}
	setTaskStatus(t, canary.Name, func(s *nodeopsv1.NodeTaskStatus) {
		s.Phase, s.Progress, s.Attempt = nodeopsv1.TaskSucceeded, "1/1", 1
		s.Commands = []nodeopsv1.CommandStatus{done("stop-app", -4*time.Minute)}
	})
	setTaskStatus(t, ok.Name, func(s *nodeopsv1.NodeTaskStatus) {
		s.Phase, s.Progress, s.CurrentCommand, s.Attempt = nodeopsv1.TaskSucceeded, "3/3", 2, 1
		s.Commands = []nodeopsv1.CommandStatus{done("cordon", -3*time.Minute), done("restart-app", -3*time.Minute), done("uncordon", -3*time.Minute)}
		// The describe shows the time a command waited apart from the time its work ran.
		s.Commands[1].Waits = []nodeopsv1.CommandWait{{For: nodeopsv1.WaitSecretMount, Duration: metav1.Duration{Duration: 1500 * time.Millisecond}}}
	})
	setTaskStatus(t, bad.Name, func(s *nodeopsv1.NodeTaskStatus) {
		s.Phase, s.Progress, s.CurrentCommand, s.Attempt = nodeopsv1.TaskFailed, "1/3", 1, 1
		s.Reason, s.Message = nodeopsv1.ReasonCommandFailed, "command restart-app failed: exit status 3"
		out := "Job for app.service failed.\n"
		for i := 1; i <= 25; i++ {
			out += "app[42]: line " + strings.Repeat("x", i%7) + "\n"
		}
		out += "app[42]: fatal: cannot bind :8080: address already in use\n"
		s.Commands = []nodeopsv1.CommandStatus{done("cordon", -2*time.Minute), {Name: "restart-app", Phase: nodeopsv1.CommandFailed,
			Attempt: 1, ExitCode: exit(3), StartTime: microAt(-2 * time.Minute), CompletionTime: microAt(-time.Minute),
			Message: "exit status 3", OutputTail: out}}
	})
	setTaskStatus(t, running.Name, func(s *nodeopsv1.NodeTaskStatus) {
		s.Phase, s.Progress, s.CurrentCommand, s.Attempt = nodeopsv1.TaskRunning, "1/3", 1, 1
		s.Commands = []nodeopsv1.CommandStatus{done("cordon", -2*time.Minute),
			{Name: "restart-app", Phase: nodeopsv1.CommandRunning, Attempt: 1, StartTime: microAt(-30 * time.Second)}}
	})
	setOperationStatus(t, name, func(s *nodeopsv1.NodeOperationStatus) {
		s.Phase, s.Progress = nodeopsv1.OperationBlocked, "2/4 nodes"
		s.StartTime = at(-5 * time.Minute)
		s.Conditions = []metav1.Condition{
			cond(nodeopsv1.ConditionProgressing, metav1.ConditionFalse, "Blocked", "waiting for a person"),
			cond(nodeopsv1.ConditionBlocked, metav1.ConditionTrue, nodeopsv1.ReasonCommandFailed, "node b-3: command restart-app failed: exit status 3"),
		}
		s.Groups = []nodeopsv1.GroupStatus{
			{Name: "canary", Phase: nodeopsv1.GroupSucceeded, Nodes: nodeopsv1.NodeCounts{Total: 1, Succeeded: 1}},
			{Name: "rest", Phase: nodeopsv1.GroupBlocked, Nodes: nodeopsv1.NodeCounts{Total: 3, Succeeded: 1, Running: 1, Failed: 1}},
		}
	})
}

func TestDescribeGolden(t *testing.T) {
	blockedRollout(t, "describe-blocked")

	op := createOperation(t, "describe-controlled", nodeopsv1.NodeOperationSpec{
		ExecutionMode:     nodeopsv1.ExecutionControlled,
		RenewCertificates: &nodeopsv1.RenewCertificatesOperation{},
	})
	cmds := []nodeopsv1.Command{{KubeadmRenewCertificates: &nodeopsv1.KubeadmRenewCertificatesCommand{}}, {RestartStaticPods: &nodeopsv1.RestartStaticPodsCommand{}}}
	waiting := createTask(t, op, "control-planes", "cp-1", cmds...)
	setTaskStatus(t, waiting.Name, func(s *nodeopsv1.NodeTaskStatus) {
		s.Phase, s.Progress = nodeopsv1.TaskPending, "0/2"
		s.Commands = []nodeopsv1.CommandStatus{{Name: "kubeadmRenewCertificates", Phase: nodeopsv1.CommandAwaitingApproval}}
	})
	setOperationStatus(t, op.Name, func(s *nodeopsv1.NodeOperationStatus) {
		s.Phase, s.Progress, s.StartTime = nodeopsv1.OperationRunning, "0/3 nodes", at(-time.Minute)
		s.Conditions = []metav1.Condition{cond(nodeopsv1.ConditionProgressing, metav1.ConditionTrue, "WaitingForApproval", "node cp-1 waits for approval of kubeadmRenewCertificates")}
		s.Groups = []nodeopsv1.GroupStatus{{Name: "control-planes", Phase: nodeopsv1.GroupRunning, Nodes: nodeopsv1.NodeCounts{Total: 3, Running: 1, Pending: 2}}}
	})

	succeeded := createOperation(t, "describe-succeeded", nodeopsv1.NodeOperationSpec{
		Custom: &nodeopsv1.CustomOperation{Groups: []nodeopsv1.Group{{Name: "all", Commands: []nodeopsv1.Command{{Wait: &nodeopsv1.WaitCommand{Duration: metav1.Duration{Duration: time.Second}}}}}}},
	})
	_ = succeeded
	setOperationStatus(t, "describe-succeeded", func(s *nodeopsv1.NodeOperationStatus) {
		s.Phase, s.Progress, s.StartTime, s.CompletionTime = nodeopsv1.OperationSucceeded, "0/0 nodes", at(-2*time.Minute), at(-90*time.Second)
		s.Conditions = []metav1.Condition{cond(nodeopsv1.ConditionSucceeded, metav1.ConditionTrue, "AllGroupsSucceeded", "every group succeeded")}
		s.Groups = []nodeopsv1.GroupStatus{{Name: "all", Phase: nodeopsv1.GroupSucceeded, Message: "no node matched the group's selector"}}
	})

	for _, tc := range []struct{ golden, name string }{
		{"describe-blocked", "describe-blocked"},
		{"describe-controlled", "describe-controlled"},
		{"describe-succeeded", "describe-succeeded"},
		{"describe-task", objname.TaskName("describe-blocked", "rest", "b-3")},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			golden(t, tc.golden, mustRun(t, "describe", tc.name))
		})
	}
	if _, errOut, code := run(t, "describe", "no-such-operation"); code != CodeError || !strings.Contains(errOut, `nodeoperation "no-such-operation" not found`) {
		t.Errorf("describe of a missing operation: exit %d, stderr %q", code, errOut)
	}
}

func TestGetAndLogs(t *testing.T) {
	blockedRollout(t, "logs-blocked")
	out := mustRun(t, "get", "logs-blocked")
	for _, want := range []string{"NAME", "logs-blocked", "custom (2 groups)", "Blocked", "2/4 nodes"} {
		if !strings.Contains(out, want) {
			t.Errorf("get: missing %q in\n%s", want, out)
		}
	}
	if y := mustRun(t, "get", "logs-blocked", "-o", "yaml"); !strings.Contains(y, "kind: NodeOperation") || !strings.Contains(y, "phase: Blocked") {
		t.Errorf("get -o yaml:\n%s", y)
	}
	logs := mustRun(t, "logs", "logs-blocked", "--failed")
	if !strings.Contains(logs, "==> node b-3, task "+objname.TaskName("logs-blocked", "rest", "b-3")+", command 2/3 restart-app: Failed, exit 3 <==") ||
		!strings.Contains(logs, "address already in use") || strings.Contains(logs, "cordon") {
		t.Errorf("logs --failed:\n%s", logs)
	}
	logs = mustRun(t, "logs", "logs-blocked", "--node", "b-2")
	if strings.Count(logs, "==> node b-2") != 3 || strings.Contains(logs, "b-3") {
		t.Errorf("logs --node b-2:\n%s", logs)
	}
}

// TestBusyNodeIsShown: a task its agent cannot start because another task holds the node's lock
// (exclusion that cannot be bypassed, rule 8) says so in describe and in the live watch.
func TestBusyNodeIsShown(t *testing.T) {
	op := createOperation(t, "describe-busy", nodeopsv1.NodeOperationSpec{
		Custom: &nodeopsv1.CustomOperation{Groups: []nodeopsv1.Group{{Name: "all", Commands: []nodeopsv1.Command{script("hello", "echo hello")}}}},
	})
	task := createTask(t, op, "all", "busy-1", op.Spec.Custom.Groups[0].Commands...)
	const busy = "node busy: held by task other-op-all-busy-1"
	setTaskStatus(t, task.Name, func(s *nodeopsv1.NodeTaskStatus) {
		s.Phase, s.Progress, s.Message = nodeopsv1.TaskPending, "0/1", busy
		s.Commands = []nodeopsv1.CommandStatus{{Name: "hello", Phase: nodeopsv1.CommandPending}}
	})
	if out := mustRun(t, "describe", op.Name); !strings.Contains(out, "Pending ("+busy+")") {
		t.Errorf("describe does not show the busy node:\n%s", out)
	}
	task.Status.Message = busy
	if line := nodeLine(task, time.Now()); !strings.Contains(line, busy) {
		t.Errorf("the watch line %q does not show the busy node", line)
	}
}
