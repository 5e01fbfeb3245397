// Package cmdgate answers command gates, for NodeOperations and NodeProfiles alike: a command gate
// is answered by a gate-check NodeTask (v1alpha1.IsGateCheck), one script command, owned by the
// operation or profile, on the gate's node or the node about to start. The agent runs it as it
// runs any task, under the node's Lease; its Succeeded passes the gate and its Failed holds it,
// with the exit code and the output's tail. Each look that needs a fresh answer makes a new check
// (attempt n+1), and every check of the gate but the last one goes, so at most two are kept.
//
// It owns the checks' names, their building, the reading of their answers and the writes that
// create, abort and delete them; what differs between the owners (kind, name, UID, dry run) is
// its Owner. It writes nothing but the owner's checks, and the gates' records stay the callers'.
package cmdgate

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/gate"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/objname"
)

// Owner is the NodeOperation or NodeProfile whose gates the checks answer.
type Owner struct {
	// Kind is "NodeOperation" or "NodeProfile".
	Kind string
	Name string
	UID  types.UID
	// DryRun replaces every side effect by its report; a script may have any, so no check runs.
	DryRun bool
}

// lockOwner is the owner as the node lock table names it (nodelock.OperationOwner, ProfileOwner).
func (o Owner) lockOwner() string { return o.Kind + "/" + o.Name }

// MaxTimeout bounds one check's script: a check is meant to answer quickly and is re-run.
const MaxTimeout = 5 * time.Minute

// passedFor is how long a succeeded check stays an answer for its node: a node held back longer
// (a lost lock, a window) is checked again.
func passedFor(recheck time.Duration) time.Duration { return max(recheck, time.Minute) }

// Name is the name of attempt n of gateName's check in group (an operation's group; "" for a
// profile), on node. The middle part, with dots, is no group's name (a group is a DNS label, a
// profile's task group is "install-HASH" or "uninstall-HASH"), so no task of the owner ever has it.
func Name(owner, group, gateName string, n int, node string) string {
	mid := fmt.Sprintf("gate.%s.%d", gateName, n)
	if group != "" {
		mid = group + "." + mid
	}
	return objname.TaskName(owner, mid, node)
}

// Build is attempt n of g's check in group, run on node for the node about to start.
func Build(o Owner, group string, g *v1alpha1.Gate, node, about string, n int) *v1alpha1.NodeTask {
	return &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{
			Name: Name(o.Name, group, g.Name, n, node),
			Labels: map[string]string{
				v1alpha1.LabelGateCheck:   g.Name,
				v1alpha1.LabelGateAttempt: strconv.Itoa(n),
				v1alpha1.LabelNode:        objname.LabelValue(node),
				v1alpha1.LabelGroup:       objname.LabelValue(group),
			},
			Annotations: map[string]string{v1alpha1.AnnotationGateCheckFor: about},
			// No Finalizer: a check is an answer, not history; the gate's record in status keeps its word.
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: o.Kind, Name: o.Name, UID: o.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: v1alpha1.NodeTaskSpec{
			NodeName:  node,
			Operation: o.Name,
			Group:     group,
			GateCheck: g.Name,
			Commands: v1alpha1.CommandList{{
				Name:    g.Name,
				Timeout: &metav1.Duration{Duration: min(gate.Timeout(g), MaxTimeout)},
				// A check only looks: one its agent's restart interrupted is run again, not failed.
				Script: &v1alpha1.ScriptCommand{Inline: g.Command.Script, Idempotent: true},
			}},
			// A check waits for no approval: it is the gate's look, not the owner's work.
			ExecutionMode: v1alpha1.ExecutionAuto,
		},
	}
}

// scriptSucceeded reports whether the check's script ran and exited 0, as its agent recorded.
func scriptSucceeded(t *v1alpha1.NodeTask) bool {
	return len(t.Status.Commands) == 1 && t.Status.Commands[0].Phase == v1alpha1.CommandSucceeded
}

// Ended reports whether a check has its answer: succeeded, failed or aborted.
func Ended(t *v1alpha1.NodeTask) bool {
	p := t.EffectivePhase()
	return p == v1alpha1.TaskSucceeded || p == v1alpha1.TaskFailed || p == v1alpha1.TaskAborted
}

