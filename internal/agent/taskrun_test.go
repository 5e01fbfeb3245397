package agent

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/kubeclient"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

// scriptIO plays the world for one transition: the node lock's answer, the task read after a
// conflict, the status write's error, the command's outcome. The transitions' IO against a real
// API server is covered by the envtest tests of this package.
type scriptIO struct {
	isStopping bool
	answer     holdAnswer
	holdErr    error
	read       *v1alpha1.NodeTask
	writeErr   error
	outcome    taskpolicy.Outcome

	writes []v1alpha1.NodeTaskStatus
	ran    []int
	late   []bool
}

func (f *scriptIO) stopping() bool { return f.isStopping }
func (f *scriptIO) hold(context.Context, *v1alpha1.NodeTask, holdNeed) (holdAnswer, error) {
	return f.answer, f.holdErr
}
func (f *scriptIO) fresh(context.Context, *v1alpha1.NodeTask) (*v1alpha1.NodeTask, error) {
	return f.read, nil
}
func (f *scriptIO) writeStatus(_ context.Context, task *v1alpha1.NodeTask, st *v1alpha1.NodeTaskStatus) error {
	if f.writeErr != nil {
		return f.writeErr
	}
	f.writes = append(f.writes, *st.DeepCopy())
	conds := task.Status.Conditions
	task.Status, task.ResourceVersion = *st.DeepCopy(), task.ResourceVersion+"+"
	task.Status.Conditions = conds
	return nil
}
func (f *scriptIO) drainAsk() *v1alpha1.DrainRequest { return &v1alpha1.DrainRequest{} }
func (f *scriptIO) runCommand(_ context.Context, task *v1alpha1.NodeTask, a taskpolicy.Action, late bool, _ *v1alpha1.NodeTaskStatus) (*v1alpha1.NodeTask, taskpolicy.Outcome) {
	f.ran, f.late = append(f.ran, a.Index), append(f.late, late)
	return task, f.outcome
}

func tableTask(cmds ...v1alpha1.Command) *v1alpha1.NodeTask {
	return &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: "t", Generation: 1, ResourceVersion: "1"},
		Spec:       v1alpha1.NodeTaskSpec{NodeName: "n", Commands: cmds},
	}
}

var (
	mutating   = v1alpha1.Command{Script: &v1alpha1.ScriptCommand{Inline: "x"}}
	rerunnable = v1alpha1.Command{Script: &v1alpha1.ScriptCommand{Inline: "x", Idempotent: true}}
)

// started is a task whose first command is recorded Running.
func started(cmds ...v1alpha1.Command) *v1alpha1.NodeTask {
	t := tableTask(cmds...)
	taskpolicy.Apply(&t.Status, &t.Spec, taskpolicy.Action{Kind: taskpolicy.ActStart}, now())
	return t
}

// failed is a task whose first command failed.
func failed(cmds ...v1alpha1.Command) *v1alpha1.NodeTask {
	t := started(cmds...)
	taskpolicy.ApplyResult(&t.Status, &t.Spec, 0, taskpolicy.Outcome{Err: errors.New("exit 1")}, now())
	return t
}

// holdingFirstResult is a two-command task whose first command succeeded, its result held, about
// to record the second Running.
func holdingFirstResult() *taskRun {
	s := newTaskRun(started(mutating, mutating), logr.Discard())
	taskpolicy.ApplyResult(s.status, &s.task.Spec, 0, taskpolicy.Outcome{}, now())
	s.heldResult, s.act = true, taskpolicy.Action{Kind: taskpolicy.ActStart, Index: 1}
	return s
}

var conflict = apierrors.NewConflict(schema.GroupResource{Group: "nodeops.io", Resource: "nodetasks"}, "t", errors.New("changed"))

