package nodeoperation

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/gate"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/schedule"
)

// Condition reasons of a NodeOperation.
const (
	ReasonRunning         = "Running"
	ReasonWaitingForNode  = "WaitingForNode"
	ReasonAborting        = "Aborting"
	ReasonPaused          = "Paused"
	ReasonTaskFailed      = "TaskFailed"
	ReasonNotBlocked      = "NotBlocked"
	ReasonSucceeded       = "Succeeded"
	ReasonAborted         = "Aborted"
	ReasonInvalidSpec     = "InvalidSpec"
	ReasonNoKubeadmConfig = "KubeadmConfigNotFound"
	// ReasonWaitingForWindow: the current group starts no node until a maintenance window opens.
	ReasonWaitingForWindow = "WaitingForWindow"
	// ReasonWaitingForDelay: the current group soaks (postNodeDelay, postGroupDelay) before its next node.
	ReasonWaitingForDelay = "WaitingForDelay"
	// ReasonWaitingForGate: a gate of the current group does not pass yet, so no new node starts.
	ReasonWaitingForGate = "WaitingForGate"
	// ReasonGateTimedOut: a gate held the current group for its whole timeout; a person retries or skips it.
	ReasonGateTimedOut = "GateTimedOut"
	// ReasonPausedBeforeNode: a node named in pauseBefore would start next; a person resumes.
	ReasonPausedBeforeNode = "PausedBeforeNode"
)

// taskView is what the operation needs to know about one of its tasks.
type taskView struct {
	Name, Node, Group string
	Phase             v1alpha1.TaskPhase
	// Skipped: some command was skipped by a person.
	Skipped bool
	// Failure, for a failed task: the command that failed and why.
	FailedCommand, Message string
	// Recovering: a person set recoveryMode, which the agent has not acted on yet.
	Recovering bool
	// Done is when the task ended, zero when unknown (its record only, the task deleted).
	Done time.Time
	// Created is when the task was made, zero for a reservation the cache has not seen yet.
	Created time.Time
	// Started: the agent has recorded a command of it (or a person's step).
	Started bool
}

// timing is a group's scheduling: its windows and soak delays, the group's own fields over the
// operation's.
type timing struct {
	windows   schedule.Windows
	describe  string
	postNode  time.Duration
	postGroup time.Duration
	gates     []v1alpha1.Gate
	// pauseBefore are the nodes the group pauses before, once each.
	pauseBefore []string
}

// input is everything decide looks at; the controller gathers it from the cache.
type input struct {
	op     *v1alpha1.NodeOperation
	groups []plan.ResolvedGroup
	// tasks by group, then node. Tasks just created that the cache has not seen yet are here as Pending.
	tasks    map[string]map[string]taskView
	notReady map[string]bool
	// cordoned are the nodes whose spec.unschedulable is set.
	cordoned map[string]bool
	// locks is the node lock table's view: nodes held by tasks, this operation's and others'.
	locks nodelock.View
	// holders are the tasks of others holding nodes this operation has still to do, by name, as
	// the cache shows them (a reservation not in the cache yet is Pending).
	holders map[string]taskView
	// timing is each group's scheduling, by index.
	timing []timing
	// gates are the results of the gates checked in this reconcile, by group then gate name; a
	// group absent has not been checked.
	gates map[string]map[string]gate.Result
	// gateRecheck is how soon a gate that holds is checked again.
	gateRecheck time.Duration
	// checks are the operation's own gate checks by name (cmdgate.go): a node one holds is not
	// held by another task, since the check is that node's own gate.
	checks map[string]bool
	// silences, when set, are the silences the operation holds after this reconcile's calls to
	// Alertmanager (silences.go); unset, status.silences stays as it is.
	silences *[]v1alpha1.SilenceStatus
	// fail, when set, ends the operation at once: it was refused before anything ran.
	fail *failure
	// preflightAnswer is how long a node's agent has to start its preflight task before the node
	// is listed as failing it; zero for defaultPreflightAnswer.
	preflightAnswer time.Duration
	now             metav1.Time
}

type failure struct{ reason, message string }

// start is one task to create.
type start struct {
	group *v1alpha1.Group
	node  string
}

