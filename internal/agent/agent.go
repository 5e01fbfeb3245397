// Package agent executes NodeTasks on their nodes and is the only writer of their command results: it
// records each non-idempotent command Running before it starts (an idempotent one once it has run
// for a second) and every result after it ends, resumes safely after a restart, honours
// approvals, DryRun, pause and abort, and acts on a person's recoveryMode (docs/design.md,
// a failure blocks until a person decides and intent recorded before action, rules 3 and 4). What it does is decided by package taskpolicy; this package does it.
//
// It may touch only its own node and its own node's tasks (agents confined to their own node, rule 10):
// it never creates or deletes a NodeTask, never evicts a pod (the manager drains), never reads a Secret
// through the API, and of a task's status it writes only its own fields, never the manager's conditions.
package agent

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/redact"
	"github.com/nodeops/nodeops/internal/statuswrite"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

// DefaultHeartbeat is how often the agent renews status.agentHeartbeat while a command runs.
const DefaultHeartbeat = 15 * time.Second

// DefaultRecordRunningAfter is how long an idempotent command runs before the agent records it
// Running (see execute).
const DefaultRecordRunningAfter = time.Second

// Reconciler executes the NodeTasks of the nodes it serves.
type Reconciler struct {
	// CAServer serves a rotation's staged authorities to other control planes' agents; nil: none.
	CAServer commands.CAServer
	// ServiceAccountToken is the agent's own token, for copyCertificateAuthorities; nil: none.
	ServiceAccountToken func() (string, error)
	// Client reads NodeTasks from the label-selected cache and writes their status.
	Client client.Client
	// Direct reads and writes without a cache: fresh NodeTasks, the node, its pods.
	Direct client.Client
	// API makes raw requests (/readyz, an authorized read) for waitNodeReady's controlPlane.
	API rest.Interface
	// Serves says whether this agent executes tasks of a node.
	Serves func(node string) bool
	// HostFor is the host of a node; nil with Noop.
	HostFor func(node string) *host.Host
	// Noop: record every command and succeed without touching anything (sim nodes).
	Noop      bool
	Heartbeat time.Duration
	HTTP      *http.Client
	// Poll is passed to waiting commands; zero for their default.
	Poll time.Duration
	// RecordRunningAfter: an idempotent command is recorded Running only once it has run this
	// long; zero for DefaultRecordRunningAfter.
	RecordRunningAfter time.Duration
	// AgentPod is the agent's own pod, which the manager's drain spares when it asks for one.
	AgentPod types.NamespacedName
	// DefaultTimeout is the timeout of a command that sets none; nil for its kind's DefaultTimeout.
	DefaultTimeout func(v1alpha1.CommandKind) time.Duration
	// Stopping is closed when the agent is told to stop: no command starts after it, while running
	// ones go on in the reconcile's context (every command has a timeout, rule 12). Nil: never.
	Stopping <-chan struct{}
	// Identity names this agent in the node lock files it writes (see Options.Identity).
	Identity string
	// LockFile is the path of a node's lock file (nodehold.go).
	LockFile func(node string) string
	// Namespace is the agent's own: its pod commands' pods are there; empty for DefaultLeaseNamespace.
	Namespace string
	// ImagePullGrace is how long a pod command's image may fail to pull; zero for commands.DefaultImagePullGrace.
	ImagePullGrace time.Duration
	// KubeletRootDir is where scripts read their Secrets on the host (Options.KubeletRootDir).
	KubeletRootDir string
	// SecretMountWait bounds a script's wait for its Secrets; zero for commands.DefaultSecretMountWait.
	SecretMountWait time.Duration

	mu sync.Mutex
	// written is the resourceVersion of the agent's last status write per task: a cached task at
	// another version may not show that write yet, so it is read again from the API.
	written map[types.UID]string
	// running counts tasks being worked on, for --exit-when-idle; worked counts every start of
	// work on a task, so the drift reader knows a task came and went between two of its looks.
	running int
	worked  uint64
	// nodes are the node locks this agent took last, by node; instance tells this process's
	// writes in them from another's.
	nodes    map[string]heldNode
	instance string
	// prefetches are downloads for a task's next command, made while the one before runs, by task name.
	prefetches map[string]heldPrefetch
}