// TestTransitions: every step of the task loop, from each situation it meets, goes to the step
// its rule says (rules 4, 8, 10 and 12); a transition removed from the table fails its rows.
func TestTransitions(t *testing.T) {
	cases := []struct {
		name  string
		from  step
		run   func() *taskRun
		io    scriptIO
		ended bool // the agent's context is done
		want  step
		check func(t *testing.T, s *taskRun, io *scriptIO)
	}{{
		name: "decide: a new task claims the node for its first command",
		from: stepDecide, run: func() *taskRun { return newTaskRun(tableTask(mutating), logr.Discard()) },
		want: stepClaim,
	}, {
		name: "decide: a finished task with nothing held stops",
		from: stepDecide, run: func() *taskRun { return newTaskRun(failed(mutating), logr.Discard()) },
		want: stepStop,
	}, {
		name: "decide: a person's recoveryMode is acted on first",
		from: stepDecide, run: func() *taskRun {
			tk := failed(mutating)
			tk.Spec.RecoveryMode = v1alpha1.RecoveryRetry
			return newTaskRun(tk, logr.Discard())
		},
		want: stepRecover,
	}, {
		name: "decide: the end of a task needs no lock and is recorded",
		from: stepDecide, run: func() *taskRun {
			tk := started(mutating)
			taskpolicy.ApplyResult(&tk.Status, &tk.Spec, 0, taskpolicy.Outcome{}, now())
			return newTaskRun(tk, logr.Discard())
		},
		want: stepRecordRunning,
	}, {
		name: "decide: a stopping agent starts nothing (rule 12)",
		from: stepDecide, io: scriptIO{isStopping: true},
		run:  func() *taskRun { return newTaskRun(tableTask(mutating), logr.Discard()) },
		want: stepStop,
	}, {
		name: "decide: a stopping agent still writes the result it holds (rule 4)",
		from: stepDecide, io: scriptIO{isStopping: true},
		run: func() *taskRun {
			s := newTaskRun(started(mutating, mutating), logr.Discard())
			taskpolicy.ApplyResult(s.status, &s.task.Spec, 0, taskpolicy.Outcome{}, now())
			s.heldResult = true
			return s
		},
		want: stepRecordRunning,
		check: func(t *testing.T, s *taskRun, _ *scriptIO) {
			if s.act.Kind != taskpolicy.ActNone {
				t.Errorf("action %v, want none: the next command stays Pending", s.act)
			}
		},
	}, {
		name: "decide: a task marked AgentLost by the manager starts nothing (rule 9)",
		from: stepDecide, run: func() *taskRun {
			tk := tableTask(mutating)
			meta.SetStatusCondition(&tk.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionAgentLost, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentLost})
			s := newTaskRun(tk, logr.Discard())
			s.status.Conditions = nil // the agent's own fields hold none: the view takes the task's
			return s
		},
		want: stepStop,
	}, {
		name: "recover: the recovery is held for the next write",
		from: stepRecover, run: func() *taskRun {
			tk := failed(mutating)
			tk.Spec.RecoveryMode = v1alpha1.RecoveryRetry
			return newTaskRun(tk, logr.Discard())
		},
		want: stepDecide,
		check: func(t *testing.T, s *taskRun, _ *scriptIO) {
			if !s.heldRecovery || s.status.Commands[0].Phase == v1alpha1.CommandFailed {
				t.Errorf("held recovery %v, command %s", s.heldRecovery, s.status.Commands[0].Phase)
			}
		},
	}, {
		name: "claim: the node's lock held, the command is recorded",
		from: stepClaim, io: scriptIO{answer: holdAnswer{held: true, took: true, created: true}},
		run:  func() *taskRun { return decided(tableTask(mutating)) },
		want: stepRecordRunning,
	}, {
		name: "claim: the node busy with another task, nothing held: wait without a write (rule 8)",
		from: stepClaim, io: scriptIO{answer: holdAnswer{}},
		run:  func() *taskRun { return decided(tableTask(mutating)) },
		want: stepStop,
		check: func(t *testing.T, s *taskRun, _ *scriptIO) {
			if s.wait != holdWait || s.err != nil {
				t.Errorf("wait %s, err %v; want %s", s.wait, s.err, holdWait)
			}
		},
	}, {
		name: "claim: the node busy, the reason is shown once",
		from: stepClaim, io: scriptIO{answer: holdAnswer{message: "node n runs task u"}},
		run:  func() *taskRun { return decided(tableTask(mutating)) },
		want: stepRecordRunning,
	}, {
		name: "claim: another agent finished the task under the lock: resync, dropping the result",
		from: stepClaim, io: scriptIO{answer: holdAnswer{stale: true}, read: failed(mutating)},
		run: func() *taskRun {
			s := decided(tableTask(mutating))
			s.heldResult = true
			return s
		},
		want: stepResync,
		check: func(t *testing.T, s *taskRun, _ *scriptIO) {
			if s.keepResult {
				t.Error("a moot result kept")
			}
		},
	}, {
		name: "claim: the lock unanswerable with nothing held: stop with the error",
		from: stepClaim, io: scriptIO{holdErr: errors.New("apiserver down")},
		run:  func() *taskRun { return decided(tableTask(mutating)) },
		want: stepStop,
		check: func(t *testing.T, s *taskRun, _ *scriptIO) {
			if s.err == nil {
				t.Error("no error")
			}
		},
	}, {
		name: "record Running: a command that is not idempotent is recorded before it runs (rule 4)",
		from: stepRecordRunning,
		run:  func() *taskRun { return decided(tableTask(mutating)) },
		want: stepRun,
		check: func(t *testing.T, s *taskRun, io *scriptIO) {
			if len(io.writes) != 1 || io.writes[0].Commands[0].Phase != v1alpha1.CommandRunning || s.late {
				t.Errorf("writes %+v, late %v", io.writes, s.late)
			}
		},
	}, {
		name: "record Running: an idempotent command with nothing held runs before its record",
		from: stepRecordRunning,
		run:  func() *taskRun { return decided(tableTask(rerunnable)) },
		want: stepRun,
		check: func(t *testing.T, s *taskRun, io *scriptIO) {
			if len(io.writes) != 0 || !s.late {
				t.Errorf("writes %d, late %v", len(io.writes), s.late)
			}
		},
	}, {
		name: "record Running: a conflict with a result held resyncs keeping it",
		from: stepRecordRunning, io: scriptIO{writeErr: conflict, read: tableTask(mutating, mutating)},
		run:  holdingFirstResult,
		want: stepResync,
		check: func(t *testing.T, s *taskRun, _ *scriptIO) {
			if !s.keepResult || s.fresh == nil {
				t.Errorf("keepResult %v, fresh %v", s.keepResult, s.fresh)
			}
		},
	}, {
		name: "record Running: a held result the API server cannot take yet is tried again, kept",
		from: stepRecordRunning, io: scriptIO{writeErr: fmt.Errorf("dial tcp 10.0.0.1:6443: %w", syscall.ECONNREFUSED)},
		run:  holdingFirstResult,
		want: stepDecide,
		check: func(t *testing.T, s *taskRun, _ *scriptIO) {
			if !s.heldResult || s.status.Commands[0].Phase != v1alpha1.CommandSucceeded || s.resultUnwritten.IsZero() {
				t.Errorf("held %v, command %s, failing since %v", s.heldResult, s.status.Commands[0].Phase, s.resultUnwritten)
			}
		},
	}, {
		name: "record Running: once the held result is written, its failures are forgotten",
		from: stepRecordRunning,
		run: func() *taskRun {
			s := holdingFirstResult()
			s.resultUnwritten = time.Now().Add(-time.Minute)
			return s
		},
		want: stepRun,
		check: func(t *testing.T, s *taskRun, io *scriptIO) {
			if len(io.writes) != 1 || !s.resultUnwritten.IsZero() {
				t.Errorf("writes %d, failing since %v", len(io.writes), s.resultUnwritten)
			}
		},
	}, {
		name: "record Running: the task's end is its last write",
		from: stepRecordRunning,
		run: func() *taskRun {
			s := newTaskRun(started(mutating), logr.Discard())
			taskpolicy.ApplyResult(s.status, &s.task.Spec, 0, taskpolicy.Outcome{}, now())
			s.heldResult, s.act = true, taskpolicy.Action{Kind: taskpolicy.ActComplete}
			return s
		},
		want: stepStop,
		check: func(t *testing.T, _ *taskRun, io *scriptIO) {
			if len(io.writes) != 1 || io.writes[0].Phase != v1alpha1.TaskSucceeded {
				t.Errorf("writes %+v", io.writes)
			}
		},
	}, {
		name: "run: the command runs, then its result is recorded",
		from: stepRun, io: scriptIO{outcome: taskpolicy.Outcome{Err: errors.New("exit 1")}},
		run:  func() *taskRun { return decided(tableTask(mutating)) },
		want: stepRecordResult,
		check: func(t *testing.T, s *taskRun, io *scriptIO) {
			if len(io.ran) != 1 || s.outcome.Retry {
				t.Errorf("ran %v, retry %v", io.ran, s.outcome.Retry)
			}
		},
	}, {
		name: "run: a command that asks for retries gets them",
		from: stepRun, io: scriptIO{outcome: taskpolicy.Outcome{Err: errors.New("exit 1")}},
		run: func() *taskRun {
			c := mutating
			c.Retries = 1
			return decided(tableTask(c))
		},
		want: stepRecordResult,
		check: func(t *testing.T, s *taskRun, _ *scriptIO) {
			if !s.outcome.Retry {
				t.Error("no retry")
			}
		},
	}, {
		name: "run: a stopping agent leaves the command as recorded",
		from: stepRun, ended: true,
		run:  func() *taskRun { return decided(tableTask(mutating)) },
		want: stepStop,
		check: func(t *testing.T, s *taskRun, _ *scriptIO) {
			if !errors.Is(s.err, context.Canceled) {
				t.Errorf("err %v", s.err)
			}
		},
	}, {
		name: "record result: held for the next write",
		from: stepRecordResult,
		run: func() *taskRun {
			s := decided(started(mutating))
			s.outcome = taskpolicy.Outcome{}
			return s
		},
		want: stepDecide,
		check: func(t *testing.T, s *taskRun, io *scriptIO) {
			if !s.heldResult || s.status.Commands[0].Phase != v1alpha1.CommandSucceeded || len(io.writes) != 0 {
				t.Errorf("held %v, command %s, writes %d", s.heldResult, s.status.Commands[0].Phase, len(io.writes))
			}
		},
	}, {
		name: "resync: keeping the result, the new spec is taken",
		from: stepResync,
		run: func() *taskRun {
			s := decided(started(mutating))
			s.status.Progress, s.heldResult, s.keepResult = "1/1", true, true
			s.fresh = tableTask(mutating)
			s.fresh.Spec.Abort = true
			return s
		},
		want: stepDecide,
		check: func(t *testing.T, s *taskRun, _ *scriptIO) {
			if !s.task.Spec.Abort || s.status.Progress != "1/1" || !s.heldResult {
				t.Errorf("abort %v, progress %q, held %v", s.task.Spec.Abort, s.status.Progress, s.heldResult)
			}
		},
	}, {
		name: "resync: dropping what is held, the status read is taken",
		from: stepResync,
		run: func() *taskRun {
			s := decided(started(mutating))
			s.heldResult, s.heldRecovery, s.keepResult = true, true, false
			s.fresh = failed(mutating)
			return s
		},
		want: stepDecide,
		check: func(t *testing.T, s *taskRun, _ *scriptIO) {
			if s.heldResult || s.heldRecovery || s.status.Phase != v1alpha1.TaskFailed {
				t.Errorf("held %v/%v, phase %s", s.heldResult, s.heldRecovery, s.status.Phase)
			}
		},
	}}
	seen := map[step]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seen[c.from] = true
			next, ok := transitions[c.from]
			if !ok {
				t.Fatalf("no transition from step %s", c.from)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.ended {
				cancel()
			}
			s, io := c.run(), c.io
			if got := next(s, ctx, &io); got != c.want {
				t.Fatalf("from %s: went to %s, want %s", c.from, got, c.want)
			}
			if c.check != nil {
				c.check(t, s, &io)
			}
		})
	}
	for st := range stepNames {
		if st != stepStop && !seen[st] {
			t.Errorf("step %s has no row in this table", st)
		}
	}
}

