package confinement

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/config"
	"github.com/nodeops/nodeops/internal/statuswrite"
	"github.com/nodeops/nodeops/internal/testutil/confine"
)

// The writers' rules, as internal/agent and internal/controller/nodetask declare them
// (agent.recordRule, agent.signRule, nodetask.lostRule, nodetask.drainedRule).
var (
	agentRecord  = statuswrite.Rule{Kind: "NodeTask", Fields: statuswrite.AllButConditions, Lock: true}
	agentSign    = statuswrite.Rule{Kind: "NodeTask", Fields: statuswrite.AllButConditions, Changed: true}
	managerLost  = statuswrite.Rule{Kind: "NodeTask", Fields: statuswrite.ConditionsOnly, Owned: []string{v1alpha1.ConditionAgentLost}, Lock: true}
	managerDrain = statuswrite.Rule{Kind: "NodeTask", Fields: statuswrite.ConditionsOnly, Owned: []string{v1alpha1.ConditionDrained}, Lock: true}
	// managerAny is the manager's two rules in one, what the admission policy allows it.
	managerAny = statuswrite.Rule{Kind: "NodeTask", Fields: statuswrite.ConditionsOnly, Owned: []string{v1alpha1.ConditionAgentLost, v1alpha1.ConditionDrained}}
)

// managerRefused is what nodeops-manager-nodetask-status says when it refuses the manager.
const managerRefused = "nodeops' manager may change only a NodeTask's status.conditions AgentLost and Drained"

// agentFieldChanges change each of the agent's status fields (every NodeTaskStatus field but
// conditions) of a task its agent recorded Running; TestSafetyRule10_ManagerConfinedToItsOwnTaskConditions
// fails when a field has no row.
var agentFieldChanges = map[string]func(*v1alpha1.NodeTaskStatus){
	"phase":          func(s *v1alpha1.NodeTaskStatus) { s.Phase = v1alpha1.TaskFailed },
	"currentCommand": func(s *v1alpha1.NodeTaskStatus) { s.CurrentCommand = 1 },
	"progress":       func(s *v1alpha1.NodeTaskStatus) { s.Progress = "" },
	"reason":         func(s *v1alpha1.NodeTaskStatus) { s.Reason = "AgentLost" },
	"message":        func(s *v1alpha1.NodeTaskStatus) { s.Message = "the manager's words" },
	"commands":       func(s *v1alpha1.NodeTaskStatus) { s.Commands[0].Phase = v1alpha1.CommandSucceeded },
	"attempt":        func(s *v1alpha1.NodeTaskStatus) { s.Attempt = 2 },
	"agentHeartbeat": func(s *v1alpha1.NodeTaskStatus) {
		s.AgentHeartbeat = ptr.To(metav1.NewMicroTime(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)))
	},
	"observedGeneration":  func(s *v1alpha1.NodeTaskStatus) { s.ObservedGeneration = 7 },
	"recoveredGeneration": func(s *v1alpha1.NodeTaskStatus) { s.RecoveredGeneration = 7 },
	"certificates": func(s *v1alpha1.NodeTaskStatus) {
		s.Certificates = []v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: metav1.NewTime(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))}}
	},
	"certificateAuthorityServer": func(s *v1alpha1.NodeTaskStatus) {
		s.CertificateAuthorityServer = &v1alpha1.CertificateAuthorityServer{Address: "10.0.0.9:9443", CertificateSHA256: strings.Repeat("ab", 32)}
	},
	"startTime":      func(s *v1alpha1.NodeTaskStatus) { s.StartTime = nil },
	"completionTime": func(s *v1alpha1.NodeTaskStatus) { s.CompletionTime = ptr.To(metav1.NowMicro()) },
}

