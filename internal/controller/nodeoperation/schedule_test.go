package nodeoperation

import (
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/plan"
)

// TestDecideScheduling: maintenance windows and soak delays hold new tasks, never running ones,
// and say when the group may go on.
func TestDecideScheduling(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	window := func(start, end string) []v1alpha1.MaintenanceWindow {
		return []v1alpha1.MaintenanceWindow{{Start: start, End: end}}
	}
	succeededAt := func(group, node string, at time.Time) taskView {
		v := tv(group, node, v1alpha1.TaskSucceeded)
		v.Done = at
		return v
	}
	d := func(x time.Duration) *metav1.Duration { return &metav1.Duration{Duration: x} }
	tests := []struct {
		name      string
		spec      v1alpha1.Scheduling
		groups    []plan.ResolvedGroup
		tasks     []taskView
		completed map[int]time.Time // group index -> completion time recorded in status
		before    time.Time         // status.nextStart as last written
		create    []string
		reason    string
		message   []string
		nextStart time.Time
	}{
		{
			name:   "inside the window: nodes start",
			spec:   v1alpha1.Scheduling{Windows: window("11:00", "13:00")},
			groups: []plan.ResolvedGroup{resolved("a", 2, "n1", "n2")},
			create: []string{"n1", "n2"}, reason: ReasonRunning,
		},
		{
			name:   "outside the window: nothing starts, and the next opening is shown",
			spec:   v1alpha1.Scheduling{Windows: window("22:00", "04:00")},
			groups: []plan.ResolvedGroup{resolved("a", 2, "n1", "n2")},
			reason: ReasonWaitingForWindow, message: []string{"group a is outside its maintenance windows (daily 22:00-04:00 UTC)", "next opens at 2026-12-02T22:00:00Z"},
			nextStart: time.Date(2026, 12, 2, 22, 0, 0, 0, time.UTC),
		},
		{
			name:   "a window closing on running tasks: they go on, nothing new starts",
			spec:   v1alpha1.Scheduling{Windows: window("22:00", "04:00")},
			groups: []plan.ResolvedGroup{resolved("a", 2, "n1", "n2", "n3")},
			tasks:  []taskView{tv("a", "n1", v1alpha1.TaskRunning), tv("a", "n2", v1alpha1.TaskSucceeded)},
			reason: ReasonWaitingForWindow, message: []string{"1 running tasks go on to their end"},
			nextStart: time.Date(2026, 12, 2, 22, 0, 0, 0, time.UTC),
		},
		{
			name:   "postNodeDelay: a node that succeeded a minute ago still counts",
			spec:   v1alpha1.Scheduling{PostNodeDelay: d(5 * time.Minute)},
			groups: []plan.ResolvedGroup{resolved("a", 1, "n1", "n2")},
			tasks:  []taskView{succeededAt("a", "n1", now.Add(-time.Minute))},
			reason: ReasonWaitingForDelay, message: []string{"postNodeDelay 5m0s", "next node at 2026-12-02T12:04:00Z"},
			nextStart: now.Add(4 * time.Minute),
		},
		{
			name:   "postNodeDelay: the soak is over",
			spec:   v1alpha1.Scheduling{PostNodeDelay: d(5 * time.Minute)},
			groups: []plan.ResolvedGroup{resolved("a", 1, "n1", "n2")},
			tasks:  []taskView{succeededAt("a", "n1", now.Add(-5*time.Minute))},
			create: []string{"n2"}, reason: ReasonRunning,
		},
		{
			name:   "postNodeDelay: room left under maxUnavailable is used",
			spec:   v1alpha1.Scheduling{PostNodeDelay: d(5 * time.Minute)},
			groups: []plan.ResolvedGroup{resolved("a", 2, "n1", "n2", "n3")},
			tasks:  []taskView{succeededAt("a", "n1", now.Add(-time.Minute))},
			create: []string{"n2"}, reason: ReasonRunning,
		},
		{
			name:      "postGroupDelay: the next group waits after the one before succeeded",
			spec:      v1alpha1.Scheduling{PostGroupDelay: d(10 * time.Minute)},
			groups:    []plan.ResolvedGroup{resolved("a", 1, "n1"), resolved("b", 1, "n2")},
			tasks:     []taskView{succeededAt("a", "n1", now.Add(-2*time.Minute))},
			completed: map[int]time.Time{0: now.Add(-2 * time.Minute)},
			reason:    ReasonWaitingForDelay, message: []string{"group b waits 10m0s after group a succeeded (postGroupDelay): starts at 2026-12-02T12:08:00Z"},
			nextStart: now.Add(8 * time.Minute),
		},
		{
			name:   "the window opened: the nextStart written while waiting goes",
			spec:   v1alpha1.Scheduling{Windows: window("11:00", "13:00")},
			groups: []plan.ResolvedGroup{resolved("a", 1, "n1")},
			before: now.Add(-time.Hour),
			create: []string{"n1"}, reason: ReasonRunning,
		},
		{
			name:   "a soak beside a running node: the nextStart of an earlier wait goes",
			spec:   v1alpha1.Scheduling{Windows: window("11:00", "13:00"), PostNodeDelay: d(5 * time.Minute)},
			groups: []plan.ResolvedGroup{resolved("a", 2, "n1", "n2", "n3")},
			tasks:  []taskView{succeededAt("a", "n1", now.Add(-time.Minute)), tv("a", "n2", v1alpha1.TaskRunning)},
			before: now.Add(-time.Hour),
			reason: ReasonRunning,
		},
		{
			name:      "postNodeDelay holds the next group's first node too",
			spec:      v1alpha1.Scheduling{PostNodeDelay: d(5 * time.Minute)},
			groups:    []plan.ResolvedGroup{resolved("a", 1, "n1"), resolved("b", 1, "n2")},
			tasks:     []taskView{succeededAt("a", "n1", now.Add(-2*time.Minute))},
			completed: map[int]time.Time{0: now.Add(-2 * time.Minute)},
			reason:    ReasonWaitingForDelay, message: []string{"group b waits 5m0s after group a succeeded (postNodeDelay of its last node)"},
			nextStart: now.Add(3 * time.Minute),
		},
		{
			name:   "a soak ending within a second is rounded up, as status stores it",
			spec:   v1alpha1.Scheduling{PostNodeDelay: d(5 * time.Minute)},
			groups: []plan.ResolvedGroup{resolved("a", 1, "n1", "n2")},
			tasks:  []taskView{succeededAt("a", "n1", now.Add(-time.Minute+123456*time.Microsecond))},
			reason: ReasonWaitingForDelay, nextStart: now.Add(4*time.Minute + time.Second),
		},
		{
			name:      "postGroupDelay over: the next group starts",
			spec:      v1alpha1.Scheduling{PostGroupDelay: d(10 * time.Minute)},
			groups:    []plan.ResolvedGroup{resolved("a", 1, "n1"), resolved("b", 1, "n2")},
			tasks:     []taskView{succeededAt("a", "n1", now.Add(-11*time.Minute))},
			completed: map[int]time.Time{0: now.Add(-11 * time.Minute)},
			create:    []string{"n2"}, reason: ReasonRunning,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			op := &v1alpha1.NodeOperation{}
			op.Name = "op"
			op.Spec.Scheduling = tc.spec
			for i, g := range tc.groups {
				gs := v1alpha1.GroupStatus{Name: g.Name, Phase: v1alpha1.GroupPending}
				if at, ok := tc.completed[i]; ok {
					gs.Phase, gs.CompletionTime = v1alpha1.GroupSucceeded, &metav1.Time{Time: at}
				}
				op.Status.Groups = append(op.Status.Groups, gs)
			}
			if !tc.before.IsZero() {
				op.Status.NextStart = &metav1.Time{Time: tc.before}
			}
			timing, err := timings(op, tc.groups)
			if err != nil {
				t.Fatal(err)
			}
			in := &input{op: op, groups: tc.groups, timing: timing, tasks: map[string]map[string]taskView{}, notReady: map[string]bool{},
				cordoned: map[string]bool{}, locks: nodelock.New().Snapshot(), now: metav1.NewTime(now)}
			for _, v := range tc.tasks {
				if in.tasks[v.Group] == nil {
					in.tasks[v.Group] = map[string]taskView{}
				}
				in.tasks[v.Group][v.Node] = v
			}
			got := decide(in)
			var create []string
			for _, s := range got.create {
				create = append(create, s.node)
			}
			if !slices.Equal(create, tc.create) {
				t.Errorf("create = %v, want %v", create, tc.create)
			}
			c := meta.FindStatusCondition(got.status.Conditions, v1alpha1.ConditionProgressing)
			if c == nil || c.Reason != tc.reason {
				t.Fatalf("Progressing = %+v, want reason %s", c, tc.reason)
			}
			for _, m := range tc.message {
				if !strings.Contains(c.Message, m) {
					t.Errorf("message %q lacks %q", c.Message, m)
				}
			}
			var next time.Time
			if got.status.NextStart != nil {
				next = got.status.NextStart.Time
			}
			if !next.Equal(tc.nextStart) || !tc.nextStart.IsZero() && !got.recheck.Equal(tc.nextStart) {
				t.Errorf("nextStart = %v, recheck = %v, want %v", next, got.recheck, tc.nextStart)
			}
			if got.status.Phase != v1alpha1.OperationRunning {
				t.Errorf("phase = %s, want Running", got.status.Phase)
			}
		})
	}
}

