package nodeprofile

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
)

const h = "hhhhhhhhhh" // the current spec hash in these tests

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func member(name string) NodeView { return NodeView{Name: name, Member: true, Ready: true} }
func other(name string) NodeView  { return NodeView{Name: name, Ready: true} }
func provisioned(n NodeView, hash string) NodeView {
	n.Labelled, n.Installed, n.Hash = true, true, hash
	return n
}

func task(node string, a Action, hash string, phase v1alpha1.TaskPhase) TaskView {
	return TaskView{Name: TaskName("p", a, hash, node), Node: node, Action: a, Hash: hash, Phase: phase, Created: t0}
}

func aborted(t TaskView) TaskView { t.Abort = true; return t }
func failed(t TaskView, msg string) TaskView {
	t.Failure = msg
	return t
}
func created(t TaskView, at time.Time) TaskView { t.Created = at; return t }

func mu(v int) *intstr.IntOrString { x := intstr.FromInt32(int32(v)); return &x }

func TestDecideNode(t *testing.T) {
	install, uninstall := ActionInstall, ActionUninstall
	tests := []struct {
		name         string
		node         NodeView
		tasks        []TaskView
		noUninstall  bool
		wantState    NodeState // StateIdle: not listed
		wantStart    Action    // "" for none
		wantDelete   []string  // in the start
		wantPatch    *NodePatch
		wantAbort    []string
		wantBusy     bool
		wantMessage  string
		wantDeletion []string // decision.Delete
		wantExpire   time.Duration
		ttl          int32 // spec.ttlSecondsAfterFinished when not 0
		now          time.Time
	}{
		{name: "new member waits for install", node: member("a"), wantState: StateWaitingInstall, wantStart: install},
		{name: "install pending", node: member("a"), tasks: []TaskView{task("a", install, h, "")}, wantState: StateInstalling, wantBusy: true},
		{name: "install running", node: member("a"), tasks: []TaskView{task("a", install, h, v1alpha1.TaskRunning)}, wantState: StateInstalling, wantBusy: true},
		{name: "install failed: no label, named", node: member("a"), tasks: []TaskView{failed(task("a", install, h, v1alpha1.TaskFailed), "command shim failed: sha256 mismatch")},
			wantState: StateInstallFailed, wantBusy: true, wantMessage: "command shim failed: sha256 mismatch"},
		{name: "install aborted by a person counts as failed", node: member("a"), tasks: []TaskView{aborted(task("a", install, h, ""))},
			wantState: StateInstallFailed, wantBusy: true, wantMessage: "task " + TaskName("p", install, h, "a") + " Aborted"},
		{name: "install succeeded: label now", node: member("a"), tasks: []TaskView{task("a", install, h, v1alpha1.TaskSucceeded)},
			wantState: StateLabelling, wantPatch: &NodePatch{Node: "a", Provisioned: true}},
		{name: "install succeeded and labelled", node: provisioned(member("a"), h), tasks: []TaskView{task("a", install, h, v1alpha1.TaskSucceeded)}, wantState: StateProvisioned},
		{name: "labelled without a task (kept from before)", node: provisioned(member("a"), h), wantState: StateProvisioned},
		{name: "labelled at an old hash: re-provision", node: provisioned(member("a"), "old"), tasks: []TaskView{task("a", install, "old", v1alpha1.TaskSucceeded)},
			wantState: StateWaitingInstall, wantStart: install},
		{name: "labelled at old hash, no task", node: provisioned(member("a"), "old"), wantState: StateWaitingInstall, wantStart: install},
		{name: "old install failed: superseded by the spec change", node: member("a"), tasks: []TaskView{task("a", install, "old", v1alpha1.TaskFailed)},
			wantState: StateWaitingInstall, wantAbort: []string{TaskName("p", install, "old", "a")}, wantBusy: true},
		{name: "old install aborted: start the new one", node: member("a"), tasks: []TaskView{aborted(task("a", install, "old", v1alpha1.TaskFailed))},
			wantState: StateWaitingInstall, wantStart: install},
		{name: "old install running with abort: wait", node: member("a"), tasks: []TaskView{aborted(task("a", install, "old", v1alpha1.TaskRunning))},
			wantState: StateWaitingInstall, wantBusy: true},
		{name: "re-entering after uninstall: label goes first", node: provisioned(member("a"), h), tasks: []TaskView{task("a", uninstall, h, v1alpha1.TaskSucceeded)},
			wantState: StateWaitingInstall, wantPatch: &NodePatch{Node: "a"}},
		{name: "re-entering after uninstall, unlabelled: install", node: member("a"), tasks: []TaskView{task("a", uninstall, h, v1alpha1.TaskSucceeded)},
			wantState: StateWaitingInstall, wantStart: install},
		{name: "re-entering during uninstall: abort it", node: provisioned(member("a"), h), tasks: []TaskView{task("a", uninstall, h, v1alpha1.TaskRunning)},
			wantState: StateWaitingInstall, wantAbort: []string{TaskName("p", uninstall, h, "a")}, wantBusy: true},
		{name: "NotReady member waits and counts", node: NodeView{Name: "a", Member: true}, wantState: StateWaitingInstall, wantBusy: true},
		{name: "NotReady provisioned member counts too", node: NodeView{Name: "a", Member: true, Labelled: true, Hash: h}, wantState: StateProvisioned, wantBusy: true},
		{name: "NotReady node outside the profile does not count", node: NodeView{Name: "a"}},

		{name: "never a member", node: other("a")},
		{name: "leaving provisioned node: uninstall", node: provisioned(other("a"), h), tasks: []TaskView{task("a", install, h, v1alpha1.TaskSucceeded)},
			wantState: StateWaitingUninstall, wantStart: uninstall},
		{name: "leaving, labelled, no task", node: provisioned(other("a"), "old"), wantState: StateWaitingUninstall, wantStart: uninstall},
		{name: "leaving mid-install: abort, then uninstall", node: other("a"), tasks: []TaskView{task("a", install, h, v1alpha1.TaskRunning)},
			wantState: StateWaitingUninstall, wantAbort: []string{TaskName("p", install, h, "a")}, wantBusy: true},
		{name: "leaving after a failed install: clean up", node: other("a"), tasks: []TaskView{aborted(task("a", install, h, v1alpha1.TaskFailed))},
			wantState: StateWaitingUninstall, wantStart: uninstall},
		{name: "uninstalling", node: provisioned(other("a"), h), tasks: []TaskView{task("a", uninstall, h, v1alpha1.TaskRunning)}, wantState: StateUninstalling, wantBusy: true},
		{name: "uninstall failed keeps the label", node: provisioned(other("a"), h), tasks: []TaskView{failed(task("a", uninstall, h, v1alpha1.TaskFailed), "boom")},
			wantState: StateUninstallFailed, wantBusy: true, wantMessage: "boom"},
		{name: "uninstall succeeded: label goes", node: provisioned(other("a"), h), tasks: []TaskView{task("a", uninstall, h, v1alpha1.TaskSucceeded)},
			wantState: StateUnlabelling, wantPatch: &NodePatch{Node: "a"}},
		{name: "uninstalled and unlabelled: idle, task kept", node: other("a"), tasks: []TaskView{task("a", uninstall, h, v1alpha1.TaskSucceeded)}},
		{name: "uninstalled at an older hash: done", node: other("a"), tasks: []TaskView{task("a", uninstall, "old", v1alpha1.TaskSucceeded)}},
		{name: "old uninstall failed, spec fixed: abort it", node: provisioned(other("a"), h), tasks: []TaskView{task("a", uninstall, "old", v1alpha1.TaskFailed)},
			wantState: StateWaitingUninstall, wantAbort: []string{TaskName("p", uninstall, "old", "a")}, wantBusy: true},
		{name: "old uninstall aborted after failing: run the new one", node: other("a"), tasks: []TaskView{aborted(task("a", uninstall, "old", v1alpha1.TaskFailed))},
			wantState: StateWaitingUninstall, wantStart: uninstall},
		{name: "no uninstall commands: just unlabel", node: provisioned(other("a"), h), tasks: []TaskView{task("a", install, h, v1alpha1.TaskSucceeded)}, noUninstall: true,
			wantState: StateUnlabelling, wantPatch: &NodePatch{Node: "a"}},
		// Superseded tasks are history (nothing deleted automatically, rule 7): kept without a TTL, deleted once it passed.
		{name: "older finished tasks are kept without a TTL", node: provisioned(member("a"), h),
			tasks: []TaskView{
				created(task("a", install, "old", v1alpha1.TaskSucceeded), t0),
				created(task("a", uninstall, "old", v1alpha1.TaskSucceeded), t0.Add(time.Second)),
				created(task("a", install, h, v1alpha1.TaskSucceeded), t0.Add(2*time.Second)),
			},
			wantState: StateProvisioned},
		{name: "older finished tasks go once their TTL passed, the latest kept", node: provisioned(member("a"), h), ttl: 60, now: t0.Add(60500 * time.Millisecond),
			tasks: []TaskView{
				created(task("a", install, "old", v1alpha1.TaskSucceeded), t0),
				created(task("a", uninstall, "old", v1alpha1.TaskSucceeded), t0.Add(time.Second)),
				created(task("a", install, h, v1alpha1.TaskSucceeded), t0.Add(2*time.Second)),
			},
			wantState: StateProvisioned, wantDeletion: []string{TaskName("p", install, "old", "a")}, wantExpire: 500 * time.Millisecond},
		{name: "re-entering at the same spec: the old install's name is needed again", node: member("a"),
			tasks: []TaskView{
				created(task("a", install, h, v1alpha1.TaskSucceeded), t0),
				created(task("a", uninstall, h, v1alpha1.TaskSucceeded), t0.Add(time.Second)),
			},
			wantState: StateWaitingInstall, wantStart: install, wantDelete: []string{TaskName("p", install, h, "a")}},
		{name: "cordoned member waits and counts", node: NodeView{Name: "a", Member: true, Ready: true, Cordoned: true},
			wantState: StateWaitingInstall, wantBusy: true},
		// Deleting history by hand never makes anything run again (rule 7): a node installed at this
		// spec whose task was deleted is labelled, not installed again, when provisionedLabels changed.
		{name: "installed at this hash, no task, provisionedLabels changed: label only", node: NodeView{Name: "a", Member: true, Ready: true, Installed: true, Hash: h},
			wantState: StateLabelling, wantPatch: &NodePatch{Node: "a", Provisioned: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := input{Hash: h, HasUninstall: !tt.noUninstall, MaxUnavailable: mu(1), Nodes: []NodeView{tt.node}, Tasks: tt.tasks, Now: tt.now}
			if tt.ttl != 0 {
				in.TTL = &tt.ttl
			}
			d, err := decide(in)
			if err != nil {
				t.Fatal(err)
			}
			state := StateIdle
			var msg string
			if len(d.Nodes) == 1 {
				state, msg = d.Nodes[0].State, d.Nodes[0].Message
			}
			if tt.wantState == "" {
				tt.wantState = StateIdle
			}
			if state != tt.wantState {
				t.Errorf("state = %s, want %s", state, tt.wantState)
			}
			if msg != tt.wantMessage {
				t.Errorf("message = %q, want %q", msg, tt.wantMessage)
			}
			var start Action
			var del []string
			if len(d.Starts) == 1 {
				start, del = d.Starts[0].Action, d.Starts[0].Delete
			}
			if start != tt.wantStart || !reflect.DeepEqual(del, tt.wantDelete) {
				t.Errorf("start = %q deleting %v, want %q deleting %v", start, del, tt.wantStart, tt.wantDelete)
			}
			var patch *NodePatch
			if len(d.Patches) == 1 {
				patch = &d.Patches[0]
			}
			if !reflect.DeepEqual(patch, tt.wantPatch) {
				t.Errorf("patch = %+v, want %+v", patch, tt.wantPatch)
			}
			if !reflect.DeepEqual(d.Abort, tt.wantAbort) {
				t.Errorf("abort = %v, want %v", d.Abort, tt.wantAbort)
			}
			if !reflect.DeepEqual(d.Delete, tt.wantDeletion) {
				t.Errorf("delete = %v, want %v", d.Delete, tt.wantDeletion)
			}
			if d.Expire != tt.wantExpire {
				t.Errorf("expire in %v, want %v", d.Expire, tt.wantExpire)
			}
			if busy := d.Room == 0; busy != tt.wantBusy {
				t.Errorf("room = %d: busy %v, want busy %v", d.Room, busy, tt.wantBusy)
			}
			if d.Done != (state == StateIdle && len(d.Abort) == 0) {
				t.Errorf("done = %v with state %s", d.Done, state)
			}
		})
	}
}

