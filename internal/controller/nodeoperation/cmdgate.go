package nodeoperation

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/gate"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/plan"
)

// A command gate is answered by a gate-check NodeTask (v1alpha1.IsGateCheck): one script command,
// owned by the operation, on the gate's node or the node about to start. The agent runs it as it
// runs any task, under the node's Lease; its Succeeded passes the gate and its Failed holds it,
// with the exit code and the output's tail. Each look that needs a fresh answer makes a new check
// (attempt n+1), and every check of the gate but the last one goes, so at most two are kept.

// checkMaxTimeout bounds one check's script: a check is meant to answer quickly and is re-run.
const checkMaxTimeout = 5 * time.Minute

// passedFor is how long a succeeded check stays an answer for its node: a node held back longer
// (a lost lock, a window) is checked again.
func passedFor(recheck time.Duration) time.Duration { return max(recheck, time.Minute) }

// checkName is the name of attempt n of gate's check in group, on node. The middle part, with
// dots, is no group's name (a group is a DNS label), so no task of a group ever has it.
func checkName(op, group, gateName string, n int, node string) string {
	return plan.TaskName(op, fmt.Sprintf("%s.gate.%s.%d", group, gateName, n), node)
}

// buildCheck is attempt n of g's check in group, run on node for the node about to start.
func buildCheck(op *v1alpha1.NodeOperation, group string, g *v1alpha1.Gate, node, about string, n int) *v1alpha1.NodeTask {
	return &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{
			Name: checkName(op.Name, group, g.Name, n, node),
			Labels: map[string]string{
				v1alpha1.LabelGateCheck:   g.Name,
				v1alpha1.LabelGateAttempt: strconv.Itoa(n),
				v1alpha1.LabelNode:        plan.LabelValue(node),
				v1alpha1.LabelGroup:       plan.LabelValue(group),
			},
			Annotations: map[string]string{v1alpha1.AnnotationGateCheckFor: about},
			// No Finalizer: a check is an answer, not history; the gate's record in status keeps its word.
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: kind, Name: op.Name, UID: op.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: v1alpha1.NodeTaskSpec{
			NodeName:  node,
			Operation: op.Name,
			Group:     group,
			GateCheck: g.Name,
			Commands: v1alpha1.CommandList{{
				Name:    g.Name,
				Timeout: &metav1.Duration{Duration: min(gate.Timeout(g), checkMaxTimeout)},
				// A check only looks: one its agent's restart interrupted is run again, not failed.
				Script: &v1alpha1.ScriptCommand{Inline: g.Command.Script, Idempotent: true},
			}},
			// A check waits for no approval: it is the gate's look, not the operation's work.
			ExecutionMode: v1alpha1.ExecutionAuto,
		},
	}
}

// scriptSucceeded reports whether the check's script ran and exited 0, as its agent recorded.
func scriptSucceeded(t *v1alpha1.NodeTask) bool {
	return len(t.Status.Commands) == 1 && t.Status.Commands[0].Phase == v1alpha1.CommandSucceeded
}

// ended reports whether a check has its answer: succeeded, failed or aborted.
func ended(t *v1alpha1.NodeTask) bool {
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

// checksOf are the operation's checks of gateName in group, the newest attempt first.
func checksOf(s *scope, group, gateName string) []*v1alpha1.NodeTask {
	var out []*v1alpha1.NodeTask
	for _, t := range s.checks {
		if t.Spec.GateCheck == gateName && t.Spec.Group == group && t.DeletionTimestamp.IsZero() {
			out = append(out, t)
		}
	}
	sort.Slice(out, func(i, j int) bool { return attemptOf(out[i]) > attemptOf(out[j]) })
	return out
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
	v := view(t)
	return gate.Result{Message: fmt.Sprintf("check NodeTask %s failed on node %s: %s", t.Name, t.Spec.NodeName, v.Message)}
}

// outputTail is the last n bytes of output, on one line.
func outputTail(out string, n int) string {
	out = strings.TrimSpace(out)
	if len(out) > n {
		out = "..." + out[len(out)-n:]
	}
	return strings.Join(strings.Fields(out), " ")
}

// checkCommand is command gate g's answer in this look, for the node about to start (about). It
// reads the gate's checks and, when none answers for now, notes a new one for act to create. A
// gate that cannot be checked (its node gone, the node held by another task, no agent answering)
// holds; it never passes by default (a gate that cannot be evaluated blocks, rule 14).
func (r *Reconciler) checkCommand(ctx context.Context, s *scope, group string, g *v1alpha1.Gate, about string) gate.Result {
	node := g.Command.Node
	if node == "" {
		node = about
	}
	if node == "" {
		return gate.Result{Message: "no node is about to start, so there is no node to run the script on"}
	}
	if s.op.Spec.ExecutionMode == v1alpha1.ExecutionDryRun {
		// Dry run replaces every side effect by its report; a script may have any.
		return gate.Result{Passed: true, Message: "dry run: command gate would run on " + node}
	}
	var n corev1.Node
	if err := r.Client.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		if apierrors.IsNotFound(err) {
			return gate.Result{Message: fmt.Sprintf("cannot check: node %s does not exist", node)}
		}
		return gate.Result{Message: fmt.Sprintf("cannot check: read node %s: %v", node, err)}
	}
	checks := checksOf(s, group, g.Name)
	attempt := 0
	var latest, prev *v1alpha1.NodeTask
	if len(checks) > 0 {
		latest, attempt = checks[0], attemptOf(checks[0])
		if len(checks) > 1 {
			prev = checks[1]
		}
	}
	now := s.in.now.Time
	var carry *gate.Result
	if latest != nil && answers(latest, g, node, about) {
		s.keepChecks[latest.Name] = true
		switch phase := latest.EffectivePhase(); {
		case !ended(latest):
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
			if now.Sub(endedAt(latest)) < passedFor(s.in.gateRecheck) {
				return gate.Result{Passed: true, Message: "script exited 0 on node " + node}
			}
		case phase == v1alpha1.TaskFailed:
			res := failedResult(latest)
			if now.Sub(endedAt(latest)) < s.in.gateRecheck {
				return res
			}
			carry = &res
		}
	}
	if h, held := s.in.locks.Holder(node); held && !s.in.checks[h.Task] {
		return gate.Result{Message: fmt.Sprintf("cannot check yet: node %s is held by %s", node, h)}
	}
	next := buildCheck(s.op, group, g, node, about, attempt+1)
	s.keepChecks[next.Name] = true
	if !s.in.locks.IsReserved(next.Name) {
		s.checkCreates = append(s.checkCreates, next)
		for i, t := range checks {
			switch {
			case i == 0 && ended(t) && answers(t, g, node, about):
				continue // kept while the new check runs: it carries the gate's word
			case ended(t):
				s.checkDeletes = append(s.checkDeletes, t)
			default:
				// Deleting a check does not stop its script: it is told to abort and goes once ended.
				s.checkAborts = append(s.checkAborts, t)
			}
		}
	}
	if carry != nil {
		return *carry
	}
	return gate.Result{Message: fmt.Sprintf("checking: NodeTask %s to run on node %s", next.Name, node)}
}