// decision is the operation's new status and the tasks to create to get there.
type decision struct {
	status v1alpha1.NodeOperationStatus
	// create are the tasks to create, each after acquiring its node in act.
	create []start
	// waiting are the group's nodes held by another task, with the holder.
	waiting map[string]nodelock.Holder
	// budget is the current group's maxUnavailable over its nodes, which act checks again as it
	// acquires them (nodelock.Table.AcquireWithin).
	budget nodelock.Budget
	// recheck, when set, is when a window opens or a soak ends: look again then.
	recheck time.Time
	// checkGates, when set, names the group whose gates need a check before its nodes start, and
	// checkNode the node about to start, which a command gate without a node of its own runs on.
	checkGates string
	checkNode  string
}

// decide computes the operation's status from its tasks, nodes and the lock table's view, and
// which nodes start now; it takes no locks. Groups run strictly in order: a group starts only
// when the one before it succeeded. A group the status already records as Succeeded is never
// revisited, so nodes that join later do not reopen it.
func decide(in *input) decision {
	op := in.op
	st := *op.Status.DeepCopy()
	st.ObservedGeneration = op.Generation
	// Set again below only while the current group is held by a window or a delay.
	st.NextStart = nil
	st.PausedBefore = ""
	if in.silences != nil {
		st.Silences = append([]v1alpha1.SilenceStatus(nil), *in.silences...)
		if len(st.Silences) == 0 {
			st.Silences = nil
		}
	}
	if st.StartTime == nil {
		st.StartTime = &in.now
	}
	d := decision{waiting: map[string]nodelock.Holder{}}
	if in.fail != nil {
		st.Phase = v1alpha1.OperationFailed
		st.CompletionTime = &in.now
		setConditions(&st, op.Generation, v1alpha1.OperationFailed, in.fail.reason, in.fail.message)
		d.status = st
		return d
	}
	st.Groups = alignGroups(st.Groups, in.groups)

	phase := v1alpha1.OperationSucceeded
	reason, message := ReasonSucceeded, ""
	current := -1
	for i := range in.groups {
		g := &in.groups[i]
		gs := &st.Groups[i]
		if gs.Phase == v1alpha1.GroupSucceeded {
			continue
		}
		if current >= 0 {
			// A later group: not started; it shows what it would cover now.
			*gs = v1alpha1.GroupStatus{Name: g.Name, Phase: v1alpha1.GroupPending, Nodes: v1alpha1.NodeCounts{Total: int32(len(g.Nodes)), Pending: int32(len(g.Nodes))}}
			if op.Spec.Abort {
				gs.Phase = v1alpha1.GroupAborted
			}
			continue
		}
		tasks := withFinished(in.op.Name, g.Name, in.tasks[g.Name], gs.Finished)
		nodes := groupNodes(g.Nodes, tasks)
		var failed []taskView
		running := 0
		for _, t := range tasks {
			switch t.Phase {
			case v1alpha1.TaskFailed:
				failed = append(failed, t)
			case v1alpha1.TaskRunning:
				running++
			}
		}
		gs.Name, gs.Nodes, gs.Message = g.Name, count(nodes, tasks), ""
		gs.Finished = finished(tasks)
		if gs.Nodes.Succeeded+gs.Nodes.Skipped == gs.Nodes.Total {
			gs.Phase = v1alpha1.GroupSucceeded
			gs.Message = succeededMessage(g, gs.Nodes)
			gs.Finished = nil
			if gs.CompletionTime == nil {
				done := in.now
				gs.CompletionTime = &done
			}
			continue
		}
		current = i
		sort.Slice(failed, func(a, b int) bool { return failed[a].Node < failed[b].Node })
		switch {
		case op.Spec.Abort:
			gs.Phase = v1alpha1.GroupAborted
			phase, reason = v1alpha1.OperationAborted, ReasonAborted
			message = fmt.Sprintf("aborted in group %s: %d of %d nodes done", g.Name, gs.Nodes.Succeeded+gs.Nodes.Skipped, gs.Nodes.Total)
			if running > 0 {
				gs.Phase = v1alpha1.GroupRunning
				phase, reason = v1alpha1.OperationRunning, ReasonAborting
				message = fmt.Sprintf("aborting: waiting for %d running tasks of group %s to stop", running, g.Name)
			}
		case len(failed) > 0:
			gs.Phase = v1alpha1.GroupBlocked
			phase, reason = v1alpha1.OperationBlocked, ReasonTaskFailed
			message = blockedMessage(failed)
			gs.Message = message
		case op.Spec.Paused:
			gs.Phase = v1alpha1.GroupRunning
			phase, reason = v1alpha1.OperationPaused, ReasonPaused
			message = fmt.Sprintf("paused in group %s: no new command starts; %d running", g.Name, running)
		default:
			gs.Phase = v1alpha1.GroupRunning
			phase, reason = v1alpha1.OperationRunning, ReasonRunning
			// A hold by windows or delays never hides a node held by another owner's failed
			// task: that still blocks, so a person is told before the window opens.
			soakEnd := time.Time{}
			candidates := next(in, g, nodes, tasks, d.waiting, i, &soakEnd)
			hReason, hMessage, until, hold := scheduled(in, i, st.Groups, tasks, running)
			if !hold {
				for _, node := range candidates {
					d.create = append(d.create, start{group: &g.Group, node: node})
				}
			}
			d.budget = nodelock.Budget{Nodes: nodes, Limit: g.MaxUnavailable, Down: func(n string) bool {
				_, has := tasks[n]
				return in.notReady[n] || in.cordoned[n] && !has
			}}
			if held, others := heldByFailed(in, g, nodes, tasks, d.create, d.waiting); len(held) > 0 {
				gs.Phase = v1alpha1.GroupBlocked
				phase, reason = v1alpha1.OperationBlocked, v1alpha1.ReasonNodeHeldByFailedTask
				message = heldMessage(in, held, others, d.waiting)
				gs.Message = message
				break
			}
			if node := pauseBefore(in, i, d.create); node != "" {
				// Paused as spec.paused pauses: nothing new starts, running tasks go on.
				d.create = nil
				phase, reason = v1alpha1.OperationPaused, ReasonPausedBeforeNode
				message = fmt.Sprintf("paused before node %s (pauseBefore) in group %s: no new command starts; %d running; resume with kubectl nodeops resume %s", node, g.Name, running, op.Name)
				gs.Message = message
				st.PausedBefore = node
				break
			}
			if hold {
				reason, message, gs.Message = hReason, hMessage, hMessage
				if until.IsZero() {
					// Nothing opens within a year: look again tomorrow rather than never.
					d.recheck = in.now.Add(24 * time.Hour)
				} else {
					d.recheck = until
					st.NextStart = &metav1.Time{Time: until}
				}
				break
			}
			if len(d.create) > 0 && i < len(in.timing) && len(in.timing[i].gates) > 0 {
				gReason, gMessage, recheck := gated(in, g.Name, in.timing[i].gates, &st, &d)
				if gReason != "" {
					d.create = nil
					gs.Message = gMessage
					reason, message = gReason, gMessage
					if gReason == ReasonGateTimedOut {
						gs.Phase = v1alpha1.GroupBlocked
						phase = v1alpha1.OperationBlocked
					} else if running > 0 {
						message += fmt.Sprintf("; %d running tasks go on to their end", running)
					}
					if !recheck.IsZero() {
						d.recheck = recheck
					}
					break
				}
			}
			message = runningMessage(g.Name, gs.Nodes, len(d.create))
			if waits := waitingMessage(nodes, tasks, in.notReady, in.cordoned, d.waiting); waits != "" {
				gs.Message = waits
				message += "; " + waits
				if len(d.waiting) > 0 {
					reason = ReasonWaitingForNode
				}
			}
			if !soakEnd.IsZero() {
				d.recheck = soakEnd
				if len(d.create) == 0 && running == 0 {
					reason = ReasonWaitingForDelay
					soak := fmt.Sprintf("soaking after the last node (postNodeDelay %s): next node at %s", in.timing[i].postNode, soakEnd.UTC().Format(time.RFC3339))
					message += "; " + soak
					gs.Message = soak
					st.NextStart = &metav1.Time{Time: soakEnd}
				}
			}
		}
	}
	if phase == v1alpha1.OperationSucceeded {
		message = fmt.Sprintf("all %d groups succeeded", len(in.groups))
	}
	if len(in.groups) > 0 && in.groups[0].Name == plan.GroupPreflight {
		phase, reason, message = preflightOutcome(in, &st, &d, current == 0, phase, reason, message)
	}
	st.Phase = phase
	st.Progress = progress(st.Groups)
	if phase.Finished() && st.CompletionTime == nil {
		st.CompletionTime = &in.now
	}
	setConditions(&st, op.Generation, phase, reason, message)
	d.status = st
	return d
}