func TestDecideMaxUnavailable(t *testing.T) {
	nodes := func(n int) []NodeView {
		var out []NodeView
		for i := n - 1; i >= 0; i-- { // unsorted on purpose
			out = append(out, member(fmt.Sprintf("n%03d", i)))
		}
		return out
	}
	tests := []struct {
		name     string
		nodes    []NodeView
		tasks    []TaskView
		max      *intstr.IntOrString
		wantRoom int
		first    string
	}{
		{name: "default one", nodes: nodes(5), wantRoom: 1, first: "n000"},
		{name: "two", nodes: nodes(5), max: mu(2), wantRoom: 2, first: "n000"},
		{name: "running counts", nodes: nodes(5), max: mu(2), tasks: []TaskView{task("n000", ActionInstall, h, v1alpha1.TaskRunning)}, wantRoom: 1, first: "n001"},
		{name: "failed counts", nodes: nodes(5), max: mu(2), tasks: []TaskView{task("n003", ActionInstall, h, v1alpha1.TaskFailed), task("n004", ActionInstall, h, "")}, wantRoom: 0, first: "n000"},
		{name: "succeeded does not count", nodes: nodes(5), max: mu(2), tasks: []TaskView{task("n000", ActionInstall, h, v1alpha1.TaskSucceeded)}, wantRoom: 2, first: "n001"},
		{name: "percent of 200", nodes: nodes(200), max: func() *intstr.IntOrString { x := intstr.FromString("10%"); return &x }(), wantRoom: 20, first: "n000"},
		{name: "small percent is at least one", nodes: nodes(5), max: func() *intstr.IntOrString { x := intstr.FromString("1%"); return &x }(), wantRoom: 1, first: "n000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := decide(input{Hash: h, HasUninstall: true, MaxUnavailable: tt.max, Nodes: tt.nodes, Tasks: tt.tasks})
			if err != nil {
				t.Fatal(err)
			}
			if d.Room != tt.wantRoom {
				t.Errorf("room = %d, want %d", d.Room, tt.wantRoom)
			}
			if len(d.Starts) == 0 || d.Starts[0].Node != tt.first {
				t.Fatalf("starts = %+v, want first %s", d.Starts, tt.first)
			}
			if !sort.SliceIsSorted(d.Starts, func(i, j int) bool { return d.Starts[i].Node < d.Starts[j].Node }) {
				t.Errorf("starts not in sorted order")
			}
		})
	}
}

