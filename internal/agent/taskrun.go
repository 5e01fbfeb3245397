package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/kubeclient"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

// step names where a task's run stands; each has one transition (transitions), which does its
// step and names the next (docs/architecture.md, "The agent's task loop").
type step int

const (
	// stepDecide asks the policy for the next action on the status the agent holds.
	stepDecide step = iota
	// stepRecover acts on a person's recoveryMode; the recovery is held for the next write.
	stepRecover
	// stepClaim takes or checks the node's lock (exclusion that cannot be bypassed, rule 8).
	stepClaim
	// stepRecordRunning writes what is held (a result, a recovery) with the action's record: the
	// command Running, an approval wait, the task's end (intent recorded before action, rule 4).
	stepRecordRunning
	// stepRun runs the command.
	stepRun
	// stepRecordResult holds the command's result, written with the next record (rule 4).
	stepRecordResult
	// stepResync recovers from a conflict: the task as it now stands replaces the one held.
	stepResync
	// stepStop leaves execute with a requeue delay or an error.
	stepStop
)

var stepNames = map[step]string{
	stepDecide: "decide", stepRecover: "recover", stepClaim: "claim", stepRecordRunning: "record Running",
	stepRun: "run", stepRecordResult: "record result", stepResync: "resync", stepStop: "stop",
}

func (s step) String() string { return stepNames[s] }

// transitions is the task loop: one function per step but stop, each returning the next step.
var transitions = map[step]func(*taskRun, context.Context, taskIO) step{
	stepDecide:        (*taskRun).decide,
	stepRecover:       (*taskRun).recover,
	stepClaim:         (*taskRun).claim,
	stepRecordRunning: (*taskRun).recordRunning,
	stepRun:           (*taskRun).run,
	stepRecordResult:  (*taskRun).recordResult,
	stepResync:        (*taskRun).resync,
}

// taskIO is what the transitions do to the world; the Reconciler is the one implementation, so
// that the transitions themselves hold no IO and are tested in a table.
type taskIO interface {
	stopping() bool
	hold(ctx context.Context, task *v1alpha1.NodeTask, need holdNeed) (holdAnswer, error)
	// fresh reads the task from the API; nil without an error when it is gone.
	fresh(ctx context.Context, task *v1alpha1.NodeTask) (*v1alpha1.NodeTask, error)
	// writeStatus writes the agent's fields of status over task, which it updates on success.
	writeStatus(ctx context.Context, task *v1alpha1.NodeTask, status *v1alpha1.NodeTaskStatus) error
	// drainAsk is the drain request a Running record carries; nil when nothing drains (Noop).
	drainAsk() *v1alpha1.DrainRequest
	// runCommand runs a.Index; late, before its Running record (status), which it writes only if
	// the command runs long. It returns the task as last written.
	runCommand(ctx context.Context, task *v1alpha1.NodeTask, a taskpolicy.Action, late bool, status *v1alpha1.NodeTaskStatus) (*v1alpha1.NodeTask, taskpolicy.Outcome)
}

// taskRun is one execute's state between transitions.
type taskRun struct {
	log logr.Logger
	// task is the task as last read or written: its spec and the manager's conditions.
	task *v1alpha1.NodeTask
	// status is the agent's fields, ahead of task.Status by what is held.
	status *v1alpha1.NodeTaskStatus
	// heldResult: status holds a command result not yet written, which must not be lost (rule 4).
	heldResult bool
	// heldRecovery: status holds a recovery not yet written; lost, it is made again from the spec.
	heldRecovery bool
	// resultUnwritten is when the writes of the held result began to fail, zero while they do not;
	// resultLogged when such a failure was last logged.
	resultUnwritten, resultLogged time.Time
	// runs counts each command's runs in this execute, for its retries.
	runs map[int]int32

	// Of the current step: the action, why the node's lock is not held (shown in status), whether the
	// command runs before its Running record, its outcome, and the task read after a conflict.
	act        taskpolicy.Action
	busy       string
	late       bool
	outcome    taskpolicy.Outcome
	fresh      *v1alpha1.NodeTask
	keepResult bool

	// What execute returns.
	wait time.Duration
	err  error
}

