package nodeprofile

import (
	"fmt"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/plan"
)

// NodeView is what decide needs to know about one node.
type NodeView struct {
	Name string
	// Member: the node is in the profile now (false for every node while the profile is deleted).
	Member bool
	Ready  bool
	// Cordoned: spec.unschedulable is set, by whoever.
	Cordoned bool
	// Labelled: the node carries nodeops.io/profile.<name>=provisioned and the profile's provisionedLabels.
	Labelled bool
	// Installed: the node carries nodeops.io/profile.<name>=provisioned, whatever its provisionedLabels.
	Installed bool
	// Hash is the node's nodeops.io/profile-hash.<name> annotation, "" when absent.
	Hash string
}

// TaskView is what decide needs to know about one of the profile's tasks.
type TaskView struct {
	Name    string
	Node    string
	Action  Action
	Hash    string
	Phase   v1alpha1.TaskPhase
	Abort   bool
	Created time.Time
	// Completed is when the task finished; zero when it did not, or did not say.
	Completed time.Time
	// Failure explains a failed or aborted task: the failed command and its message.
	Failure string
	// Deleting: someone deleted the task; Kept: it carries RecordFinalizer, so it stays until
	// decide releases it.
	Deleting, Kept bool
}

// effectivePhase is the task's phase as far as the profile is concerned: an unfinished task asked
// to abort that is not running holds nothing any more (nodelock.Holds; one task per node, rule 1) and counts as aborted.
func (t *TaskView) effectivePhase() v1alpha1.TaskPhase {
	p := t.Phase
	if p == "" {
		p = v1alpha1.TaskPending
	}
	if t.Abort && p.Unfinished() && p != v1alpha1.TaskRunning {
		return v1alpha1.TaskAborted
	}
	return p
}

// input is the world as one reconcile sees it.
type input struct {
	// Hash is the current spec hash.
	Hash string
	// HasUninstall: the spec has uninstall commands; without them leaving only removes the label.
	HasUninstall   bool
	MaxUnavailable *intstr.IntOrString
	// TTL is spec.ttlSecondsAfterFinished: superseded tasks are deleted this long after they
	// finished; nil keeps them.
	TTL   *int32
	Now   time.Time
	Nodes []NodeView
	Tasks []TaskView
}

// NodeState is where one node stands in the profile.
type NodeState string

const (
	// StateIdle: not in the profile and nothing left to undo.
	StateIdle NodeState = "Idle"
	// StateProvisioned: in the profile, installed at the current hash and labelled.
	StateProvisioned NodeState = "Provisioned"
	// StateWaitingInstall: in the profile, install not started yet (maxUnavailable, lock, NotReady, or an older task ending).
	StateWaitingInstall NodeState = "WaitingInstall"
	StateInstalling     NodeState = "Installing"
	// StateLabelling: install succeeded, the label is being set.
	StateLabelling     NodeState = "Labelling"
	StateInstallFailed NodeState = "InstallFailed"
	// StateWaitingUninstall: leaving, uninstall not started yet.
	StateWaitingUninstall NodeState = "WaitingUninstall"
	StateUninstalling     NodeState = "Uninstalling"
	// StateUnlabelling: uninstall succeeded, the label is being removed.
	StateUnlabelling     NodeState = "Unlabelling"
	StateUninstallFailed NodeState = "UninstallFailed"
)

// NodeResult is one node's state, with the task it refers to and, when failed, why.
type NodeResult struct {
	Node    string
	State   NodeState
	Task    string
	Message string
}

// Start is a task the profile wants to create: after deleting Delete, a finished older task of
// the node with the same name (the node left and came back at the same spec), the one case a
// superseded task goes before its TTL, since the name is needed again. First says the node has
// no task of the profile at all: its label is then the only record of what ran there, and the
// label is read from the API server again before the task is created (a cache can show a task's
// deletion before the label its install earned).
type Start struct {
	Node   string
	Action Action
	Delete []string
	First  bool
}

// NodePatch sets (Provisioned) or removes the node's profile label and hash annotation, in one patch.
type NodePatch struct {
	Node        string
	Provisioned bool
}