// actOnChecks creates the checks this look asked for, under their nodes' locks; tells the
// unfinished checks no look needs to abort (their gate passed, was skipped, or its group no longer
// starts that node); and deletes ended checks a new attempt replaces.
func (r *Reconciler) actOnChecks(ctx context.Context, s *scope) error {
	if len(s.checkCreates) > 0 {
		creates := make([]skeleton.TaskCreate, len(s.checkCreates))
		for i, t := range s.checkCreates {
			creates[i] = skeleton.TaskCreate{Task: t}
		}
		// The check takes its node's lock like any task, as the agent runs it under the node's Lease
		// like any task (rule 1), but within a budget over no node: it makes no node unavailable.
		_, _, err := skeleton.LockThenCreate(ctx, r.Client, r.APIReader, r.Locks, nodelock.OperationOwner(s.op.Name), nodelock.Budget{Limit: len(creates)}, creates, r.CreateParallelism)
		if err != nil {
			return err
		}
		r.noteChecks(s.checkCreates)
	}
	aborts := s.checkAborts
	for _, t := range s.checks {
		if !ended(t) && !s.keepChecks[t.Name] {
			aborts = append(aborts, t)
		}
	}
	w := skeleton.NewWrites(r.CreateParallelism)
	seen := map[string]bool{}
	for _, t := range aborts {
		// An unfinished check is never deleted: its agent would go on running the script under a
		// Lease whose task is gone, beside the node's next task (rule 1). It is told to abort, and
		// deleted by a later look once its agent recorded the end.
		if seen[t.Name] || t.Spec.Abort {
			continue
		}
		seen[t.Name] = true
		w.Go(func() error {
			patched := t.DeepCopy()
			patched.Spec.Abort = true
			if err := r.Client.Patch(ctx, patched, client.MergeFrom(t)); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("abort gate check NodeTask %s: %w", t.Name, err)
			}
			return nil
		})
	}
	for _, t := range s.checkDeletes {
		if seen[t.Name] || !ended(t) {
			continue
		}
		seen[t.Name] = true
		w.Go(func() error {
			uid := t.UID
			if err := r.Client.Delete(ctx, t, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
				return fmt.Errorf("delete gate check NodeTask %s: %w", t.Name, err)
			}
			return nil
		})
	}
	return w.Wait()
}

// noteChecks remembers the checks just created, so that until the cache shows them their
// reservations in the lock table are known as this operation's checks, not tasks it waits for.
func (r *Reconciler) noteChecks(created []*v1alpha1.NodeTask) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.createdChecks == nil {
		r.createdChecks = map[string]bool{}
	}
	for _, t := range created {
		r.createdChecks[t.Name] = true
	}
}

// ownChecks is the set of the operation's checks by name: those in the cache, and those this
// manager created that the cache does not show yet (reservations in the lock table).
func (r *Reconciler) ownChecks(checks []*v1alpha1.NodeTask, locks nodelock.View) map[string]bool {
	out := make(map[string]bool, len(checks))
	for _, t := range checks {
		out[t.Name] = true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for name := range r.createdChecks {
		switch {
		case out[name]:
			delete(r.createdChecks, name) // in the cache now: known from there
		case locks.IsReserved(name):
			out[name] = true
		default:
			delete(r.createdChecks, name) // never created, or gone
		}
	}
	return out
}