// Reconcile runs the task's commands in order until it finishes or has to wait.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	task := &v1alpha1.NodeTask{}
	if err := r.Client.Get(ctx, req.NamespacedName, task); err != nil {
		if apierrors.IsNotFound(err) {
			r.releaseGone(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !r.Serves(task.Spec.NodeName) {
		return ctrl.Result{}, nil
	}
	if r.stale(task) {
		if err := r.Direct.Get(ctx, req.NamespacedName, task); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
	}
	if taskpolicy.Decide(task).Kind == taskpolicy.ActNone {
		r.forgetIfFinished(task)
		r.releaseIfFinished(task)
		return ctrl.Result{}, r.showLeftAlone(ctx, task)
	}
	// Counted before the stop is looked at, so that a stop waiting for Busy to end sees this one.
	r.setRunning(1)
	defer r.setRunning(-1)
	if r.stopping() {
		return ctrl.Result{}, nil
	}
	wait, err := r.execute(ctx, task)
	return ctrl.Result{RequeueAfter: wait}, err
}

// showLeftAlone records in status.observedGeneration that the agent saw a spec generation of a
// task not yet started and decided to do nothing (paused), so that a person or a test can tell
// "nothing happened" from "not yet looked at". A started task is its holder's to write (exclusion
// that cannot be bypassed, rule 8), and each of its writes shows the generation already; a conflict
// means a newer write, which comes back here.
func (r *Reconciler) showLeftAlone(ctx context.Context, task *v1alpha1.NodeTask) error {
	p := task.EffectivePhase()
	if task.Status.ObservedGeneration >= task.Generation || (p != "" && p != v1alpha1.TaskPending) || task.Status.StartTime != nil {
		return nil
	}
	st := task.Status.DeepCopy()
	st.ObservedGeneration = task.Generation
	if err := r.writeStatus(ctx, task, st); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		return fmt.Errorf("recording generation %d of task %s as seen: %w", task.Generation, task.Name, err)
	}
	return nil
}

func (r *Reconciler) stopping() bool {
	select {
	case <-r.Stopping:
		return true
	default:
		return false
	}
}

func (r *Reconciler) stale(task *v1alpha1.NodeTask) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rv, ok := r.written[task.UID]
	return ok && rv != task.ResourceVersion
}

func (r *Reconciler) remember(task *v1alpha1.NodeTask) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.written == nil {
		r.written = map[types.UID]string{}
	}
	r.written[task.UID] = task.ResourceVersion
}

func (r *Reconciler) forgetIfFinished(task *v1alpha1.NodeTask) {
	if task.EffectivePhase().Unfinished() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.written, task.UID)
}

func (r *Reconciler) setRunning(d int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running += d
	if d > 0 {
		r.worked += uint64(d)
	}
}

// Worked counts the times the agent began working on a task since it started.
func (r *Reconciler) Worked() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.worked
}

// Busy reports whether a task is being worked on.
func (r *Reconciler) Busy() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running > 0
}

func now() metav1.MicroTime { return metav1.NewMicroTime(time.Now()) }

// execute is the task's loop, a state machine (taskrun.go): each round is one status write (the
// result of the command before it, or a recovery, merged with the next command's Running record,
// approval wait or the task's end), then the command.
//
// The Running record exists so that an agent that stops mid-command never runs a non-idempotent
// command twice. An idempotent command may safely run again, so when nothing else is waiting to be
// written it starts before its record, which is written only if the command runs longer than
// RecordRunningAfter: a quick idempotent command, the common one-command task, costs one status
// write instead of two. A recovery waits for the next write in the same way: unlike a result, it
// may be lost, since a restarted agent makes it again from the spec.
func (r *Reconciler) execute(ctx context.Context, task *v1alpha1.NodeTask) (wait time.Duration, err error) {
	return newTaskRun(task, log.FromContext(ctx).WithValues("node", task.Spec.NodeName)).loop(ctx, r)
}

