package nodeoperation

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/plan"
)

func resolved(name string, limit int, nodes ...string) plan.ResolvedGroup {
	return plan.ResolvedGroup{Group: v1alpha1.Group{Name: name, Commands: []v1alpha1.Command{{Name: "step", Wait: &v1alpha1.WaitCommand{}}}}, Nodes: nodes, MaxUnavailable: limit}
}

func tv(group, node string, phase v1alpha1.TaskPhase) taskView {
	return taskView{Name: objname.TaskName("op", group, node), Node: node, Group: group, Phase: phase}
}

func TestDecide(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	type want struct {
		phase      v1alpha1.OperationPhase
		groups     []v1alpha1.GroupPhase
		create     []string
		waiting    []string
		reason     string // Progressing, or the true condition's reason
		message    []string
		progress   string
		completion bool
	}
	tests := []struct {
		name   string
		op     v1alpha1.NodeOperation
		groups []plan.ResolvedGroup
		tasks  []taskView
		down   []string
		fail   *failure
		// held are the nodes the lock table shows held by other tasks.
		held map[string]nodelock.Holder
		// holders are those holding tasks as the cache shows them.
		holders map[string]taskView
		want    want
	}{
		{
			name:   "fresh: first group starts in sorted order",
			groups: []plan.ResolvedGroup{resolved("a", 2, "n3", "n1", "n2"), resolved("b", 1, "n1")},
			want: want{phase: v1alpha1.OperationRunning, groups: []v1alpha1.GroupPhase{v1alpha1.GroupRunning, v1alpha1.GroupPending},
				create: []string{"n1", "n2"}, reason: ReasonRunning, progress: "0/4 nodes"},
		},
		{
			name:   "finished group hands over to the next one",
			groups: []plan.ResolvedGroup{resolved("a", 1, "n1"), resolved("b", 1, "n1", "n2")},
			tasks:  []taskView{tv("a", "n1", v1alpha1.TaskSucceeded)},
			want: want{phase: v1alpha1.OperationRunning, groups: []v1alpha1.GroupPhase{v1alpha1.GroupSucceeded, v1alpha1.GroupRunning},
				create: []string{"n1"}, reason: ReasonRunning, progress: "1/3 nodes"},
		},
		{
			name:   "everything done",
			groups: []plan.ResolvedGroup{resolved("a", 1, "n1"), resolved("b", 1)},
			tasks:  []taskView{tv("a", "n1", v1alpha1.TaskSucceeded)},
			want: want{phase: v1alpha1.OperationSucceeded, groups: []v1alpha1.GroupPhase{v1alpha1.GroupSucceeded, v1alpha1.GroupSucceeded},
				reason: ReasonSucceeded, progress: "1/1 nodes", completion: true},
		},
		{
			name:   "a failed task blocks and names node and command",
			groups: []plan.ResolvedGroup{resolved("a", 3, "n1", "n2", "n3")},
			tasks: []taskView{{Name: "op-a-n2", Node: "n2", Group: "a", Phase: v1alpha1.TaskFailed, FailedCommand: "step", Message: "exit 2"},
				tv("a", "n1", v1alpha1.TaskSucceeded)},
			want: want{phase: v1alpha1.OperationBlocked, groups: []v1alpha1.GroupPhase{v1alpha1.GroupBlocked},
				reason: ReasonTaskFailed, message: []string{"op-a-n2", "node n2", "command step", "exit 2", "Retry or Skip"}, progress: "1/3 nodes"},
		},
		{
			name:   "paused starts nothing",
			op:     v1alpha1.NodeOperation{Spec: v1alpha1.NodeOperationSpec{Paused: true}},
			groups: []plan.ResolvedGroup{resolved("a", 3, "n1", "n2")},
			want:   want{phase: v1alpha1.OperationPaused, groups: []v1alpha1.GroupPhase{v1alpha1.GroupRunning}, reason: ReasonPaused, progress: "0/2 nodes"},
		},
		{
			name:   "abort with a running task waits",
			op:     v1alpha1.NodeOperation{Spec: v1alpha1.NodeOperationSpec{Abort: true}},
			groups: []plan.ResolvedGroup{resolved("a", 3, "n1", "n2"), resolved("b", 1, "n1")},
			tasks:  []taskView{tv("a", "n1", v1alpha1.TaskRunning)},
			want: want{phase: v1alpha1.OperationRunning, groups: []v1alpha1.GroupPhase{v1alpha1.GroupRunning, v1alpha1.GroupAborted},
				reason: ReasonAborting, progress: "0/3 nodes"},
		},
		{
			name:   "abort with nothing running ends the operation",
			op:     v1alpha1.NodeOperation{Spec: v1alpha1.NodeOperationSpec{Abort: true}},
			groups: []plan.ResolvedGroup{resolved("a", 3, "n1", "n2")},
			tasks:  []taskView{tv("a", "n1", v1alpha1.TaskFailed)},
			want: want{phase: v1alpha1.OperationAborted, groups: []v1alpha1.GroupPhase{v1alpha1.GroupAborted},
				reason: ReasonAborted, progress: "0/2 nodes", completion: true},
		},
		{
			name:   "a node held elsewhere waits and names the holder",
			groups: []plan.ResolvedGroup{resolved("a", 2, "n1", "n2")},
			held:   map[string]nodelock.Holder{"n1": {Task: "other-g-n1", Owner: "NodeProfile/wasm"}},
			want: want{phase: v1alpha1.OperationRunning, groups: []v1alpha1.GroupPhase{v1alpha1.GroupRunning}, create: []string{"n2"}, waiting: []string{"n1"},
				reason: ReasonWaitingForNode, message: []string{"node n1", "NodeTask other-g-n1 of NodeProfile/wasm"}, progress: "0/2 nodes"},
		},
		{
			// budgets are cluster-wide (rule 11): a node unavailable for any reason counts against every group selecting it.
			name:   "a node held elsewhere counts against maxUnavailable wherever it sorts",
			groups: []plan.ResolvedGroup{resolved("a", 1, "n1", "n2")},
			held:   map[string]nodelock.Holder{"n2": {Task: "other-g-n2", Owner: "NodeOperation/other"}},
			want: want{phase: v1alpha1.OperationRunning, groups: []v1alpha1.GroupPhase{v1alpha1.GroupRunning}, waiting: []string{"n2"},
				reason: ReasonWaitingForNode, message: []string{"node n2"}, progress: "0/2 nodes"},
		},
		{
			name:   "a node held by the task it would create is not waited for",
			groups: []plan.ResolvedGroup{resolved("a", 2, "n1", "n2")},
			held:   map[string]nodelock.Holder{"n1": {Task: objname.TaskName("op", "a", "n1"), Owner: "NodeOperation/op"}},
			want: want{phase: v1alpha1.OperationRunning, groups: []v1alpha1.GroupPhase{v1alpha1.GroupRunning}, create: []string{"n1", "n2"},
				reason: ReasonRunning, progress: "0/2 nodes"},
		},
		{
			// a failure blocks until a person decides and budgets are cluster-wide (rules 3 and 11): only a person ends this wait.
			name:    "waiting only for a node another owner's failed task holds blocks, naming it",
			groups:  []plan.ResolvedGroup{resolved("a", 1, "n1", "n2")},
			tasks:   []taskView{tv("a", "n1", v1alpha1.TaskSucceeded)},
			held:    map[string]nodelock.Holder{"n2": {Task: "wasm-n2", Owner: "NodeProfile/wasm"}},
			holders: map[string]taskView{"wasm-n2": {Name: "wasm-n2", Node: "n2", Phase: v1alpha1.TaskFailed, FailedCommand: "install", Message: "exit status 1"}},
			want: want{phase: v1alpha1.OperationBlocked, groups: []v1alpha1.GroupPhase{v1alpha1.GroupBlocked}, waiting: []string{"n2"},
				reason:  v1alpha1.ReasonNodeHeldByFailedTask,
				message: []string{"node n2", "NodeTask wasm-n2 of NodeProfile/wasm", "install: exit status 1", "kubectl nodeops retry|skip wasm-n2", "abort this operation"}, progress: "1/2 nodes"},
		},
		{
			name:    "the maxUnavailable room spent only by another owner's failed node blocks",
			groups:  []plan.ResolvedGroup{resolved("a", 1, "n1", "n2", "n3")},
			down:    []string{"n3"},
			held:    map[string]nodelock.Holder{"n1": {Task: "other-g-n1", Owner: "NodeOperation/other"}},
			holders: map[string]taskView{"other-g-n1": {Name: "other-g-n1", Node: "n1", Phase: v1alpha1.TaskFailed, FailedCommand: "drain"}},
			want: want{phase: v1alpha1.OperationBlocked, groups: []v1alpha1.GroupPhase{v1alpha1.GroupBlocked}, waiting: []string{"n1"},
				reason: v1alpha1.ReasonNodeHeldByFailedTask, message: []string{"node n1", "NodeOperation/other", "its 2 other nodes wait too"}, progress: "0/3 nodes"},
		},
		{
			name:   "every node left held by failed tasks of others blocks, naming them",
			groups: []plan.ResolvedGroup{resolved("a", 3, "n1", "n2", "n3")},
			tasks:  []taskView{tv("a", "n1", v1alpha1.TaskSucceeded)},
			held:   map[string]nodelock.Holder{"n2": {Task: "wasm-n2", Owner: "NodeProfile/wasm"}, "n3": {Task: "other-g-n3", Owner: "NodeOperation/other"}},
			holders: map[string]taskView{"wasm-n2": {Name: "wasm-n2", Node: "n2", Phase: v1alpha1.TaskFailed, FailedCommand: "install"},
				"other-g-n3": {Name: "other-g-n3", Node: "n3", Phase: v1alpha1.TaskFailed, FailedCommand: "drain"}},
			want: want{phase: v1alpha1.OperationBlocked, groups: []v1alpha1.GroupPhase{v1alpha1.GroupBlocked}, waiting: []string{"n2", "n3"},
				reason: v1alpha1.ReasonNodeHeldByFailedTask, message: []string{"node n2 is held by NodeTask wasm-n2 of NodeProfile/wasm", "and nodes n3"}, progress: "1/3 nodes"},
		},
		{
			name:    "a failed holder leaving room for another node does not block",
			groups:  []plan.ResolvedGroup{resolved("a", 2, "n1", "n2", "n3")},
			tasks:   []taskView{tv("a", "n2", v1alpha1.TaskSucceeded)},
			down:    []string{"n2", "n3"},
			held:    map[string]nodelock.Holder{"n1": {Task: "other-g-n1", Owner: "NodeOperation/other"}},
			holders: map[string]taskView{"other-g-n1": {Name: "other-g-n1", Node: "n1", Phase: v1alpha1.TaskFailed}},
			want: want{phase: v1alpha1.OperationRunning, groups: []v1alpha1.GroupPhase{v1alpha1.GroupRunning}, waiting: []string{"n1"},
				reason: ReasonWaitingForNode, message: []string{"node n1", "NotReady nodes n3"}, progress: "1/3 nodes"},
		},
		{
			name:    "a node held by another owner's running task waits, not blocked",
			groups:  []plan.ResolvedGroup{resolved("a", 1, "n1", "n2")},
			tasks:   []taskView{tv("a", "n1", v1alpha1.TaskSucceeded)},
			held:    map[string]nodelock.Holder{"n2": {Task: "wasm-n2", Owner: "NodeProfile/wasm"}},
			holders: map[string]taskView{"wasm-n2": {Name: "wasm-n2", Node: "n2", Phase: v1alpha1.TaskRunning}},
			want: want{phase: v1alpha1.OperationRunning, groups: []v1alpha1.GroupPhase{v1alpha1.GroupRunning}, waiting: []string{"n2"},
				reason: ReasonWaitingForNode, message: []string{"node n2"}, progress: "1/2 nodes"},
		},
		{
			name:    "a failed holder a person is recovering does not block",
			groups:  []plan.ResolvedGroup{resolved("a", 1, "n1", "n2")},
			tasks:   []taskView{tv("a", "n1", v1alpha1.TaskSucceeded)},
			held:    map[string]nodelock.Holder{"n2": {Task: "wasm-n2", Owner: "NodeProfile/wasm"}},
			holders: map[string]taskView{"wasm-n2": {Name: "wasm-n2", Node: "n2", Phase: v1alpha1.TaskFailed, Recovering: true}},
			want: want{phase: v1alpha1.OperationRunning, groups: []v1alpha1.GroupPhase{v1alpha1.GroupRunning}, waiting: []string{"n2"},
				reason: ReasonWaitingForNode, message: []string{"node n2"}, progress: "1/2 nodes"},
		},
		{
			name:    "an own running task keeps a group whose other node is held by a failed task running",
			groups:  []plan.ResolvedGroup{resolved("a", 2, "n1", "n2")},
			tasks:   []taskView{tv("a", "n1", v1alpha1.TaskRunning)},
			held:    map[string]nodelock.Holder{"n2": {Task: "wasm-n2", Owner: "NodeProfile/wasm"}},
			holders: map[string]taskView{"wasm-n2": {Name: "wasm-n2", Node: "n2", Phase: v1alpha1.TaskFailed}},
			want: want{phase: v1alpha1.OperationRunning, groups: []v1alpha1.GroupPhase{v1alpha1.GroupRunning}, waiting: []string{"n2"},
				reason: ReasonWaitingForNode, message: []string{"node n2"}, progress: "0/2 nodes"},
		},
		{
			name:   "NotReady nodes count and wait",
			groups: []plan.ResolvedGroup{resolved("a", 2, "n1", "n2", "n3")},
			down:   []string{"n1"},
			want: want{phase: v1alpha1.OperationRunning, groups: []v1alpha1.GroupPhase{v1alpha1.GroupRunning}, create: []string{"n2"},
				reason: ReasonRunning, message: []string{"NotReady nodes n1"}, progress: "0/3 nodes"},
		},
		{
			name:   "refused before anything ran",
			groups: []plan.ResolvedGroup{resolved("a", 1, "n1")},
			fail:   &failure{reason: plan.ReasonUnsupportedVersionSkew, message: "cannot upgrade the cluster from v1.35.0 to v1.37.2"},
			want:   want{phase: v1alpha1.OperationFailed, reason: plan.ReasonUnsupportedVersionSkew, message: []string{"v1.35.0", "v1.37.2"}, completion: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			op := tt.op
			op.Name, op.Generation = "op", 3
			in := &input{op: &op, groups: tt.groups, tasks: map[string]map[string]taskView{}, notReady: map[string]bool{}, fail: tt.fail, now: now}
			for _, task := range tt.tasks {
				if in.tasks[task.Group] == nil {
					in.tasks[task.Group] = map[string]taskView{}
				}
				in.tasks[task.Group][task.Node] = task
			}
			for _, n := range tt.down {
				in.notReady[n] = true
			}
			in.locks = nodelock.View{Nodes: tt.held}
			in.holders = tt.holders
			d := decide(in)
			st := d.status
			if st.Phase != tt.want.phase {
				t.Errorf("phase %s, want %s", st.Phase, tt.want.phase)
			}
			var groups []v1alpha1.GroupPhase
			for _, g := range st.Groups {
				groups = append(groups, g.Phase)
			}
			if !reflect.DeepEqual(groups, tt.want.groups) {
				t.Errorf("groups %v, want %v", groups, tt.want.groups)
			}
			var create []string
			for _, s := range d.create {
				create = append(create, s.node)
			}
			if !reflect.DeepEqual(create, tt.want.create) {
				t.Errorf("create %v, want %v", create, tt.want.create)
			}
			var waiting []string
			for n := range d.waiting {
				waiting = append(waiting, n)
			}
			slices.Sort(waiting)
			if !reflect.DeepEqual(waiting, tt.want.waiting) {
				t.Errorf("waiting %v, want %v", waiting, tt.want.waiting)
			}
			c := phaseCondition(&st)
			if c == nil || c.Reason != tt.want.reason {
				t.Errorf("condition %+v, want reason %s", c, tt.want.reason)
			}
			for _, m := range tt.want.message {
				if c == nil || !strings.Contains(c.Message, m) {
					t.Errorf("message %q lacks %q", c.Message, m)
				}
			}
			if st.Progress != tt.want.progress {
				t.Errorf("progress %q, want %q", st.Progress, tt.want.progress)
			}
			if (st.CompletionTime != nil) != tt.want.completion || st.StartTime == nil || st.ObservedGeneration != 3 {
				t.Errorf("times/generation: start %v completion %v gen %d", st.StartTime, st.CompletionTime, st.ObservedGeneration)
			}
			for _, ct := range []string{v1alpha1.ConditionProgressing, v1alpha1.ConditionSucceeded, v1alpha1.ConditionFailed, v1alpha1.ConditionBlocked} {
				if c := meta.FindStatusCondition(st.Conditions, ct); c == nil || c.Reason == "" || c.ObservedGeneration != 3 {
					t.Errorf("condition %s missing or without reason: %+v", ct, c)
				}
			}
		})
	}
}