// TestGroupCompletionTimeIsRecordedOnce: postGroupDelay counts from the moment a group succeeded.
func TestGroupCompletionTimeIsRecordedOnce(t *testing.T) {
	first := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	op := &v1alpha1.NodeOperation{}
	op.Name = "op"
	groups := []plan.ResolvedGroup{resolved("a", 1, "n1"), resolved("b", 1, "n2")}
	in := &input{op: op, groups: groups, tasks: map[string]map[string]taskView{"a": {"n1": tv("a", "n1", v1alpha1.TaskSucceeded)}},
		notReady: map[string]bool{}, cordoned: map[string]bool{}, locks: nodelock.New().Snapshot(), now: metav1.NewTime(first)}
	got := decide(in)
	if ct := got.status.Groups[0].CompletionTime; ct == nil || !ct.Time.Equal(first) {
		t.Fatalf("group a completionTime = %v, want %v", ct, first)
	}
	op.Status = got.status
	in.now = metav1.NewTime(first.Add(time.Hour))
	again := decide(in)
	if ct := again.status.Groups[0].CompletionTime; ct == nil || !ct.Time.Equal(first) {
		t.Errorf("group a completionTime moved to %v, want %v", ct, first)
	}
}

// TestWindowHoldNeverHidesAFailedHolder: a group outside its window whose node another owner's
// failed task holds is Blocked, naming the holder, so a person is told before the window opens.
func TestWindowHoldNeverHidesAFailedHolder(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	op := &v1alpha1.NodeOperation{}
	op.Name = "op"
	op.Spec.Windows = []v1alpha1.MaintenanceWindow{{Start: "22:00", End: "04:00"}}
	groups := []plan.ResolvedGroup{resolved("a", 1, "n1")}
	timing, err := timings(op, groups)
	if err != nil {
		t.Fatal(err)
	}
	in := &input{op: op, groups: groups, timing: timing, tasks: map[string]map[string]taskView{}, notReady: map[string]bool{},
		cordoned: map[string]bool{}, now: metav1.NewTime(now),
		locks:   nodelock.View{Nodes: map[string]nodelock.Holder{"n1": {Task: "wasm-n1", Owner: "NodeProfile/wasm"}}},
		holders: map[string]taskView{"wasm-n1": {Name: "wasm-n1", Node: "n1", Phase: v1alpha1.TaskFailed, FailedCommand: "install"}}}
	d := decide(in)
	c := meta.FindStatusCondition(d.status.Conditions, v1alpha1.ConditionBlocked)
	if d.status.Phase != v1alpha1.OperationBlocked || c == nil || c.Reason != v1alpha1.ReasonNodeHeldByFailedTask || !strings.Contains(c.Message, "wasm-n1") {
		t.Fatalf("phase %s, Blocked %+v; want Blocked by NodeTask wasm-n1 even outside the window", d.status.Phase, c)
	}
	if len(d.create) != 0 {
		t.Errorf("created %v outside the window", d.create)
	}
}

