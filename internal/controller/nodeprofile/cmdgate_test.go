package nodeprofile_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/testutil"
)

// checksOf lists the profile's gate checks (v1alpha1.IsGateCheck) from the API server, by attempt.
// The test's cleanup removes them: envtest has no garbage collector to follow the owner.
func checksOf(t *testing.T, ctx context.Context, profile string) []v1alpha1.NodeTask {
	t.Helper()
	var list v1alpha1.NodeTaskList
	must(t, env.client.List(ctx, &list, client.HasLabels{v1alpha1.LabelGateCheck}))
	var out []v1alpha1.NodeTask
	for _, task := range list.Items {
		if task.Spec.Operation == profile && v1alpha1.IsGateCheck(&task) {
			out = append(out, task)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, _ := strconv.Atoi(out[i].Labels[v1alpha1.LabelGateAttempt])
		b, _ := strconv.Atoi(out[j].Labels[v1alpha1.LabelGateAttempt])
		return a < b
	})
	return out
}

// removeChecks deletes the profile's checks once the test ends.
func removeChecks(t *testing.T, profile string) {
	t.Cleanup(func() {
		ctx := context.Background()
		for _, c := range checksOf(t, ctx, profile) {
			c.Finalizers = nil
			_ = env.client.Update(ctx, &c)
			_ = env.client.Delete(ctx, &c)
		}
	})
}

// waitCheck waits for attempt n of the profile's check and returns it.
func waitCheck(t *testing.T, ctx context.Context, profile string, n int) v1alpha1.NodeTask {
	t.Helper()
	var out v1alpha1.NodeTask
	testutil.Eventually(t, wait, fmt.Sprintf("check attempt %d of %s", n, profile), func() error {
		var seen []string
		for _, c := range checksOf(t, ctx, profile) {
			if c.Labels[v1alpha1.LabelGateAttempt] == strconv.Itoa(n) {
				out = c
				return nil
			}
			seen = append(seen, c.Name)
		}
		return fmt.Errorf("checks %v", seen)
	})
	return out
}

func commandGate(name, node string, timeout time.Duration) v1alpha1.Gate {
	return v1alpha1.Gate{Name: name, Timeout: &metav1.Duration{Duration: timeout}, Command: &v1alpha1.CommandGate{Script: "test -f /var/lib/resync-done", Node: node}}
}

// A profile's command gate is answered by a gate-check NodeTask on the node about to start, owned
// by the profile: while its script fails no install starts and the profile says the exit code and
// the output; once a check succeeds that node's install starts, and the next node is checked on
// its own before its install. The checks are no profile task: they count in no status.
func TestProfileCommandGateHoldsInstallsUntilTheScriptPasses(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	makeNode(t, ctx, "pcmd-1", "pcmd", nil, kwasm)
	makeNode(t, ctx, "pcmd-2", "pcmd", nil, kwasm)
	removeChecks(t, "pcmd")
	makeProfile(t, ctx, "pcmd", "pcmd", func(s *v1alpha1.NodeProfileSpec) {
		s.MaxUnavailable = ptrIntOrString(2)
		s.Gates = []v1alpha1.Gate{commandGate("resync", "", 2*time.Minute)}
	})

	first := waitCheck(t, ctx, "pcmd", 1)
	if first.Spec.NodeName != "pcmd-1" || first.Spec.GateCheck != "resync" || len(first.Spec.Commands) != 1 ||
		first.Spec.Commands[0].Script == nil || first.Spec.Commands[0].Script.Inline != "test -f /var/lib/resync-done" {
		t.Fatalf("check task: node %s, gateCheck %q, commands %+v", first.Spec.NodeName, first.Spec.GateCheck, first.Spec.Commands)
	}
	if ref := metav1.GetControllerOf(&first); ref == nil || ref.Kind != "NodeProfile" || ref.Name != "pcmd" {
		t.Fatalf("check's controller: %+v", ref)
	}
	noTask(t, ctx, "pcmd", "the check has not answered")

	must(t, agent().Exit(ctx, first.Name, 3, "md0: resync 42% done\n"))
	testutil.Eventually(t, wait, "the profile says the exit code and output", func() error {
		c := condition(getProfile(t, ctx, "pcmd"), v1alpha1.ConditionProvisioning)
		if c.Reason != nodeprofile.ReasonWaitingForGate || !strings.Contains(c.Message, "script exited 3 on node pcmd-1") || !strings.Contains(c.Message, "resync 42% done") {
			return fmt.Errorf("%s: %s", c.Reason, c.Message)
		}
		return nil
	})
	if n := getProfile(t, ctx, "pcmd").Status.Nodes; n.Matched != 2 || n.Provisioning != 0 || n.Failed != 0 {
		t.Errorf("a failed check counts in the profile's nodes: %+v", n)
	}
	noTask(t, ctx, "pcmd", "the script failed")

	// Checked again: a new check each time, at most two kept.
	second := waitCheck(t, ctx, "pcmd", 2)
	must(t, agent().Exit(ctx, second.Name, 3, "md0: resync 80% done"))
	third := waitCheck(t, ctx, "pcmd", 3)
	testutil.Eventually(t, wait, "older checks deleted", func() error {
		if cs := checksOf(t, ctx, "pcmd"); len(cs) > 2 {
			return fmt.Errorf("%d checks kept", len(cs))
		}
		return nil
	})
	noTask(t, ctx, "pcmd", "the script still fails")

	must(t, agent().RunAll(ctx, third.Name))
	task := waitTask(t, ctx, "pcmd", "pcmd-1", nodeprofile.ActionInstall)
	// maxUnavailable 2, but the script answered for pcmd-1 only: pcmd-2 waits for its own check.
	next := waitCheck(t, ctx, "pcmd", 4)
	if next.Spec.NodeName != "pcmd-2" {
		t.Fatalf("the next check runs on %s, want pcmd-2", next.Spec.NodeName)
	}
	if byNode, err := tasksOf(ctx, "pcmd"); err != nil || len(byNode["pcmd-2"]) != 0 {
		t.Fatalf("pcmd-2 started before its check answered: %v %v", byNode, err)
	}
	must(t, agent().RunAll(ctx, next.Name))
	task2 := waitTask(t, ctx, "pcmd", "pcmd-2", nodeprofile.ActionInstall)
	for _, name := range []string{task.Name, task2.Name} {
		agentRun(t, ctx, name)
		agentSucceed(t, ctx, name)
	}
	waitCondition(t, ctx, "pcmd", v1alpha1.ConditionReady, metav1.ConditionTrue, "all 2 node(s) provisioned")
	if n := getProfile(t, ctx, "pcmd").Status.Nodes; n.Matched != 2 || n.Provisioned != 2 {
		t.Errorf("status.nodes: %+v", n)
	}
}