// decision is what the profile should do now.
type decision struct {
	// Nodes lists every node the profile concerns (not Idle), sorted by name.
	Nodes  []NodeResult
	Counts v1alpha1.ProfileNodeCounts
	// Hashes count the profile's nodes by the spec hash they are provisioned at, current first.
	Hashes []v1alpha1.ProfileHashNodes
	// Starts are the candidates, in sorted node order, Ready ones only; plan.Select chooses among
	// them against Limit and Unavailable, passing over nodes another task holds.
	Starts []Start
	// Limit is maxUnavailable resolved; Unavailable counts the nodes already unavailable: a task
	// holding them, failed, or NotReady (unavailable nodes count against maxUnavailable, rule 2).
	Limit, Unavailable int
	// Room is how many may start when no candidate is held: Limit less Unavailable, at least 0.
	Room int
	// Abort lists unfinished tasks superseded by a spec change or by the node leaving.
	Abort []string
	// Delete lists tasks to delete: those of deleted nodes, and superseded finished ones (older
	// than their node's latest) whose TTL has passed. Without a TTL history is kept
	// (nothing deleted automatically, rule 7).
	Delete []string
	// Release lists the tasks someone deleted that may now go (releasable): RecordFinalizer comes off.
	Release []string
	// Keep lists the nodes' latest tasks that lack RecordFinalizer (made by a nodeops from before
	// it) and that the node's state still rests on (not releasable): it goes on, so that deleting
	// one by hand cannot make its commands run again either.
	Keep []string
	// Expire is how long until the next superseded task's TTL passes; 0 for none.
	Expire time.Duration
	// Blocked names the nodes whose latest task failed: until a person retries or skips it
	// (spec.recoveryMode), or the node leaves, no other node starts (a failure blocks until a person decides, rule 3).
	Blocked []NodeResult
	Patches []NodePatch
	// Done: nothing is left to do or wait for on any node (the finalizer may go).
	Done bool
}

// decide computes, from nodes and tasks alone, each node's state and what to do next. A node's
// latest task says where it stands: a new one is created only after the previous one finished
// (or was aborted); superseded ones are kept until the TTL.
func decide(in input) (decision, error) {
	byNode := map[string][]*TaskView{}
	for i := range in.Tasks {
		t := &in.Tasks[i]
		byNode[t.Node] = append(byNode[t.Node], t)
	}
	var d decision
	exists := make(map[string]bool, len(in.Nodes))
	nodes := append([]NodeView(nil), in.Nodes...)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })

	type pending struct {
		start Start
		ready bool
	}
	var candidates []pending
	busy, relevant := 0, 0
	byHash := map[string]int32{}
	for i := range nodes {
		n := &nodes[i]
		exists[n.Name] = true
		tasks := byNode[n.Name]
		sort.Slice(tasks, func(i, j int) bool {
			if !tasks[i].Created.Equal(tasks[j].Created) {
				return tasks[i].Created.Before(tasks[j].Created)
			}
			return tasks[i].Name < tasks[j].Name
		})
		var last *TaskView
		if len(tasks) > 0 {
			last = tasks[len(tasks)-1]
			// Older tasks are history: kept until their TTL; one still unfinished is asked to stop.
			for _, t := range tasks[:len(tasks)-1] {
				if t.effectivePhase().Unfinished() {
					if !t.Abort {
						d.Abort = append(d.Abort, t.Name)
					}
				} else if left, ok := ttlLeft(in, t); ok && left <= 0 {
					d.Delete = append(d.Delete, t.Name)
				} else if ok && (d.Expire == 0 || left < d.Expire) {
					d.Expire = left
				}
			}
		}
		r, start, patch, abort, holds := decideNode(in, n, last)
		for _, t := range tasks {
			if t.Deleting && t.Kept && releasable(n, t, t == last) {
				d.Release = append(d.Release, t.Name)
			}
		}
		if last != nil && !last.Kept && !last.Deleting && !releasable(n, last, true) {
			d.Keep = append(d.Keep, last.Name)
		}
		if start != nil {
			// The new task's name is taken by an older one only when the node left and came back
			// at the same spec: that one must go first.
			start.Delete = nil
			for _, t := range tasks {
				if t.Action == start.Action && t.Hash == in.Hash && t != last {
					start.Delete = append(start.Delete, t.Name)
				}
			}
		}
		if last != nil && last.effectivePhase() == v1alpha1.TaskFailed && (r.State == StateInstallFailed || r.State == StateUninstallFailed) {
			d.Blocked = append(d.Blocked, r)
		}
		if abort != "" {
			d.Abort = append(d.Abort, abort)
		}
		if patch != nil {
			d.Patches = append(d.Patches, *patch)
		}
		if n.Member {
			d.Counts.Matched++
			if n.Hash != "" {
				byHash[n.Hash]++
				if n.Hash != in.Hash {
					d.Counts.Outdated++
				}
			}
		}
		if r.State == StateIdle {
			continue
		}
		relevant++
		d.Nodes = append(d.Nodes, r)
		switch r.State {
		case StateProvisioned:
			d.Counts.Provisioned++
		case StateInstalling, StateUninstalling, StateLabelling, StateUnlabelling:
			d.Counts.Provisioning++
		case StateInstallFailed, StateUninstallFailed:
			d.Counts.Failed++
		}
		// unavailable nodes count against maxUnavailable (rule 2): failed and running tasks count against maxUnavailable, and so do NotReady
		// nodes of the profile, provisioned ones included (a containerd restart elsewhere would take
		// more capacity away while they are down).
		// budgets are cluster-wide (rule 11): so does a node cordoned by anyone, for any reason.
		if holds || r.State == StateInstallFailed || r.State == StateUninstallFailed || !n.Ready || n.Cordoned {
			busy++
		}
		if start != nil {
			candidates = append(candidates, pending{start: *start, ready: n.Ready && !n.Cordoned})
		}
	}
	d.Hashes = hashCounts(byHash, in.Hash)
	for node, tasks := range byNode {
		if !exists[node] {
			for _, t := range tasks {
				d.Delete = append(d.Delete, t.Name)
			}
		}
	}
	sort.Strings(d.Delete)
	sort.Strings(d.Abort)
	sort.Strings(d.Release)
	sort.Strings(d.Keep)

	limit, err := plan.MaxUnavailable(in.MaxUnavailable, relevant)
	if err != nil {
		return decision{}, fmt.Errorf("spec.maxUnavailable: %w", err)
	}
	d.Limit, d.Unavailable = limit, busy
	d.Room = max(limit-busy, 0)
	if len(d.Blocked) > 0 {
		// a failure blocks until a person decides (rule 3): a failed task stops the profile until a person chooses.
		d.Room = 0
	}
	for _, c := range candidates {
		// A NotReady or cordoned node waits until it is Ready and schedulable again; it already
		// counts against maxUnavailable.
		if c.ready {
			d.Starts = append(d.Starts, c.start)
		}
	}
	d.Done = relevant == 0 && len(d.Abort) == 0
	return d, nil
}