func TestDecideDeletedNodeForgotten(t *testing.T) {
	d, err := decide(input{Hash: h, HasUninstall: true, Nodes: []NodeView{provisioned(member("a"), h)},
		Tasks: []TaskView{task("a", ActionInstall, h, v1alpha1.TaskSucceeded), task("gone", ActionInstall, h, v1alpha1.TaskRunning)}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{TaskName("p", ActionInstall, h, "gone")}; !reflect.DeepEqual(d.Delete, want) {
		t.Errorf("delete = %v, want %v", d.Delete, want)
	}
	if d.Room != 1 || d.Counts != (v1alpha1.ProfileNodeCounts{Matched: 1, Provisioned: 1}) {
		t.Errorf("a deleted node still counts: room %d, counts %+v", d.Room, d.Counts)
	}
}

// TestDecideSimulated plays controller and agents over 200 nodes with autoProvision and random
// completion orders (some failures a person then fixes by deleting the task): at no point do more
// than maxUnavailable nodes hold an unfinished task, and in the end every node is labelled.
func TestDecideSimulated(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			const n, limit = 200, 7
			nodes := make([]NodeView, n)
			for i := range nodes {
				nodes[i] = member(fmt.Sprintf("sim-%03d", i))
			}
			tasks := map[string]*TaskView{}
			for step := 0; ; step++ {
				if step > 10000 {
					t.Fatal("no convergence")
				}
				var list []TaskView
				for _, tv := range tasks {
					list = append(list, *tv)
				}
				d, err := decide(input{Hash: h, HasUninstall: true, MaxUnavailable: mu(limit), Nodes: nodes, Tasks: list})
				if err != nil {
					t.Fatal(err)
				}
				if d.Counts.Provisioned == n {
					return
				}
				for _, st := range d.Starts[:min(d.Room, len(d.Starts))] {
					for _, name := range st.Delete {
						delete(tasks, name)
					}
					tv := task(st.Node, st.Action, h, v1alpha1.TaskPending)
					tasks[tv.Name] = &tv
				}
				for _, p := range d.Patches {
					for i := range nodes {
						if nodes[i].Name == p.Node {
							nodes[i].Labelled, nodes[i].Hash = p.Provisioned, h
						}
					}
				}
				unfinished := 0
				var live []*TaskView
				for _, tv := range tasks {
					if tv.Phase.Unfinished() {
						unfinished++
						live = append(live, tv)
					}
				}
				if unfinished > limit {
					t.Fatalf("step %d: %d unfinished tasks, maxUnavailable %d", step, unfinished, limit)
				}
				if len(live) == 0 {
					continue
				}
				sort.Slice(live, func(i, j int) bool { return live[i].Name < live[j].Name })
				tv := live[rng.IntN(len(live))]
				switch r := rng.IntN(10); {
				case tv.Phase == v1alpha1.TaskFailed:
					delete(tasks, tv.Name) // a person deletes the failed task to try again
				case tv.Phase == v1alpha1.TaskPending:
					tv.Phase = v1alpha1.TaskRunning
				case r == 0:
					tv.Phase = v1alpha1.TaskFailed
				default:
					tv.Phase = v1alpha1.TaskSucceeded
				}
			}
		})
	}
}