// A command gate whose check does not answer for its timeout blocks the profile with the gate's
// own message; its unfinished check is told to abort, never deleted while it may run; skip
// releases the profile.
func TestProfileCommandGateTimeoutBlocksAndSkipReleasesIt(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	makeNode(t, ctx, "pcmdto-1", "pcmdto", nil, kwasm)
	removeChecks(t, "pcmdto")
	makeProfile(t, ctx, "pcmdto", "pcmdto", func(s *v1alpha1.NodeProfileSpec) {
		s.Gates = []v1alpha1.Gate{commandGate("resync", "", 3*time.Second)}
	})
	check := waitCheck(t, ctx, "pcmdto", 1)
	agentRun(t, ctx, check.Name)
	c := waitCondition(t, ctx, "pcmdto", v1alpha1.ConditionBlocked, metav1.ConditionTrue,
		"gate resync held the profile for its timeout", "checking: NodeTask "+check.Name+" running on node pcmdto-1",
		"skip nodeprofile/pcmdto --gate resync")
	if c.Reason != nodeprofile.ReasonGateTimedOut {
		t.Errorf("Blocked reason %s", c.Reason)
	}
	testutil.Eventually(t, wait, "the running check told to abort, and kept", func() error {
		var got v1alpha1.NodeTask
		if err := env.client.Get(ctx, client.ObjectKey{Name: check.Name}, &got); err != nil {
			return err
		}
		if !got.Spec.Abort {
			return fmt.Errorf("check %s not told to abort", got.Name)
		}
		return nil
	})
	noTask(t, ctx, "pcmdto", "the gate timed out")

	updateProfile(t, ctx, "pcmdto", func(p *v1alpha1.NodeProfile) {
		p.Annotations = map[string]string{v1alpha1.AnnotationSkipGatePrefix + "resync": "true"}
	})
	waitCondition(t, ctx, "pcmdto", v1alpha1.ConditionBlocked, metav1.ConditionFalse)
	if g := gateOf(getProfile(t, ctx, "pcmdto"), "resync"); g == nil || g.State != v1alpha1.GateSkipped {
		t.Errorf("status.gates after skip: %+v", getProfile(t, ctx, "pcmdto").Status.Gates)
	}
	// The check still runs on the node (one task per node, rule 1): the install waits for its agent to end it.
	noTask(t, ctx, "pcmdto", "beside the running check", time.Second)
	agentAbort(t, ctx, check.Name)
	task := waitTask(t, ctx, "pcmdto", "pcmdto-1", nodeprofile.ActionInstall)
	agentRun(t, ctx, task.Name)
	agentSucceed(t, ctx, task.Name)
	waitCondition(t, ctx, "pcmdto", v1alpha1.ConditionReady, metav1.ConditionTrue)
}