// endedAt is when a check ended: its task's completion, else its script's (a failed task records
// only its command's), else when its agent was marked lost; zero when unknown.
func endedAt(t *v1alpha1.NodeTask) time.Time {
	switch {
	case t.Status.CompletionTime != nil:
		return t.Status.CompletionTime.Time
	case len(t.Status.Commands) > 0 && t.Status.Commands[0].CompletionTime != nil:
		return t.Status.Commands[0].CompletionTime.Time
	}
	if c := t.Lost(); c != nil {
		return c.LastTransitionTime.Time
	}
	return time.Time{}
}

// attemptOf is a check's attempt number, 0 when unreadable.
func attemptOf(t *v1alpha1.NodeTask) int {
	n, _ := strconv.Atoi(t.Labels[v1alpha1.LabelGateAttempt])
	return n
}

// answers reports whether check t is g's check on node for the node about to start, as g is now.
func answers(t *v1alpha1.NodeTask, g *v1alpha1.Gate, node, about string) bool {
	return t.Spec.NodeName == node && t.Annotations[v1alpha1.AnnotationGateCheckFor] == about &&
		len(t.Spec.Commands) == 1 && t.Spec.Commands[0].Script != nil && t.Spec.Commands[0].Script.Inline == g.Command.Script
}

// failedResult is what a failed check says: the script's exit code and the tail of its output,
// or why the task failed without one (its agent lost, the script interrupted).
func failedResult(t *v1alpha1.NodeTask) gate.Result {
	if len(t.Status.Commands) > 0 {
		c := t.Status.Commands[0]
		if c.ExitCode != nil {
			msg := fmt.Sprintf("script exited %d on node %s", *c.ExitCode, t.Spec.NodeName)
			if tail := outputTail(c.OutputTail, 512); tail != "" {
				msg += ": " + tail
			}
			return gate.Result{Message: msg}
		}
	}
	return gate.Result{Message: fmt.Sprintf("check NodeTask %s failed on node %s: %s", t.Name, t.Spec.NodeName, failure(t))}
}

// failure is why a check failed without an exit code: its status message, its script's, or the
// manager's mark that its agent was lost.
func failure(t *v1alpha1.NodeTask) string {
	msg := t.Status.Message
	for _, c := range t.Status.Commands {
		if c.Phase == v1alpha1.CommandFailed && msg == "" {
			msg = c.Message
		}
	}
	if c := t.Lost(); c != nil && c.Reason != v1alpha1.ReasonLostSkipped && t.EffectivePhase() == v1alpha1.TaskFailed {
		msg = c.Reason + ": " + c.Message
	}
	return msg
}

// outputTail is the last n bytes of output, on one line.
func outputTail(out string, n int) string {
	out = strings.TrimSpace(out)
	if len(out) > n {
		out = "..." + out[len(out)-n:]
	}
	return strings.Join(strings.Fields(out), " ")
}

// Look is one reconcile's view of an owner's checks and what it asks act to do with them.
type Look struct {
	Owner Owner
	// Checks are the owner's checks in the cache (v1alpha1.IsGateCheck), and Own the names of the
	// owner's checks, those the cache does not show yet included (Created.Own).
	Checks []*v1alpha1.NodeTask
	Own    map[string]bool
	// Locks is the lock table's view this reconcile decides with.
	Locks nodelock.View
	// Now and Recheck: a failed answer stands for Recheck, a passed one for passedFor(Recheck).
	Now     time.Time
	Recheck time.Duration

	// keep are the checks this look consulted or asked for; creates, aborts and deletes are what
	// Act does with checks.
	keep                     map[string]bool
	creates, aborts, deletes []*v1alpha1.NodeTask
}

// checksOf are the owner's checks of gateName in group, the newest attempt first.
func (l *Look) checksOf(group, gateName string) []*v1alpha1.NodeTask {
	var out []*v1alpha1.NodeTask
	for _, t := range l.Checks {
		if t.Spec.GateCheck == gateName && t.Spec.Group == group && t.DeletionTimestamp.IsZero() {
			out = append(out, t)
		}
	}
	sort.Slice(out, func(i, j int) bool { return attemptOf(out[i]) > attemptOf(out[j]) })
	return out
}

func (l *Look) keepCheck(name string) {
	if l.keep == nil {
		l.keep = map[string]bool{}
	}
	l.keep[name] = true
}