// next chooses the group's nodes that start now (plan.Select): nodes without a task are the
// candidates, in sorted order; nodes with an unfinished task, or NotReady, count against the
// group's maxUnavailable; a candidate NotReady, cordoned or held by another task (added to
// waiting) counts too and waits (unavailable nodes count against maxUnavailable and budgets are cluster-wide, rules 2 and 11). A cordon on a node with
// a task in this group is taken for that task's own (a drain's), so it counts only while the
// task is unfinished; any other cordon is someone else's: an administrator's, or another
// operation's or profile's task that left the node unschedulable. Only a group that can make a
// node no less available (onlyRestores: an uncordon, say) starts on a cordoned node, which it
// finds counted already: otherwise a later group could never uncordon what an earlier group of
// the same operation cordoned (an uncordon restores only its own operation's cordons,
// uncordon restores what cordon found, rule 5). A node soaking after its task (postNodeDelay)
// counts too, and soakEnd gets the earliest end of a soak.
func next(in *input, g *plan.ResolvedGroup, nodes []string, tasks map[string]taskView, waiting map[string]nodelock.Holder, index int, soakEnd *time.Time) []string {
	candidates := make([]string, 0, len(nodes)-len(tasks))
	var remedies []string
	restores := onlyRestores(&g.Group)
	unavailable := 0
	for _, n := range nodes {
		if t, ok := tasks[n]; ok {
			if t.Phase.Unfinished() || in.notReady[n] {
				unavailable++
			} else if end := soaking(in, index, t); !end.IsZero() {
				unavailable++
				if soakEnd.IsZero() || end.Before(*soakEnd) {
					*soakEnd = end
				}
			}
			continue
		}
		if h, held := in.locks.Holder(n); held && h.Task != objname.TaskName(in.op.Name, g.Name, n) && !in.checks[h.Task] {
			waiting[n] = h
		}
		if _, held := waiting[n]; restores && in.cordoned[n] && !held && !in.notReady[n] {
			remedies = append(remedies, n)
			unavailable++
			continue
		}
		candidates = append(candidates, n)
	}
	return append(remedies, plan.Select(candidates, g.MaxUnavailable, unavailable, func(n string) bool {
		_, held := waiting[n]
		return held || in.notReady[n] || in.cordoned[n]
	})...)
}