func newTaskRun(task *v1alpha1.NodeTask, log logr.Logger) *taskRun {
	return &taskRun{log: log, task: task, status: task.Status.DeepCopy(), runs: map[int]int32{}}
}

// loop applies transitions from decide until stop.
func (s *taskRun) loop(ctx context.Context, io taskIO) (time.Duration, error) {
	for st := stepDecide; st != stepStop; {
		next, ok := transitions[st]
		if !ok {
			return 0, fmt.Errorf("agent: no transition from step %s", st)
		}
		st = next(s, ctx, io)
	}
	return s.wait, s.err
}

// view is the task as the agent acts on it: its own fields as it holds them, the manager's
// conditions as last read (a task marked AgentLost starts nothing more).
func (s *taskRun) view() *v1alpha1.NodeTask {
	v := s.task.DeepCopy()
	v.Status = *s.status.DeepCopy()
	v.Status.Conditions = s.task.Status.Conditions
	return v
}

func (s *taskRun) stop(wait time.Duration, err error) step {
	s.wait, s.err = wait, err
	return stepStop
}

func (s *taskRun) decide(_ context.Context, io taskIO) step {
	s.act, s.busy, s.late = taskpolicy.Decide(s.view()), "", false
	switch {
	case s.act.Kind == taskpolicy.ActRecover:
		return stepRecover
	case s.act.Kind == taskpolicy.ActNone && !s.heldResult && !s.heldRecovery:
		return s.stop(0, nil)
	case s.act.Kind == taskpolicy.ActStart && io.stopping():
		// A stopping agent starts nothing more; it writes the result it holds and leaves the
		// next command Pending for the agent that follows (every command has a timeout, rule 12).
		if !s.heldResult {
			return s.stop(0, nil)
		}
		s.act = taskpolicy.Action{Kind: taskpolicy.ActNone}
	}
	if holdNeeded(s.act, s.status) != holdNone {
		return stepClaim
	}
	return stepRecordRunning
}

func (s *taskRun) recover(_ context.Context, _ taskIO) step {
	// Written with the step it leads to: the retried command's Running record, or (an
	// idempotent command run before its record) its result, or the task's end.
	st, note, acted := taskpolicy.Recover(s.view(), now())
	s.status, s.heldRecovery = &st, true
	msg := "ignoring recoveryMode"
	if acted {
		clear(s.runs) // a retried command gets its retries afresh, as in a new reconcile
		msg = "acting on recoveryMode"
	}
	s.log.Info(msg, "task", s.task.Name, "note", note)
	return stepDecide
}

// claim: nothing runs, or is taken for stopped, unless the node's lock allows it.
func (s *taskRun) claim(ctx context.Context, io taskIO) step {
	ans, err := io.hold(ctx, s.task, holdNeeded(s.act, s.status))
	switch {
	case err != nil && !s.heldResult:
		return s.stop(0, err)
	case err != nil:
		s.log.Error(err, "the node's lock; writing the result held", "task", s.task.Name)
	case ans.stale || (ans.took && !ans.created && !s.heldResult):
		// The lock's last holder may have written the task: read it as it now stands.
		// A lock no task ever held has nothing to read.
		fresh, gerr := io.fresh(ctx, s.task)
		if gerr != nil || fresh == nil {
			return s.stop(0, gerr)
		}
		if ans.stale || fresh.ResourceVersion != s.task.ResourceVersion {
			// Stale: another agent finished the task under the lock, so a result this one
			// still holds is moot (keeping it would only find the task finished again).
			s.fresh, s.keepResult = fresh, false
			return stepResync
		}
	}
	if !ans.held {
		s.wait, s.busy = holdWait, ans.message
		s.act = taskpolicy.Action{Kind: taskpolicy.ActNone}
		if !s.heldResult && !s.heldRecovery && (s.busy == "" || s.status.Message == s.busy) {
			return s.stop(s.wait, nil)
		}
	}
	return stepRecordRunning
}