func (r *Reconciler) drainAsk() *v1alpha1.DrainRequest {
	if r.Noop {
		return nil
	}
	return r.drainRequest()
}

func (r *Reconciler) runCommand(ctx context.Context, task *v1alpha1.NodeTask, a taskpolicy.Action, late bool, status *v1alpha1.NodeTaskStatus) (*v1alpha1.NodeTask, taskpolicy.Outcome) {
	if late {
		return r.runRecordingLate(ctx, task, a, status)
	}
	return task, r.run(ctx, task, a)
}

// fresh reads the task from the API; nil without an error when it is gone.
func (r *Reconciler) fresh(ctx context.Context, task *v1alpha1.NodeTask) (*v1alpha1.NodeTask, error) {
	fresh := &v1alpha1.NodeTask{}
	if err := r.Direct.Get(ctx, client.ObjectKeyFromObject(task), fresh); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading task %s: %w", task.Name, err)
	}
	return fresh, nil
}

// runRecordingLate runs idempotent command a.Index before its Running record (in status), and
// writes that record only if the command is still running after RecordRunningAfter. It returns
// the task as last written and the command's outcome.
func (r *Reconciler) runRecordingLate(ctx context.Context, task *v1alpha1.NodeTask, a taskpolicy.Action, status *v1alpha1.NodeTaskStatus) (*v1alpha1.NodeTask, taskpolicy.Outcome) {
	done := make(chan taskpolicy.Outcome, 1)
	ended := make(chan struct{})
	go func(t *v1alpha1.NodeTask) {
		done <- r.run(ctx, t, a)
		close(ended)
	}(task.DeepCopy())
	after := r.RecordRunningAfter
	if after <= 0 {
		after = DefaultRecordRunningAfter
	}
	timer := time.NewTimer(after)
	defer timer.Stop()
	select {
	case <-ended:
		return task, <-done
	case <-timer.C:
	}
	for ctx.Err() == nil {
		err := r.writeStatus(ctx, task, status)
		if err == nil || apierrors.IsNotFound(err) {
			break
		}
		if apierrors.IsConflict(err) {
			// A person changed the spec (pause, abort) or the heartbeat wrote: keep this record, take the new spec.
			fresh, gerr := r.fresh(ctx, task)
			if gerr == nil && fresh == nil {
				break // deleted: the result's write finds that out
			}
			if gerr == nil {
				task = fresh
				continue
			}
			err = gerr
		}
		log.FromContext(ctx).Error(err, "recording a running command; retrying", "task", task.Name)
		select {
		case <-ended:
			// The result, written next, supersedes the record.
			return task, <-done
		case <-time.After(time.Second):
		}
	}
	<-ended
	return task, <-done
}

// recordRule is how the agent records a step (intent recorded before action, rule 4): its fields
// of status (NodeTaskStatus says which are whose; conditions are the manager's, and the admission
// policy refuses an agent's write that changes them) under a lock, so that a record decided on a
// task older than the API server's is refused and the loop resyncs (agent.(*taskRun).resync).
var recordRule = statuswrite.Rule{Kind: "NodeTask", Fields: statuswrite.AllButConditions, Lock: true}

// signRule is how the agent shows a running command is alive (the heartbeat) or what it waits for
// (a note): only the field that changed, without a lock, so that a sign never conflicts with the
// agent's own records nor sets one back.
var signRule = statuswrite.Rule{Kind: "NodeTask", Fields: statuswrite.AllButConditions, Changed: true}

// writeStatus writes the agent's fields of status over task (statuswrite.Write under recordRule),
// and updates task on success; a conflict or a task gone comes back as the API server's error.
func (r *Reconciler) writeStatus(ctx context.Context, task *v1alpha1.NodeTask, status *v1alpha1.NodeTaskStatus) error {
	obj := task.DeepCopy()
	obj.Status = *status.DeepCopy()
	obj.Status.Conditions = task.Status.Conditions
	if _, _, err := statuswrite.Write(ctx, r.Client, recordRule, nil, statuswrite.Change{Orig: task, Obj: obj, Urgent: true}); err != nil {
		return err
	}
	*task = *obj
	r.remember(task)
	r.releaseIfFinished(task)
	return nil
}