// pauseBefore returns the first node about to start that the group pauses before and that no
// person has resumed yet (spec.resumedBefore), or "": each such node pauses the operation once.
func pauseBefore(in *input, index int, create []start) string {
	if index >= len(in.timing) || len(in.timing[index].pauseBefore) == 0 {
		return ""
	}
	for _, c := range create {
		if slices.Contains(in.timing[index].pauseBefore, c.node) && !slices.Contains(in.op.Spec.ResumedBefore, c.node) {
			return c.node
		}
	}
	return ""
}

// soaking returns, for a task that succeeded less than the group's postNodeDelay ago, when its
// soak ends: until then its node still counts against maxUnavailable, so the next node waits.
func soaking(in *input, index int, t taskView) time.Time {
	if index >= len(in.timing) || in.timing[index].postNode <= 0 || t.Phase != v1alpha1.TaskSucceeded || t.Done.IsZero() {
		return time.Time{}
	}
	// Rounded up to the second, as status stores it: otherwise every reconcile would see a
	// different nextStart and write it.
	end := t.Done.Add(in.timing[index].postNode)
	if r := end.Truncate(time.Second); !r.Equal(end) {
		end = r.Add(time.Second)
	}
	if end.After(in.now.Time) {
		return end
	}
	return time.Time{}
}