// decided is a run whose policy chose the task's next action.
func decided(tk *v1alpha1.NodeTask) *taskRun {
	s := newTaskRun(tk, logr.Discard())
	s.act = taskpolicy.Decide(s.view())
	return s
}

// TestAHeldResultIsTriedAgainQuicklyWhileTheAPIServerRestarts: a command result the API server
// cannot take because it is away or starting (a single control plane's restart after the kubelet's)
// is written again every quarter second for the first half minute, as the manager's caches ask; a
// result the API server refused for another reason, or after that, once a second.
func TestAHeldResultIsTriedAgainQuicklyWhileTheAPIServerRestarts(t *testing.T) {
	gr := schema.GroupResource{Group: "nodeops.io", Resource: "nodetasks"}
	refused := fmt.Errorf("dial tcp 10.0.0.1:6443: %w", syscall.ECONNREFUSED)
	cases := []struct {
		name    string
		err     error
		failing time.Duration
		want    time.Duration
	}{
		{"connection refused, at once", refused, 0, kubeclient.ReconnectEvery},
		{"connection refused, 29 s on", refused, 29 * time.Second, kubeclient.ReconnectEvery},
		{"connection refused, half a minute on", refused, kubeclient.ReconnectSteady, time.Second},
		{"503 of a starting API server", apierrors.NewServiceUnavailable("starting"), time.Second, kubeclient.ReconnectEvery},
		{"403 before the authorizer has read RBAC", apierrors.NewForbidden(gr, "t", errors.New("not yet")), time.Second, kubeclient.ReconnectEvery},
		{"401 before the authenticator is ready", apierrors.NewUnauthorized("not yet"), time.Second, kubeclient.ReconnectEvery},
		{"429 of a busy API server", apierrors.NewTooManyRequests("busy", 1), 0, time.Second},
		{"500", apierrors.NewInternalError(errors.New("etcd")), 0, time.Second},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Group: "nodeops.io", Kind: "NodeTask"}, "t", nil), 0, time.Second},
	}
	for _, c := range cases {
		if got := resultRetryDelay(c.err, c.failing); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