// Check is command gate g's answer in this look, for the node about to start (about). It reads
// the gate's checks and, when none answers for now, notes a new one for Act to create. A gate
// that cannot be checked (its node gone, the node held by another task, no agent answering)
// holds; it never passes by default (a gate that cannot be evaluated blocks, rule 14).
func (l *Look) Check(ctx context.Context, c client.Reader, group string, g *v1alpha1.Gate, about string) gate.Result {
	node := g.Command.Node
	if node == "" {
		node = about
	}
	if node == "" {
		return gate.Result{Message: "no node is about to start, so there is no node to run the script on"}
	}
	if l.Owner.DryRun {
		// Dry run replaces every side effect by its report; a script may have any.
		return gate.Result{Passed: true, Message: "dry run: command gate would run on " + node}
	}
	var n corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		if apierrors.IsNotFound(err) {
			return gate.Result{Message: fmt.Sprintf("cannot check: node %s does not exist", node)}
		}
		return gate.Result{Message: fmt.Sprintf("cannot check: read node %s: %v", node, err)}
	}
	checks := l.checksOf(group, g.Name)
	attempt := 0
	var latest, prev *v1alpha1.NodeTask
	if len(checks) > 0 {
		latest, attempt = checks[0], attemptOf(checks[0])
		if len(checks) > 1 {
			prev = checks[1]
		}
	}
	var carry *gate.Result
	if latest != nil && answers(latest, g, node, about) {
		l.keepCheck(latest.Name)
		switch phase := latest.EffectivePhase(); {
		case !Ended(latest):
			if prev != nil && prev.EffectivePhase() == v1alpha1.TaskFailed && answers(prev, g, node, about) {
				// Checked again: the gate keeps the last answer's word until this one's.
				return failedResult(prev)
			}
			state := "waiting for node " + node + "'s agent to run it"
			if phase == v1alpha1.TaskRunning {
				state = "running on node " + node
			}
			return gate.Result{Message: fmt.Sprintf("checking: NodeTask %s %s", latest.Name, state)}
		case phase == v1alpha1.TaskSucceeded && latest.Status.Phase == v1alpha1.TaskSucceeded && scriptSucceeded(latest):
			// Its agent's word that the script exited 0: a check a person skipped answers nothing
			// (a person passes a gate with `skip --gate`, which the status records as such).
			if l.passStands(latest) {
				return gate.Result{Passed: true, Message: "script exited 0 on node " + node}
			}
		case phase == v1alpha1.TaskFailed:
			res := failedResult(latest)
			if l.Now.Sub(endedAt(latest)) < l.Recheck {
				return res
			}
			carry = &res
		}
	}
	if h, held := l.Locks.Holder(node); held && !l.Own[h.Task] {
		return gate.Result{Message: fmt.Sprintf("cannot check yet: node %s is held by %s", node, h)}
	}
	next := Build(l.Owner, group, g, node, about, attempt+1)
	l.keepCheck(next.Name)
	if !l.Locks.IsReserved(next.Name) {
		l.creates = append(l.creates, next)
		for i, t := range checks {
			switch {
			case i == 0 && Ended(t) && answers(t, g, node, about):
				continue // kept while the new check runs: it carries the gate's word
			case Ended(t):
				l.deletes = append(l.deletes, t)
			default:
				// Deleting a check does not stop its script: it is told to abort and goes once ended.
				l.aborts = append(l.aborts, t)
			}
		}
	}
	if carry != nil {
		return *carry
	}
	return gate.Result{Message: fmt.Sprintf("checking: NodeTask %s to run on node %s", next.Name, node)}
}

// passStands reports whether check, which passed, still answers for its node: for
// passedFor(Recheck) after it ended, not counting the time the owner's checks of its other gates
// in the same group ran on the same node since. A node runs one check at a time (its Lease), so
// two gates whose scripts each outlast passedFor would otherwise take turns for ever: each check
// would outlive the other's answer, and the node would never have both.
func (l *Look) passStands(check *v1alpha1.NodeTask) bool {
	ended := endedAt(check)
	return l.Now.Sub(ended)-l.othersRan(check, ended) < passedFor(l.Recheck)
}

// othersRan is how long the owner's checks of gates other than check's, in check's group and on
// its node, ran after since (a running one until now).
func (l *Look) othersRan(check *v1alpha1.NodeTask, since time.Time) time.Duration {
	var ran time.Duration
	for _, t := range l.Checks {
		if t.Spec.Group != check.Spec.Group || t.Spec.GateCheck == check.Spec.GateCheck ||
			t.Spec.NodeName != check.Spec.NodeName || t.Status.StartTime == nil {
			continue
		}
		start, end := t.Status.StartTime.Time, endedAt(t)
		if end.IsZero() {
			end = l.Now
		}
		if start.Before(since) {
			start = since
		}
		if end.After(start) {
			ran += end.Sub(start)
		}
	}
	return ran
}