// scheduled reports whether the group at index may start no node now because of its scheduling,
// with the reason, the message, and when that may change (zero when no window opens within a
// year). A group waits postGroupDelay after the one before it succeeded before its first node,
// and starts nodes only inside its windows; tasks already running go on to their end.
func scheduled(in *input, index int, groups []v1alpha1.GroupStatus, tasks map[string]taskView, running int) (reason, message string, until time.Time, held bool) {
	if index >= len(in.timing) {
		return "", "", time.Time{}, false
	}
	t, now := in.timing[index], in.now.Time
	name := groups[index].Name
	// The last node of the group before soaks too: its postNodeDelay holds this group's first.
	if delay := max(t.postGroup, t.postNode); index > 0 && len(tasks) == 0 && delay > 0 {
		if prev := groups[index-1].CompletionTime; prev != nil {
			if end := prev.Add(delay); end.After(now) {
				which := "postGroupDelay"
				if t.postNode > t.postGroup {
					which = "postNodeDelay of its last node"
				}
				return ReasonWaitingForDelay, fmt.Sprintf("group %s waits %s after group %s succeeded (%s): starts at %s",
					name, delay, groups[index-1].Name, which, end.UTC().Format(time.RFC3339)), end, true
			}
		}
	}
	open, next := t.windows.At(now)
	if open {
		return "", "", time.Time{}, false
	}
	when := "no window opens within a year"
	if !next.IsZero() {
		when = "next opens at " + next.UTC().Format(time.RFC3339)
	}
	msg := fmt.Sprintf("group %s is outside its maintenance windows (%s): %s", name, t.describe, when)
	if running > 0 {
		msg += fmt.Sprintf("; %d running tasks go on to their end", running)
	}
	return ReasonWaitingForWindow, msg, next, true
}

// heldByFailed returns, when the group can make no progress on its own, the nodes it waits for
// that another owner's failed task holds (a task nobody has asked to retry or skip yet), and how
// many of its other nodes are left: none of its tasks is unfinished, none starts now, and even once
// every wait that ends by itself has ended (a holder that is pending, running or being recovered,
// a NotReady or cordoned node) nothing could start, because every node left is held by such a
// failed task or the maxUnavailable room is all spent by them. Only a person ends that
// (a failure blocks until a person decides and budgets are cluster-wide, rules 3 and 11); otherwise it returns nil.
func heldByFailed(in *input, g *plan.ResolvedGroup, nodes []string, tasks map[string]taskView, create []start, waiting map[string]nodelock.Holder) (held []string, others int) {
	if len(create) > 0 {
		return nil, 0
	}
	for _, n := range nodes {
		if t, ok := tasks[n]; ok {
			if t.Phase.Unfinished() {
				return nil, 0
			}
			continue
		}
		if h, ok := waiting[n]; ok {
			if v, known := in.holders[h.Task]; known && v.Phase == v1alpha1.TaskFailed && !v.Recovering {
				held = append(held, n)
				continue
			}
		}
		others++
	}
	if len(held) == 0 || others > 0 && len(held) < g.MaxUnavailable {
		return nil, 0
	}
	return held, others
}

// onlyRestores reports whether the group restores (uncordons) and otherwise only waits or checks:
// it leaves a node at least as available as it found it. Each kind says which it does in its Effects.
func onlyRestores(g *v1alpha1.Group) bool {
	restores := false
	for i := range g.Commands {
		switch g.Commands[i].Effects().Disruption {
		case v1alpha1.Restoring:
			restores = true
		case v1alpha1.NonDisruptive:
		default:
			return false
		}
	}
	return restores
}

// withFinished adds to a group's tasks, as the cache shows them, the nodes the status records as
// finished whose task is gone: deleting history by hand never makes anything run again
// (nothing deleted automatically, rule 7). A task cannot go before its end is recorded here (Finalizer).
func withFinished(op, group string, tasks map[string]taskView, rec *v1alpha1.FinishedNodes) map[string]taskView {
	if rec == nil {
		return tasks
	}
	// The common case is every recorded node's task still cached: then tasks is the answer as it
	// is (read only), without a copy or a task name hashed per recorded node on every reconcile.
	gone := 0
	for _, nodes := range [][]string{rec.Succeeded, rec.Skipped, rec.Aborted} {
		for _, n := range nodes {
			if _, ok := tasks[n]; !ok {
				gone++
			}
		}
	}
	if gone == 0 {
		return tasks
	}
	out := make(map[string]taskView, len(tasks)+gone)
	for n, t := range tasks {
		out[n] = t
	}
	add := func(nodes []string, phase v1alpha1.TaskPhase, skipped bool) {
		for _, n := range nodes {
			if _, ok := tasks[n]; !ok {
				out[n] = taskView{Name: objname.TaskName(op, group, n), Node: n, Group: group, Phase: phase, Skipped: skipped}
			}
		}
	}
	add(rec.Succeeded, v1alpha1.TaskSucceeded, false)
	add(rec.Skipped, v1alpha1.TaskSucceeded, true)
	add(rec.Aborted, v1alpha1.TaskAborted, false)
	return out
}