// sign writes one of the agent's signs on a running task (signRule): set changes a bare task.
func (r *Reconciler) sign(ctx context.Context, task string, set func(*v1alpha1.NodeTaskStatus)) error {
	orig := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: task}}
	obj := orig.DeepCopy()
	set(&obj.Status)
	_, _, err := statuswrite.Write(ctx, r.Client, signRule, nil, statuswrite.Change{Orig: orig, Obj: obj, Urgent: true})
	return err
}

// run runs command a.Index once, renewing the heartbeat meanwhile.
func (r *Reconciler) run(ctx context.Context, task *v1alpha1.NodeTask, a taskpolicy.Action) taskpolicy.Outcome {
	cmd := &task.Spec.Commands[a.Index]
	// Every string recorded from this run goes through secrets (docs/operations/security.md, "Secrets for scripts").
	secrets := &redact.Secrets{}
	tail := &tailBuffer{secrets: secrets}
	if a.Rerun {
		_, _ = fmt.Fprintln(tail, "running again: the agent was interrupted while this command ran")
	}
	if r.Noop {
		return taskpolicy.Outcome{Message: fmt.Sprintf("noop host: %s recorded, nothing run", cmd.Kind())}
	}
	timeout := r.timeout(cmd)
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stop := r.heartbeat(ctx, task)
	env := &commands.Env{
		NodeName:        task.Spec.NodeName,
		Operation:       task.Spec.Operation,
		Task:            task.Name,
		TaskUID:         task.UID,
		CommandIndex:    a.Index,
		Namespace:       r.namespace(),
		ImagePullGrace:  r.ImagePullGrace,
		Owner:           taskpolicy.OwnerOfTask(task),
		DryRun:          task.Spec.ExecutionMode == v1alpha1.ExecutionDryRun,
		Host:            r.HostFor(task.Spec.NodeName),
		Client:          r.Direct,
		API:             r.API,
		HTTP:            r.HTTP,
		Out:             tail,
		Poll:            r.Poll,
		Secrets:         secrets,
		KubeletRootDir:  r.KubeletRootDir,
		SecretMountWait: r.SecretMountWait,
		Note:            func(m string) { r.note(ctx, task, secrets.String(m)) },
		Waits:           &commands.Waits{},

		CAServer:            r.CAServer,
		ServiceAccountToken: r.ServiceAccountToken,
	}
	if cmd.Drains() != nil {
		// Such a command is never run before its Running record, so task.Status is this run's.
		env.Drainer = r.drainerFor(task, a.Index)
	}
	env.Prefetch = r.takePrefetch(task, a.Index)
	defer env.Prefetch.Discard() // what the command did not take
	if j, b := prefetchDuring(task, a.Index); b != nil {
		r.keepPrefetch(task, commands.StartPrefetch(ctx, env, j, b))
	}
	res, err := commands.Run(cctx, env, cmd)
	stop()
	o := taskpolicy.Outcome{Err: err, Message: secrets.String(res.Message), Certs: res.Certificates, CAServer: res.CAServer, Waits: env.Waits.List()}
	if err != nil {
		o.ExitCode = int32(host.ExitCode(err)) //nolint:gosec // exit codes are small
		if cctx.Err() != nil && ctx.Err() == nil {
			o.Err = fmt.Errorf("timed out after %s: %w", timeout, err)
		}
		o.Err = secrets.Error(o.Err)
		_, _ = fmt.Fprintf(tail, "error: %v\n", o.Err)
	}
	o.Tail = tail.String()
	return o
}