// recordRunning is each step's one status write. An idempotent command with nothing held starts
// before its record instead (see execute), so the common one-command task costs one write.
func (s *taskRun) recordRunning(ctx context.Context, io taskIO) step {
	next := s.status.DeepCopy()
	taskpolicy.Apply(next, &s.task.Spec, s.act, now())
	next.ObservedGeneration = s.task.Generation
	if s.busy != "" {
		// Shown by the CLI with the task; the Running record that follows clears it.
		next.Message = s.busy
	}
	if s.act.Kind == taskpolicy.ActStart {
		cmd := &s.task.Spec.Commands[s.act.Index]
		if ask := io.drainAsk(); cmd.Drain != nil && ask != nil {
			// A drain is the manager's (agents confined to their own node, rule 10): the Running record asks for it.
			next.Commands[s.act.Index].Drain = ask
		}
		// A command that drains is recorded Running first: the manager drains only for a recorded run.
		s.late = !s.heldResult && cmd.Idempotent() && cmd.Drains() == nil
	}
	if !s.late {
		err := io.writeStatus(ctx, s.task, next)
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			fresh, gerr := io.fresh(ctx, s.task)
			if gerr != nil || fresh == nil {
				return s.stop(0, gerr)
			}
			// The agent alone writes command results: a result held is kept over the new spec.
			s.fresh, s.keepResult = fresh, s.heldResult
			return stepResync
		}
		if err != nil {
			if !s.heldResult {
				return s.stop(0, err)
			}
			// A result must not be lost: keep trying until the agent stops.
			if s.resultUnwritten.IsZero() {
				s.resultUnwritten = time.Now()
			}
			delay := resultRetryDelay(err, time.Since(s.resultUnwritten))
			if time.Since(s.resultLogged) >= time.Second {
				s.resultLogged = time.Now()
				s.log.Error(err, "writing a command result; retrying", "task", s.task.Name, "in", delay)
			}
			if serr := clock.Sleep(ctx, delay); serr != nil {
				return s.stop(0, errors.Join(err, serr))
			}
			return stepDecide
		}
		s.heldRecovery, s.resultUnwritten = false, time.Time{}
	}
	s.status = next
	if s.act.Kind != taskpolicy.ActStart {
		return s.stop(s.wait, nil)
	}
	return stepRun
}

// resultRetryDelay is the pause before a held command result is written again, its writes failing
// for `failing`. While the API server is away or starting (refused connections, 503, the 401 and
// 403 of an authenticator or authorizer that has not read its objects yet), as after a command that
// restarted a single control plane's kubelet or API server, it is kubeclient.ReconnectEvery for the
// first kubeclient.ReconnectSteady: the next command starts only once the result is recorded, and
// on an upgrade's last node that start is on the path to Succeeded. Otherwise, and later, it is a
// second. Only an agent whose command ended while the API server was away asks this often.
func resultRetryDelay(err error, failing time.Duration) time.Duration {
	away := kubeclient.APIServerAway(err) || kubeclient.StartingRefusal(err)
	if away && failing < kubeclient.ReconnectSteady {
		return kubeclient.ReconnectEvery
	}
	return time.Second
}

func (s *taskRun) run(ctx context.Context, io taskIO) step {
	i := s.act.Index
	s.runs[i]++
	s.task, s.outcome = io.runCommand(ctx, s.task, s.act, s.late, s.status)
	if ctx.Err() != nil {
		// The agent is stopping: leave the command Running (or, not yet recorded, Pending), as a restart expects.
		return s.stop(0, ctx.Err())
	}
	if s.outcome.Err != nil && s.runs[i] <= s.task.Spec.Commands[i].Retries {
		s.outcome.Retry = true
	}
	return stepRecordResult
}

func (s *taskRun) recordResult(_ context.Context, _ taskIO) step {
	taskpolicy.ApplyResult(s.status, &s.task.Spec, s.act.Index, s.outcome, now())
	s.heldResult = true
	s.log.V(1).Info("command ended", "task", s.task.Name, "command", s.act.Index, "error", s.outcome.Err)
	return stepDecide
}

// resync is the one way back from a conflict (a person's spec change, the manager's condition,
// another agent's write): the task read now replaces the one held. A result held is kept when
// keepResult (the agent alone writes results); otherwise the status read replaces the agent's,
// and a recovery held is made again from the spec if it still applies.
func (s *taskRun) resync(_ context.Context, _ taskIO) step {
	s.task, s.fresh = s.fresh, nil
	if !s.keepResult {
		s.status, s.heldResult, s.heldRecovery = s.task.Status.DeepCopy(), false, false
	}
	return stepDecide
}