// finished is the record of a group's ended tasks, nil when none has ended.
func finished(tasks map[string]taskView) *v1alpha1.FinishedNodes {
	var rec v1alpha1.FinishedNodes
	for n, t := range tasks {
		switch {
		case t.Phase == v1alpha1.TaskAborted:
			rec.Aborted = append(rec.Aborted, n)
		case t.Phase != v1alpha1.TaskSucceeded:
		case t.Skipped:
			rec.Skipped = append(rec.Skipped, n)
		default:
			rec.Succeeded = append(rec.Succeeded, n)
		}
	}
	if len(rec.Succeeded)+len(rec.Skipped)+len(rec.Aborted) == 0 {
		return nil
	}
	sort.Strings(rec.Succeeded)
	sort.Strings(rec.Skipped)
	sort.Strings(rec.Aborted)
	return &rec
}

// recorded reports whether the status records node's task in group as ended: its group
// succeeded, or the node is in the group's Finished lists.
func recorded(st *v1alpha1.NodeOperationStatus, group, node string) bool {
	for i := range st.Groups {
		g := &st.Groups[i]
		if g.Name != group {
			continue
		}
		if g.Phase == v1alpha1.GroupSucceeded {
			return true
		}
		if g.Finished == nil {
			return false
		}
		for _, list := range [][]string{g.Finished.Succeeded, g.Finished.Skipped, g.Finished.Aborted} {
			if i := sort.SearchStrings(list, node); i < len(list) && list[i] == node {
				return true
			}
		}
	}
	return false
}

// alignGroups keeps the recorded group statuses when they match the plan, else starts afresh.
func alignGroups(recorded []v1alpha1.GroupStatus, groups []plan.ResolvedGroup) []v1alpha1.GroupStatus {
	if len(recorded) == len(groups) {
		same := true
		for i := range groups {
			same = same && recorded[i].Name == groups[i].Name
		}
		if same {
			return recorded
		}
	}
	out := make([]v1alpha1.GroupStatus, len(groups))
	for i := range groups {
		out[i] = v1alpha1.GroupStatus{Name: groups[i].Name, Phase: v1alpha1.GroupPending}
	}
	return out
}