func TestChooseStarts(t *testing.T) {
	p := &v1alpha1.NodeProfile{}
	p.Name = "p"
	nodes := []NodeView{member("n1"), member("n2"), member("n3"), member("n4")}
	other := func(node string) nodelock.Holder {
		return nodelock.Holder{Task: "op-g-" + node, Owner: nodelock.OperationOwner("op")}
	}
	tests := []struct {
		name      string
		max       int
		held      map[string]nodelock.Holder
		unsynced  bool
		want      []string
		wantRetry time.Duration
	}{
		{name: "free, in sorted order", max: 2, want: []string{"n1", "n2"}},
		{name: "held by another owner counts and waits", max: 2, held: map[string]nodelock.Holder{"n1": other("n1")}, want: []string{"n2"}, wantRetry: 5 * time.Second},
		{name: "held late in the order counts too", max: 1, held: map[string]nodelock.Holder{"n4": other("n4")}, wantRetry: 5 * time.Second},
		{name: "held by the profile's own finished task: look again soon", max: 2,
			held: map[string]nodelock.Holder{"n2": {Task: TaskName("p", ActionInstall, "old", "n2"), Owner: nodelock.ProfileOwner("p")}},
			want: []string{"n1"}, wantRetry: lockLag},
		{name: "held by the task it would create", max: 1,
			held: map[string]nodelock.Holder{"n1": {Task: TaskName("p", ActionInstall, h, "n1"), Owner: nodelock.ProfileOwner("p")}},
			want: []string{"n1"}},
		{name: "lock table not synced", max: 4, unsynced: true, wantRetry: lockLag},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := decide(input{Hash: h, HasUninstall: true, MaxUnavailable: mu(tt.max), Nodes: nodes})
			if err != nil {
				t.Fatal(err)
			}
			starts, retry := chooseStarts(p, h, d, nodelock.View{Nodes: tt.held}, !tt.unsynced, 5*time.Second, nil)
			var got []string
			for _, st := range starts {
				got = append(got, st.Node)
			}
			if !reflect.DeepEqual(got, tt.want) || retry != tt.wantRetry {
				t.Errorf("starts %v, retry %v; want %v, %v", got, retry, tt.want, tt.wantRetry)
			}
		})
	}
}