// A group the status records as Succeeded is not reopened by a node that joins later.
func TestDecideKeepsSucceededGroups(t *testing.T) {
	op := v1alpha1.NodeOperation{Status: v1alpha1.NodeOperationStatus{Groups: []v1alpha1.GroupStatus{
		{Name: "a", Phase: v1alpha1.GroupSucceeded, Nodes: v1alpha1.NodeCounts{Total: 1, Succeeded: 1}},
		{Name: "b", Phase: v1alpha1.GroupPending},
	}}}
	in := &input{op: &op, groups: []plan.ResolvedGroup{resolved("a", 1, "n1", "new"), resolved("b", 1, "n1")},
		tasks: map[string]map[string]taskView{}, notReady: map[string]bool{}}
	d := decide(in)
	if len(d.create) != 1 || d.create[0].group.Name != "b" {
		t.Fatalf("create %+v", d.create)
	}
}

func TestSignificantAndTransitions(t *testing.T) {
	base := v1alpha1.NodeOperationStatus{Phase: v1alpha1.OperationRunning, StartTime: &metav1.Time{},
		Groups: []v1alpha1.GroupStatus{{Name: "a", Phase: v1alpha1.GroupRunning, Nodes: v1alpha1.NodeCounts{Total: 2, Pending: 2}}}}
	setConditions(&base, 1, v1alpha1.OperationRunning, ReasonRunning, "group a: 0/2")

	counts := *base.DeepCopy()
	counts.Groups[0].Nodes = v1alpha1.NodeCounts{Total: 2, Pending: 1, Succeeded: 1}
	setConditions(&counts, 1, v1alpha1.OperationRunning, ReasonRunning, "group a: 1/2")
	if significant(&base, &counts) {
		t.Error("a count moving is batched, not written at once")
	}
	if evs := transitions(&base, &counts); len(evs) != 0 {
		t.Errorf("a count moving raised events %v", evs)
	}

	blocked := *base.DeepCopy()
	blocked.Phase = v1alpha1.OperationBlocked
	blocked.Groups[0].Phase = v1alpha1.GroupBlocked
	setConditions(&blocked, 1, v1alpha1.OperationBlocked, ReasonTaskFailed, "NodeTask x on node n failed")
	if !significant(&base, &blocked) {
		t.Error("blocking is written at once")
	}
	evs := transitions(&base, &blocked)
	if len(evs) != 1 || evs[0].reason != "Blocked" || evs[0].kind != "Warning" || !strings.Contains(evs[0].note, "node n") {
		t.Errorf("events %+v", evs)
	}

	fresh := v1alpha1.NodeOperationStatus{}
	evs = transitions(&fresh, &base)
	var reasons []string
	for _, e := range evs {
		reasons = append(reasons, e.reason)
	}
	if !reflect.DeepEqual(reasons, []string{"Started", "GroupStarted"}) {
		t.Errorf("start events %v", reasons)
	}

	// Going on after a person's decision is Resumed, not the group starting again.
	reasons = nil
	for _, e := range transitions(&blocked, &base) {
		reasons = append(reasons, e.reason)
	}
	if slices.Contains(reasons, "GroupStarted") {
		t.Errorf("events from Blocked back to Running %v: the group started long ago", reasons)
	}
}