// groupNodes is the group's nodes now plus those that already have a task in it, sorted.
func groupNodes(resolved []string, tasks map[string]taskView) []string {
	seen := make(map[string]bool, len(resolved)+len(tasks))
	out := make([]string, 0, len(resolved)+len(tasks))
	for _, n := range resolved {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	for n := range tasks {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

func count(nodes []string, tasks map[string]taskView) v1alpha1.NodeCounts {
	c := v1alpha1.NodeCounts{Total: int32(len(nodes))}
	for _, n := range nodes {
		t, ok := tasks[n]
		switch {
		case !ok || t.Phase == v1alpha1.TaskPending || t.Phase == "":
			c.Pending++
		case t.Phase == v1alpha1.TaskRunning:
			c.Running++
		case t.Phase == v1alpha1.TaskFailed:
			c.Failed++
		case t.Phase == v1alpha1.TaskAborted:
			c.Aborted++
		case t.Skipped:
			c.Skipped++
		default:
			c.Succeeded++
		}
	}
	return c
}

func progress(groups []v1alpha1.GroupStatus) string {
	var done, total int32
	for _, g := range groups {
		done += g.Nodes.Succeeded + g.Nodes.Skipped
		total += g.Nodes.Total
	}
	return fmt.Sprintf("%d/%d nodes", done, total)
}

func succeededMessage(g *plan.ResolvedGroup, c v1alpha1.NodeCounts) string {
	if c.Total == 0 {
		return "no node matched this group's selectors: succeeded with 0 nodes"
	}
	if c.Skipped > 0 {
		return fmt.Sprintf("%s succeeded, %d with skipped commands", nodesWord(c.Succeeded+c.Skipped), c.Skipped)
	}
	return nodesWord(c.Succeeded) + " succeeded"
}

func nodesWord(n int32) string {
	if n == 1 {
		return "1 node"
	}
	return fmt.Sprintf("%d nodes", n)
}

func blockedMessage(failed []taskView) string {
	f := failed[0]
	msg := fmt.Sprintf("NodeTask %s on node %s failed at command %s", f.Name, f.Node, f.FailedCommand)
	if f.Message != "" {
		msg += ": " + f.Message
	}
	if len(failed) > 1 {
		msg += fmt.Sprintf(" (and %d more failed tasks)", len(failed)-1)
	}
	return msg + "; set spec.recoveryMode Retry or Skip on the task (kubectl nodeops retry|skip) or abort the operation"
}

// heldMessage names the first node held by another owner's failed task, the task, its owner and
// its failure, and what a person can do.
func heldMessage(in *input, held []string, others int, waiting map[string]nodelock.Holder) string {
	n := held[0]
	h := waiting[n]
	v := in.holders[h.Task]
	msg := fmt.Sprintf("nothing of this operation can run: node %s is held by %s, which failed at command %s", n, h, v.FailedCommand)
	if v.Message != "" {
		msg += ": " + v.Message
	}
	if len(held) > 1 {
		more := held[1:]
		if len(more) > 3 {
			more = append(more[:3:3], fmt.Sprintf("%d more", len(more)-3))
		}
		msg += fmt.Sprintf(" (and nodes %s, held by failed tasks of others too)", strings.Join(more, ", "))
	}
	if others > 0 {
		msg += fmt.Sprintf("; the held nodes spend all the group's maxUnavailable room, so its %d other nodes wait too", others)
	}
	return msg + fmt.Sprintf("; retry or skip that task (kubectl nodeops retry|skip %s), or abort this operation", h.Task)
}

func runningMessage(group string, c v1alpha1.NodeCounts, starting int) string {
	return fmt.Sprintf("group %s: %d/%d nodes done, %d running, %d starting", group, c.Succeeded+c.Skipped, c.Total, c.Running, starting)
}

// waitingMessage names the nodes the group waits for: those held by another task, and NotReady
// or cordoned ones without a task.
func waitingMessage(nodes []string, tasks map[string]taskView, notReady, cordoned map[string]bool, waiting map[string]nodelock.Holder) string {
	var parts []string
	held := make([]string, 0, len(waiting))
	for n := range waiting {
		held = append(held, n)
	}
	sort.Strings(held)
	for i, n := range held {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more nodes held by other tasks", len(held)-3))
			break
		}
		parts = append(parts, fmt.Sprintf("waiting for node %s, held by %s", n, waiting[n]))
	}
	var down, unschedulable []string
	for _, n := range nodes {
		if _, has := tasks[n]; has {
			continue
		}
		if notReady[n] {
			down = append(down, n)
		}
		if cordoned[n] {
			unschedulable = append(unschedulable, n)
		}
	}
	name := func(nodes []string) string {
		if len(nodes) > 3 {
			nodes = append(nodes[:3:3], fmt.Sprintf("and %d more", len(nodes)-3))
		}
		return strings.Join(nodes, ", ")
	}
	if len(down) > 0 {
		parts = append(parts, "waiting for NotReady nodes "+name(down))
	}
	if len(unschedulable) > 0 {
		parts = append(parts, "waiting for cordoned nodes "+name(unschedulable)+" (spec.unschedulable, set outside this group: they count against maxUnavailable until uncordoned)")
	}
	return strings.Join(parts, "; ")
}

// setConditions writes all four conditions, each with a reason, from the phase.
func setConditions(st *v1alpha1.NodeOperationStatus, gen int64, phase v1alpha1.OperationPhase, reason, message string) {
	set := func(t string, ok bool, r, m string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: s, Reason: r, Message: m, ObservedGeneration: gen})
	}
	progressing := phase == v1alpha1.OperationRunning || phase == v1alpha1.OperationPending
	set(v1alpha1.ConditionProgressing, progressing, reason, message)
	if phase == v1alpha1.OperationBlocked {
		set(v1alpha1.ConditionBlocked, true, reason, message)
	} else {
		set(v1alpha1.ConditionBlocked, false, ReasonNotBlocked, "no task has failed")
	}
	other := string(phase)
	if phase == v1alpha1.OperationSucceeded {
		set(v1alpha1.ConditionSucceeded, true, reason, message)
	} else {
		set(v1alpha1.ConditionSucceeded, false, other, "the operation has not succeeded (yet)")
	}
	if phase == v1alpha1.OperationFailed {
		set(v1alpha1.ConditionFailed, true, reason, message)
	} else {
		set(v1alpha1.ConditionFailed, false, other, "the operation has not failed")
	}
}