// ttlLeft is how long until the finished task t is due for deletion; ok is false without a TTL.
func ttlLeft(in input, t *TaskView) (time.Duration, bool) {
	if in.TTL == nil {
		return 0, false
	}
	done := t.Completed
	if done.IsZero() {
		done = t.Created
	}
	return done.Add(time.Duration(*in.TTL) * time.Second).Sub(in.Now), true
}

// decideNode decides one existing node given its latest task. It returns the node's state, the
// task to start (nil for none), the label patch (nil for none), a task to abort ("" for none),
// and whether the latest task still holds the node.
func decideNode(in input, n *NodeView, last *TaskView) (r NodeResult, start *Start, patch *NodePatch, abort string, holds bool) {
	r = NodeResult{Node: n.Name, State: StateIdle}
	provisioned := n.Labelled && n.Hash == in.Hash
	marked := n.Labelled || n.Hash != ""
	want := ActionUninstall
	if n.Member {
		want = ActionInstall
	}
	var phase v1alpha1.TaskPhase
	if last != nil {
		r.Task = last.Name
		phase = last.effectivePhase()
		holds = phase.Unfinished()
	}
	waiting, failed, running := StateWaitingUninstall, StateUninstallFailed, StateUninstalling
	if want == ActionInstall {
		waiting, failed, running = StateWaitingInstall, StateInstallFailed, StateInstalling
	}
	supersede := func() *Start {
		return &Start{Node: n.Name, Action: want, First: last == nil}
	}

	switch {
	case last != nil && last.Action == want && last.Hash == in.Hash:
		// The latest task is the one the node needs now.
		switch phase {
		case v1alpha1.TaskSucceeded:
			r.State = leaveOrStay(want, provisioned, marked)
			if r.State == StateLabelling || r.State == StateUnlabelling {
				patch = &NodePatch{Node: n.Name, Provisioned: want == ActionInstall}
			}
		case v1alpha1.TaskFailed, v1alpha1.TaskAborted:
			r.State, r.Message = failed, last.Failure
			if r.Message == "" {
				r.Message = fmt.Sprintf("task %s %s", last.Name, phase)
			}
		default:
			r.State = running
		}
		return r, nil, patch, "", holds
	case last != nil && phase.Unfinished():
		// An older task (another hash, or the other action) still holds the node: ask it to stop
		// and wait for it; a person's fix to the spec or the node leaving supersedes a failed task.
		r.State = waiting
		if !last.Abort {
			abort = last.Name
		}
		return r, nil, nil, abort, holds
	case last != nil && last.Action == ActionUninstall && phase == v1alpha1.TaskSucceeded && marked:
		// An uninstall finished: the label goes first, whatever comes next, so that no pod is
		// scheduled for what is no longer there. A later install starts once the node shows it.
		r.State = waiting
		if want == ActionUninstall {
			r.State = StateUnlabelling
		}
		return r, nil, &NodePatch{Node: n.Name}, "", false
	}

	// Nothing holds the node; the latest task, if any, is finished and not what the node needs.
	if want == ActionInstall {
		if last == nil && provisioned {
			r.State = StateProvisioned
			return r, nil, nil, "", false
		}
		if last == nil && n.Installed && n.Hash == in.Hash {
			// Installed at this spec, its task gone: only the provisionedLabels changed since.
			r.State = StateLabelling
			return r, nil, &NodePatch{Node: n.Name, Provisioned: true}, "", false
		}
		r.State = StateWaitingInstall
		return r, supersede(), nil, "", false
	}
	// Leaving: undo what an install may have done; an uninstall that succeeded (at any hash) is done.
	// An uninstall that did not succeed (aborted after failing) may have left the node half done.
	installed := marked || (last != nil && (last.Action == ActionInstall || phase != v1alpha1.TaskSucceeded))
	if !installed {
		return r, nil, nil, "", false
	}
	if !in.HasUninstall {
		if marked {
			r.State = StateUnlabelling
			return r, nil, &NodePatch{Node: n.Name}, "", false
		}
		return r, nil, nil, "", false
	}
	r.State = StateWaitingUninstall
	return r, supersede(), nil, "", false
}