// TestSafetyRule10_ManagerConfinedToItsOwnTaskConditions: confinement (rule 10) holds for the
// manager's side of a task's status too. The status is split one writer per field
// (v1alpha1.NodeTaskStatus): the agent's phase, commands, progress and every field but conditions;
// the manager's conditions AgentLost and Drained. The agent's normal writes and the manager's own
// pass; the manager's change to any agent field, or to a condition of another type, is refused by
// the API (config/admission/manager-nodetask-status.yaml) with the policy's message, and before
// any write by statuswrite.Write under the manager's rule: the two checks agree, field by field.
func TestSafetyRule10_ManagerConfinedToItsOwnTaskConditions(t *testing.T) {
	ctx := context.Background()
	agentA, _ := as(t, token(t, "node-a"))
	tasks(t)

	// The agent's normal writes: its Running record (intent before action, rule 4) and a heartbeat.
	task := get(t, taskA)
	rec := task.DeepCopy()
	rec.Status = v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskRunning, Progress: "0/1", Attempt: 1, ObservedGeneration: task.Generation,
		StartTime: ptr.To(metav1.NowMicro()), AgentHeartbeat: ptr.To(metav1.NowMicro()),
		Commands: []v1alpha1.CommandStatus{{Name: "cordon", Phase: v1alpha1.CommandRunning, Attempt: 1, StartTime: ptr.To(metav1.NowMicro())}}}
	write(t, "node-a's agent recording its command Running", agentA, agentRecord, task, rec)
	task = get(t, taskA)
	beat := task.DeepCopy()
	beat.Status.AgentHeartbeat = ptr.To(metav1.NewMicroTime(time.Now().Add(time.Second)))
	write(t, "node-a's agent renewing its heartbeat", agentA, agentSign, task, beat)

	// The manager's own writes: AgentLost, then Drained.
	task = get(t, taskA)
	lost := task.DeepCopy()
	meta.SetStatusCondition(&lost.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionAgentLost, Status: metav1.ConditionTrue,
		Reason: v1alpha1.ReasonAgentLost, Message: "no heartbeat", ObservedGeneration: task.Generation})
	write(t, "the manager marking task-a AgentLost", manager, managerLost, task, lost)
	task = get(t, taskA)
	drained := task.DeepCopy()
	meta.SetStatusCondition(&drained.Status.Conditions, v1alpha1.DrainedCondition("cordon/1", v1alpha1.DrainOutcome{Succeeded: true}, task.Generation))
	write(t, "the manager recording Drained", manager, managerDrain, task, drained)

	// Every agent field: refused to the manager by the API, and by statuswrite before the API.
	typ := reflect.TypeFor[v1alpha1.NodeTaskStatus]()
	for i := range typ.NumField() {
		field, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if field == "conditions" {
			continue
		}
		change, ok := agentFieldChanges[field]
		if !ok {
			t.Errorf("status.%s has no row in agentFieldChanges: is it the agent's, and does manager-nodetask-status.yaml compare it?", field)
			continue
		}
		task := get(t, taskA)
		obj := task.DeepCopy()
		change(&obj.Status)
		if reflect.DeepEqual(obj.Status, task.Status) {
			t.Fatalf("the row of status.%s changes nothing", field)
		}
		what := "the manager changing status." + field
		confine.Refused(t, what, manager.Status().Update(ctx, obj.DeepCopy()), []string{
			"ValidatingAdmissionPolicy 'nodeops-manager-nodetask-status'", managerRefused,
			"refused: changing status." + field + " of NodeTask " + taskA})
		_, _, err := statuswrite.Write(ctx, manager, managerAny, nil, statuswrite.Change{Orig: task, Obj: obj, Urgent: true})
		if err == nil || !strings.Contains(err.Error(), "status."+field+" is not this writer's to write") {
			t.Errorf("%s through statuswrite.Write: %v, want refused before the write", what, err)
		}
	}
	// Two fields at once are both named.
	task = get(t, taskA)
	obj := task.DeepCopy()
	obj.Status.Phase, obj.Status.Progress = v1alpha1.TaskSucceeded, "1/1"
	confine.Refused(t, "the manager finishing the task", manager.Status().Update(ctx, obj), []string{"changing status.phase, status.progress of"})

	// A condition of another type than the manager's: refused by both.
	task = get(t, taskA)
	obj = task.DeepCopy()
	meta.SetStatusCondition(&obj.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Manager", Message: "m"})
	confine.Refused(t, "the manager writing a Ready condition", manager.Status().Update(ctx, obj.DeepCopy()), []string{
		"ValidatingAdmissionPolicy 'nodeops-manager-nodetask-status'", "no condition of another type", "refused: changing the condition Ready of NodeTask " + taskA})
	if _, _, err := statuswrite.Write(ctx, manager, managerAny, nil, statuswrite.Change{Orig: task, Obj: obj, Urgent: true}); err == nil ||
		!strings.Contains(err.Error(), "condition Ready is not this writer's to write") {
		t.Errorf("the manager writing a Ready condition through statuswrite.Write: %v, want refused before the write", err)
	}

	// The manager clearing its own conditions (a whole merge patch of conditions, as statuswrite sends it) passes.
	if err := manager.Status().Patch(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: taskA}}, confine.Merge(`{"status":{"conditions":null}}`)); err != nil {
		t.Fatalf("the manager clearing its conditions: %v", err)
	}
	got := get(t, taskA)
	if got.Status.Phase != v1alpha1.TaskRunning || len(got.Status.Commands) != 1 || got.Status.Commands[0].Phase != v1alpha1.CommandRunning ||
		got.Status.Progress != "0/1" || len(got.Status.Conditions) != 0 {
		s, _ := json.Marshal(got.Status)
		t.Errorf("after the manager's writes: %s; want the agent's Running record kept and no condition", s)
	}
}

// write writes obj's status over orig with c under rule, through statuswrite.Write as the writer does.
func write(t *testing.T, what string, c client.Client, rule statuswrite.Rule, orig, obj *v1alpha1.NodeTask) {
	t.Helper()
	done, _, err := statuswrite.Write(context.Background(), c, rule, nil, statuswrite.Change{Orig: orig, Obj: obj, Urgent: true})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if done != statuswrite.Wrote {
		t.Fatalf("%s: nothing written (%d)", what, done)
	}
}

// TestManagerStatusRuleNamesEveryAgentField: the manager may change only status.conditions of a
// NodeTask, and its policy compares the agent's fields one by one (CEL cannot drop one field from a
// typed object); a field added to NodeTaskStatus must be added to the rule, or the manager could write it.
func TestManagerStatusRuleNamesEveryAgentField(t *testing.T) {
	data, err := config.Admission.ReadFile("admission/manager-nodetask-status.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// One line of the variable agentFields per field: "object.?status.?F... == oldObject.?status.?F... ? '' : 'F',".
	compared := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSuffix(strings.TrimSpace(line), ",")
		_, name, ok := strings.Cut(line, " ? '' : '")
		name = strings.TrimSuffix(name, "'")
		if ok && strings.HasPrefix(line, "object.?status.?"+name) && strings.Contains(line, " == oldObject.?status.?"+name) {
			compared[name] = true
		}
	}
	typ := reflect.TypeFor[v1alpha1.NodeTaskStatus]()
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if name == "conditions" {
			continue
		}
		if !compared[name] {
			t.Errorf("config/admission/manager-nodetask-status.yaml does not compare status.%s of a NodeTask", name)
		}
		delete(compared, name)
	}
	for name := range compared {
		t.Errorf("config/admission/manager-nodetask-status.yaml compares status.%s, which NodeTaskStatus lacks", name)
	}
}