// budgets are cluster-wide (rule 11): a node cordoned outside the group counts and waits, except for
// a group that can only make it more available (an uncordon), which finds it counted already.
func TestDecideCordonedNodes(t *testing.T) {
	for _, tt := range []struct {
		name     string
		commands []v1alpha1.Command
		want     []string
	}{
		{"a group that takes nodes away waits", []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}, {Script: &v1alpha1.ScriptCommand{Inline: "true"}}}, nil},
		{"waiting only still waits", []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}}, nil},
		{"an uncordon starts on the cordoned node only", []v1alpha1.Command{{Uncordon: &v1alpha1.UncordonCommand{}}, {WaitNodeReady: &v1alpha1.WaitNodeReadyCommand{}}}, []string{"n2"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			op := v1alpha1.NodeOperation{}
			op.Name = "op"
			g := resolved("g", 1, "n1", "n2", "n3")
			g.Commands = tt.commands
			in := &input{op: &op, groups: []plan.ResolvedGroup{g}, tasks: map[string]map[string]taskView{},
				notReady: map[string]bool{}, cordoned: map[string]bool{"n2": true}}
			d := decide(in)
			var got []string
			for _, c := range d.create {
				got = append(got, c.node)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("create %v, want %v", got, tt.want)
			}
			if c := meta.FindStatusCondition(d.status.Conditions, v1alpha1.ConditionProgressing); tt.want == nil && !strings.Contains(c.Message, "cordoned nodes n2") {
				t.Errorf("Progressing %q does not name the cordoned node", c.Message)
			}
		})
	}
}