// releasable reports whether t, a task of node n that someone deleted, may go: once it ended and
// is not what the node's state rests on. The node's latest task is its record until the node
// carries what the task did (an install's label at its hash, an uninstall's label gone); a failed
// or aborted one goes at once (deleting it asks for a fresh try); an older one is history.
func releasable(n *NodeView, t *TaskView, latest bool) bool {
	phase := t.effectivePhase()
	switch {
	case phase == v1alpha1.TaskFailed:
		// Failed holds its node until a person chooses; deleting it is that choice.
		return true
	case phase.Unfinished():
		return false
	case !latest, phase != v1alpha1.TaskSucceeded:
		return true
	case t.Action == ActionInstall:
		return n.Installed && n.Hash == t.Hash
	}
	return !n.Installed && n.Hash == ""
}

// leaveOrStay is the state after the needed task succeeded: labelled as wanted, or being (un)labelled.
func leaveOrStay(want Action, provisioned, marked bool) NodeState {
	if want == ActionInstall {
		if provisioned {
			return StateProvisioned
		}
		return StateLabelling
	}
	if marked {
		return StateUnlabelling
	}
	return StateIdle
}

// maxHashes bounds status.hashes; a profile rolled over more often than that with nodes left at
// each hash shows the current hash and the largest groups.
const maxHashes = 16

// hashCounts lists the nodes per spec hash: current first, then by count and hash.
func hashCounts(byHash map[string]int32, current string) []v1alpha1.ProfileHashNodes {
	out := make([]v1alpha1.ProfileHashNodes, 0, len(byHash))
	for h, n := range byHash {
		out = append(out, v1alpha1.ProfileHashNodes{Hash: h, Nodes: n})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (a.Hash == current) != (b.Hash == current) {
			return a.Hash == current
		}
		if a.Nodes != b.Nodes {
			return a.Nodes > b.Nodes
		}
		return a.Hash < b.Hash
	})
	if len(out) > maxHashes {
		out = out[:maxHashes]
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