// a gate that cannot be evaluated blocks (rule 14): a command gate whose node does not exist
// holds the profile, saying so, makes no check and starts no install; it then blocks the profile.
func TestSafetyRule14_ProfileCommandGateOnAMissingNodeHolds(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	makeNode(t, ctx, "pcmdgone-1", "pcmdgone", nil, kwasm)
	removeChecks(t, "pcmdgone")
	makeProfile(t, ctx, "pcmdgone", "pcmdgone", func(s *v1alpha1.NodeProfileSpec) {
		s.Gates = []v1alpha1.Gate{commandGate("storage", "pcmdgone-storage", 4*time.Second)}
	})
	p := waitReason(t, ctx, "pcmdgone", v1alpha1.ConditionProvisioning, nodeprofile.ReasonWaitingForGate)
	if c := condition(p, v1alpha1.ConditionProvisioning); !strings.Contains(c.Message, "cannot check: node pcmdgone-storage does not exist") {
		t.Errorf("message: %s", c.Message)
	}
	noTask(t, ctx, "pcmdgone", "past a gate whose node does not exist", time.Second)
	waitCondition(t, ctx, "pcmdgone", v1alpha1.ConditionBlocked, metav1.ConditionTrue, "cannot check: node pcmdgone-storage does not exist")
	noTask(t, ctx, "pcmdgone", "past a gate whose node does not exist, timed out")
	if cs := checksOf(t, ctx, "pcmdgone"); len(cs) != 0 {
		t.Errorf("checks made for a node that does not exist: %d", len(cs))
	}
}

// An alertmanager gate with a silence has the profile hold one over each node while its install
// runs: created before the task, recorded in status.silences, expired once the task ended.
func TestProfileSilenceHeldWhileTheNodeIsWorkedOn(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	am := testutil.NewFakeAlertmanager(t)
	makeNode(t, ctx, "psil-1", "psil", nil, kwasm)
	makeProfile(t, ctx, "psil", "psil", func(s *v1alpha1.NodeProfileSpec) {
		s.Gates = []v1alpha1.Gate{{Name: "am", Alertmanager: &v1alpha1.AlertmanagerGate{URL: am.URL,
			Silence: &v1alpha1.AlertmanagerSilence{Matchers: []string{"instance={{node}}"}, MaxDuration: &metav1.Duration{Duration: time.Hour}}}}}
	})
	task := waitTask(t, ctx, "psil", "psil-1", nodeprofile.ActionInstall)
	var id string
	testutil.Eventually(t, wait, "the silence recorded", func() error {
		sil := getProfile(t, ctx, "psil").Status.Silences
		if len(sil) != 1 || sil[0].Node != "psil-1" || sil[0].Gate != "am" || sil[0].ID == "" {
			return fmt.Errorf("status.silences %+v", sil)
		}
		id = sil[0].ID
		return nil
	})
	if s := am.States()[id]; s != "active instance=psil-1" {
		t.Fatalf("silence %s while psil-1 is worked on: %q", id, s)
	}
	agentRun(t, ctx, task.Name)
	agentSucceed(t, ctx, task.Name)
	testutil.Eventually(t, wait, "silence "+id+" expired, its record gone", func() error {
		if s := am.States()[id]; !strings.HasPrefix(s, "expired") {
			return fmt.Errorf("silence %s: %s", id, s)
		}
		if sil := getProfile(t, ctx, "psil").Status.Silences; len(sil) != 0 {
			return fmt.Errorf("status.silences %+v", sil)
		}
		return nil
	})
	waitCondition(t, ctx, "psil", v1alpha1.ConditionReady, metav1.ConditionTrue)
	if st := am.States(); len(st) != 1 {
		t.Errorf("silences made: %v, want one", st)
	}
}

// a gate that cannot be evaluated blocks (rule 14): an Alertmanager that refuses the silence of
// the node about to start holds the profile with the reason; no install starts without its silence.
func TestSafetyRule14_ProfileSilenceAlertmanagerRefusesHolds(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	am := testutil.NewFakeAlertmanager(t)
	am.Refuse(true)
	makeNode(t, ctx, "psildown-1", "psildown", nil, kwasm)
	makeProfile(t, ctx, "psildown", "psildown", func(s *v1alpha1.NodeProfileSpec) {
		s.Gates = []v1alpha1.Gate{{Name: "am", Timeout: &metav1.Duration{Duration: time.Minute}, Alertmanager: &v1alpha1.AlertmanagerGate{URL: am.URL,
			Silence: &v1alpha1.AlertmanagerSilence{Matchers: []string{"instance={{node}}"}}}}}
	})
	testutil.Eventually(t, wait, "the gate holds with the reason", func() error {
		c := condition(getProfile(t, ctx, "psildown"), v1alpha1.ConditionProvisioning)
		if c.Reason != nodeprofile.ReasonWaitingForGate || !strings.Contains(c.Message, "cannot create the silence for node psildown-1") {
			return fmt.Errorf("%s: %s", c.Reason, c.Message)
		}
		return nil
	})
	noTask(t, ctx, "psildown", "without its node's silence", time.Second)

	am.Refuse(false)
	task := waitTask(t, ctx, "psildown", "psildown-1", nodeprofile.ActionInstall)
	if sil := getProfile(t, ctx, "psildown").Status.Silences; len(sil) != 1 || sil[0].Node != "psildown-1" {
		t.Errorf("status.silences once the task exists: %+v", sil)
	}
	agentRun(t, ctx, task.Name)
	agentSucceed(t, ctx, task.Name)
	waitCondition(t, ctx, "psildown", v1alpha1.ConditionReady, metav1.ConditionTrue)
}