// a failure blocks until a person decides (rule 3): a failed task stops new tasks on other nodes, whatever room
// maxUnavailable leaves, until a person retries or skips it or the node leaves.
func TestDecideFailedTaskBlocks(t *testing.T) {
	nodes := []NodeView{member("n1"), member("n2"), member("n3")}
	failedInstall := task("n1", ActionInstall, h, v1alpha1.TaskFailed)
	d, err := decide(input{Hash: h, HasUninstall: true, MaxUnavailable: mu(3), Nodes: nodes, Tasks: []TaskView{failedInstall}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Room != 0 || len(d.Blocked) != 1 || d.Blocked[0].Node != "n1" {
		t.Errorf("room %d, blocked %+v; want 0 and n1", d.Room, d.Blocked)
	}
	// Leaving supersedes the failed task: it is aborted, and the profile goes on.
	nodes[0] = other("n1")
	d, _ = decide(input{Hash: h, HasUninstall: true, MaxUnavailable: mu(3), Nodes: nodes, Tasks: []TaskView{failedInstall}})
	if len(d.Blocked) != 0 || !reflect.DeepEqual(d.Abort, []string{failedInstall.Name}) {
		t.Errorf("after leaving: blocked %+v, abort %v", d.Blocked, d.Abort)
	}
	// A task aborted by a person is not a failed command: it counts, and blocks nothing.
	nodes[0] = member("n1")
	d, _ = decide(input{Hash: h, HasUninstall: true, MaxUnavailable: mu(3), Nodes: nodes, Tasks: []TaskView{aborted(failedInstall)}})
	if len(d.Blocked) != 0 || d.Room != 2 {
		t.Errorf("aborted: blocked %+v, room %d; want none, 2", d.Blocked, d.Room)
	}
}

// Nothing deleted automatically (rule 7): a task someone deleted is released only once the node
// no longer rests on it.
func TestReleasable(t *testing.T) {
	install, uninstall := ActionInstall, ActionUninstall
	tests := []struct {
		name   string
		node   NodeView
		task   TaskView
		latest bool
		want   bool
	}{
		{"install succeeded, node not labelled yet: kept", member("a"), task("a", install, h, v1alpha1.TaskSucceeded), true, false},
		{"install succeeded, node labelled at its hash: released", provisioned(member("a"), h), task("a", install, h, v1alpha1.TaskSucceeded), true, true},
		{"install succeeded, node labelled at another hash: kept", provisioned(member("a"), "old"), task("a", install, h, v1alpha1.TaskSucceeded), true, false},
		{"install succeeded, labelled, provisionedLabels missing: released", NodeView{Name: "a", Member: true, Installed: true, Hash: h}, task("a", install, h, v1alpha1.TaskSucceeded), true, true},
		{"install running: kept until it ends", member("a"), task("a", install, h, v1alpha1.TaskRunning), true, false},
		{"install pending: kept", member("a"), task("a", install, h, ""), true, false},
		{"install failed: released (a fresh try)", member("a"), task("a", install, h, v1alpha1.TaskFailed), true, true},
		{"install aborted before it ran: released", member("a"), aborted(task("a", install, h, "")), true, true},
		{"uninstall succeeded, node still labelled: kept", provisioned(other("a"), h), task("a", uninstall, h, v1alpha1.TaskSucceeded), true, false},
		{"uninstall succeeded, hash annotation left: kept", NodeView{Name: "a", Hash: h}, task("a", uninstall, h, v1alpha1.TaskSucceeded), true, false},
		{"uninstall succeeded, node unlabelled: released", other("a"), task("a", uninstall, h, v1alpha1.TaskSucceeded), true, true},
		{"older task, finished: history, released", member("a"), task("a", install, "old", v1alpha1.TaskSucceeded), false, true},
		{"older task, still running: kept", member("a"), task("a", install, "old", v1alpha1.TaskRunning), false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := releasable(&tt.node, &tt.task, tt.latest); got != tt.want {
				t.Errorf("releasable = %v, want %v", got, tt.want)
			}
		})
	}
}

// decide lists for release only tasks someone deleted that carry the finalizer.
func TestDecideReleasesOnlyDeletedKeptTasks(t *testing.T) {
	deleted := func(t TaskView, kept bool) TaskView { t.Deleting, t.Kept = true, kept; return t }
	in := input{Hash: h, HasUninstall: true, MaxUnavailable: mu(1), Nodes: []NodeView{provisioned(member("a"), h), member("b"), provisioned(member("c"), h)},
		Tasks: []TaskView{
			deleted(task("a", ActionInstall, h, v1alpha1.TaskSucceeded), true),
			deleted(task("b", ActionInstall, h, v1alpha1.TaskSucceeded), true),
			task("c", ActionInstall, h, v1alpha1.TaskSucceeded),
		}}
	d, err := decide(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{TaskName("p", ActionInstall, h, "a")}; !reflect.DeepEqual(d.Release, want) {
		t.Errorf("release = %v, want %v (b is not labelled yet; c was not deleted)", d.Release, want)
	}
	if len(d.Starts) != 0 {
		t.Errorf("starts = %+v; want none while b's deleted install is its record", d.Starts)
	}
}

// decide keeps (RecordFinalizer added) only a node's latest task that lacks the finalizer and that
// the node's state still rests on: a task made by an older nodeops.
func TestDecideKeepsOnlyUnrecordedLatestTasksWithoutTheFinalizer(t *testing.T) {
	kept := func(t TaskView) TaskView { t.Kept = true; return t }
	older := task("a", ActionInstall, "old", v1alpha1.TaskSucceeded)
	older.Created = older.Created.Add(-time.Minute)
	in := input{Hash: h, HasUninstall: true, MaxUnavailable: mu(3), Nodes: []NodeView{
		member("a"), member("b"), provisioned(member("c"), h), member("d"), member("e"),
	}, Tasks: []TaskView{
		older, // history: deleting it loses nothing
		task("a", ActionInstall, h, v1alpha1.TaskRunning),   // a's record until it is labelled
		task("b", ActionInstall, h, v1alpha1.TaskSucceeded), // succeeded, not labelled yet
		task("c", ActionInstall, h, v1alpha1.TaskSucceeded), // the label records it
		task("d", ActionInstall, h, v1alpha1.TaskFailed),    // deleting it asks for a fresh try
		kept(task("e", ActionInstall, h, v1alpha1.TaskRunning)),
	}}
	d, err := decide(in)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{TaskName("p", ActionInstall, h, "a"), TaskName("p", ActionInstall, h, "b")}
	if !reflect.DeepEqual(d.Keep, want) {
		t.Errorf("keep = %v, want %v", d.Keep, want)
	}
}