// TestDecidePauseBefore: a pauseBefore node about to start pauses the operation, naming it, and
// starts nothing; once a person has resumed it (spec.resumedBefore) it starts like any other.
func TestDecidePauseBefore(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		resumed []string
		tasks   []taskView
		create  []string
		phase   v1alpha1.OperationPhase
		paused  string
	}{
		{name: "a node before the named one starts", create: []string{"n1"}, phase: v1alpha1.OperationRunning},
		{name: "the named node is next: paused", tasks: []taskView{tv("a", "n1", v1alpha1.TaskSucceeded)}, phase: v1alpha1.OperationPaused, paused: "n2"},
		{name: "a running node goes on while paused", tasks: []taskView{tv("a", "n1", v1alpha1.TaskRunning)}, phase: v1alpha1.OperationRunning},
		{name: "resumed: the named node starts", resumed: []string{"n2"}, tasks: []taskView{tv("a", "n1", v1alpha1.TaskSucceeded)}, create: []string{"n2"}, phase: v1alpha1.OperationRunning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			op := &v1alpha1.NodeOperation{}
			op.Name = "op"
			op.Spec.PauseBefore = []string{"n2"}
			op.Spec.ResumedBefore = tc.resumed
			groups := []plan.ResolvedGroup{resolved("a", 1, "n1", "n2", "n3")}
			timing, err := timings(op, groups)
			if err != nil {
				t.Fatal(err)
			}
			in := &input{op: op, groups: groups, timing: timing, tasks: map[string]map[string]taskView{"a": {}}, notReady: map[string]bool{},
				cordoned: map[string]bool{}, locks: nodelock.New().Snapshot(), now: metav1.NewTime(now)}
			for _, v := range tc.tasks {
				in.tasks["a"][v.Node] = v
			}
			got := decide(in)
			var create []string
			for _, s := range got.create {
				create = append(create, s.node)
			}
			if !slices.Equal(create, tc.create) || got.status.Phase != tc.phase || got.status.PausedBefore != tc.paused {
				t.Fatalf("create %v, phase %s, pausedBefore %q; want %v, %s, %q", create, got.status.Phase, got.status.PausedBefore, tc.create, tc.phase, tc.paused)
			}
			if c := meta.FindStatusCondition(got.status.Conditions, v1alpha1.ConditionProgressing); tc.paused != "" && (c == nil || c.Reason != ReasonPausedBeforeNode || !strings.Contains(c.Message, "paused before node n2")) {
				t.Errorf("Progressing = %+v, want %s naming n2", c, ReasonPausedBeforeNode)
			}
		})
	}
}