// Drop takes back what this look asked for gateName's checks in group, once its gate no longer
// needs them (it timed out in this look): Act creates none, and tells the unfinished ones to abort.
func (l *Look) Drop(group, gateName string) {
	for _, t := range l.checksOf(group, gateName) {
		delete(l.keep, t.Name)
	}
	creates := l.creates[:0]
	for _, t := range l.creates {
		if t.Spec.Group == group && t.Spec.GateCheck == gateName {
			delete(l.keep, t.Name)
			continue
		}
		creates = append(creates, t)
	}
	l.creates = creates
}

// Created remembers the checks a manager created until its cache shows them. The zero value is ready.
type Created struct {
	mu    sync.Mutex
	names map[string]bool
}

// note remembers the checks just created, so that until the cache shows them their
// reservations in the lock table are known as the owner's checks, not tasks it waits for.
func (c *Created) note(created []*v1alpha1.NodeTask) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.names == nil {
		c.names = map[string]bool{}
	}
	for _, t := range created {
		c.names[t.Name] = true
	}
}

// Own is the set of an owner's checks by name: those in the cache, and those this manager
// created that the cache does not show yet (reservations in the lock table).
func (c *Created) Own(checks []*v1alpha1.NodeTask, locks nodelock.View) map[string]bool {
	out := make(map[string]bool, len(checks))
	for _, t := range checks {
		out[t.Name] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range c.names {
		switch {
		case out[name]:
			delete(c.names, name) // in the cache now: known from there
		case locks.IsReserved(name):
			out[name] = true
		default:
			delete(c.names, name) // never created, or gone
		}
	}
	return out
}

// Writer carries out what looks ask for: the API client, a reader past the cache, the node lock
// table, and the memory of created checks.
type Writer struct {
	Client   client.Client
	Live     client.Reader
	Locks    skeleton.Locker
	Created  *Created
	Parallel int
}

// Act creates the checks l asked for, under their nodes' locks; tells the unfinished checks no
// look needs to abort (their gate passed, was skipped, or no longer starts that node); and
// deletes ended checks a new attempt replaces.
func (w Writer) Act(ctx context.Context, l *Look) error {
	if len(l.creates) > 0 {
		creates := make([]skeleton.TaskCreate, len(l.creates))
		for i, t := range l.creates {
			creates[i] = skeleton.TaskCreate{Task: t}
		}
		// The check takes its node's lock like any task, as the agent runs it under the node's Lease
		// like any task (rule 1), but within a budget over no node: it makes no node unavailable.
		_, _, err := skeleton.LockThenCreate(ctx, w.Client, w.Live, w.Locks, l.Owner.lockOwner(), nodelock.Budget{Limit: len(creates)}, creates, w.Parallel)
		if err != nil {
			return err
		}
		w.Created.note(l.creates)
	}
	aborts := l.aborts
	for _, t := range l.Checks {
		if !Ended(t) && !l.keep[t.Name] {
			aborts = append(aborts, t)
		}
	}
	writes := skeleton.NewWrites(w.Parallel)
	seen := map[string]bool{}
	for _, t := range aborts {
		// An unfinished check is never deleted: its agent would go on running the script under a
		// Lease whose task is gone, beside the node's next task (rule 1). It is told to abort, and
		// deleted by a later look once its agent recorded the end.
		if seen[t.Name] || t.Spec.Abort {
			continue
		}
		seen[t.Name] = true
		writes.Go(func() error {
			if err := skeleton.Abort(ctx, w.Client, w.Live, t); err != nil {
				return fmt.Errorf("gate check: %w", err)
			}
			return nil
		})
	}
	for _, t := range l.deletes {
		if seen[t.Name] || !Ended(t) {
			continue
		}
		seen[t.Name] = true
		writes.Go(func() error {
			uid := t.UID
			if err := w.Client.Delete(ctx, t, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
				return fmt.Errorf("delete gate check NodeTask %s: %w", t.Name, err)
			}
			return nil
		})
	}
	return writes.Wait()
}