// prefetchDuring names the installBinaries command whose binaries the agent downloads while
// command i runs: the one right after a kubeadm upgrade, which runs for minutes and writes nothing
// in /usr/bin (commands.Prefetch). Only where the next command runs without a person's approval
// (Auto): nothing is written on the node for a command not yet approved, not even a download.
func prefetchDuring(task *v1alpha1.NodeTask, i int) (int, *v1alpha1.InstallBinariesCommand) {
	cmds := task.Spec.Commands
	if task.Spec.ExecutionMode != v1alpha1.ExecutionAuto || i+1 >= len(cmds) ||
		(cmds[i].KubeadmUpgradeApply == nil && cmds[i].KubeadmUpgradeNode == nil) {
		return 0, nil
	}
	return i + 1, cmds[i+1].InstallBinaries
}

// heldPrefetch is a download for the next command of the task it names.
type heldPrefetch struct {
	uid types.UID
	p   *commands.Prefetch
}

// keepPrefetch holds p for the task's next command, in place of any earlier one.
func (r *Reconciler) keepPrefetch(task *v1alpha1.NodeTask, p *commands.Prefetch) {
	if p == nil {
		return
	}
	r.mu.Lock()
	old := r.prefetches[task.Name]
	if r.prefetches == nil {
		r.prefetches = map[string]heldPrefetch{}
	}
	r.prefetches[task.Name] = heldPrefetch{uid: task.UID, p: p}
	r.mu.Unlock()
	old.p.Discard()
}

// takePrefetch hands over what was downloaded for command i of the task; nil when nothing was, and
// what was downloaded for another command (or an earlier task of the same name) is removed.
func (r *Reconciler) takePrefetch(task *v1alpha1.NodeTask, i int) *commands.Prefetch {
	h := r.dropPrefetch(task.Name)
	if h.p != nil && (h.uid != task.UID || h.p.Index != i) {
		h.p.Discard()
		return nil
	}
	return h.p
}

// dropPrefetch stops holding the named task's download and returns it.
func (r *Reconciler) dropPrefetch(task string) heldPrefetch {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.prefetches[task]
	delete(r.prefetches, task)
	return h
}

// timeout bounds a command: its own timeout, or its kind's default (every command has a timeout, rule 12).
func (r *Reconciler) timeout(cmd *v1alpha1.Command) time.Duration {
	if r.DefaultTimeout != nil && (cmd.Timeout == nil || cmd.Timeout.Duration <= 0) {
		if k := cmd.Spec(); k != nil {
			return r.DefaultTimeout(k)
		}
	}
	return cmd.EffectiveTimeout()
}

// note shows a running command's wait in the task's status.message (the CLI shows it with the task),
// one sign (signRule); the command's result replaces it. A failed write only goes to the log: the
// command goes on.
func (r *Reconciler) note(ctx context.Context, task *v1alpha1.NodeTask, message string) {
	err := r.sign(ctx, task.Name, func(st *v1alpha1.NodeTaskStatus) { st.Message = message })
	if err != nil && ctx.Err() == nil {
		log.FromContext(ctx).Error(err, "showing a running command's wait", "task", task.Name, "message", message)
	}
}

// heartbeat renews status.agentHeartbeat until stop is called.
func (r *Reconciler) heartbeat(ctx context.Context, task *v1alpha1.NodeTask) (stop func()) {
	every := r.heartbeatEvery()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				ts := now()
				if err := r.sign(ctx, task.Name, func(st *v1alpha1.NodeTaskStatus) { st.AgentHeartbeat = &ts }); err != nil && ctx.Err() == nil {
					log.FromContext(ctx).Error(err, "heartbeat", "task", task.Name)
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}

func (r *Reconciler) heartbeatEvery() time.Duration {
	if r.Heartbeat <= 0 {
		return DefaultHeartbeat
	}
	return r.Heartbeat
}

// NodeServer says which nodes an agent serves: one by name, or every node with a prefix.
func NodeServer(name, prefix string) func(string) bool {
	if prefix != "" {
		return func(n string) bool { return strings.HasPrefix(n, prefix) }
	}
	return func(n string) bool { return n == name }
}

// namespace is the agent's own: its pod commands' pods are there.
func (r *Reconciler) namespace() string {
	if r.Namespace == "" {
		return DefaultLeaseNamespace
	}
	return r.Namespace
}
