// Package nodeoperation is the NodeOperation controller: it expands an operation into groups, runs
// the groups strictly in order by creating one NodeTask per node under maxUnavailable and the node
// lock, and reports progress, failures and waits in the operation's status, conditions and events.
//
// It writes only its operations' status, their NodeTasks (created under the node lock; their spec's
// mirrored controls; their finalizers) and the schedulability its own cordons left on Nodes: a task's
// status is its agent's, and a NodeProfile's tasks are not its to touch.
package nodeoperation

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/cmdgate"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/gate"
	"github.com/nodeops/nodeops/internal/hook"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/schedule"
	"github.com/nodeops/nodeops/internal/silence"
	"github.com/nodeops/nodeops/internal/statuswrite"
)

// +kubebuilder:rbac:groups=nodeops.io,resources=nodeoperations,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=nodeops.io,resources=nodeoperations/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=nodeops.io,resources=nodeoperations/finalizers,verbs=update
// +kubebuilder:rbac:groups=nodeops.io,resources=nodetasks,verbs=get;list;watch;create;patch;delete;deletecollection
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get,namespace=kube-system
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// The manager's leader election, declared here so that `make generate` sees it:
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=nodeops-system
// The budget ledger every manager writes before it creates tasks (internal/nodelock/ledger.go):
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;create;update,namespace=nodeops-system

// kind is the NodeOperation kind, as owner references and the owner index name it.
const kind = "NodeOperation"

// Reconciler reconciles NodeOperations.
type Reconciler struct {
	// Client reads from the cache and writes to the API server.
	Client client.Client
	// APIReader reads past the cache: the kubeadm-config ConfigMap (not worth caching) and tasks
	// whose create raced with the cache.
	APIReader client.Reader
	// Locks is the node lock table shared with the NodeProfile controller.
	Locks    skeleton.Locker
	Recorder events.EventRecorder
	// StatusInterval batches status writes that only move counts: at most one per interval.
	// Phase, group phase and condition changes are written at once.
	StatusInterval time.Duration
	// CreateParallelism bounds concurrent task creates.
	CreateParallelism int
	// WaitRecheck is how soon an operation waiting for another task's node looks again, in case
	// the holder's end was missed.
	WaitRecheck time.Duration
	// Now is the clock; the machine's when nil.
	Now clock.Func
	// Gates evaluates health gates; SetupWithManager sets one reading through the manager.
	Gates *gate.Checker
	// GateRecheck is how soon a gate that holds is checked again.
	GateRecheck time.Duration
	// Silences holds the Alertmanager silences of gates that ask for one; over HTTP by default.
	Silences silence.Silencer
	// SilenceLease is how far ahead a silence's end is set at each extension; silence.DefaultLease when zero.
	SilenceLease time.Duration
	// PreflightAnswer is how long a node's agent has to start its preflight task before the node
	// is listed as failing the preflight; defaultPreflightAnswer when zero.
	PreflightAnswer time.Duration
	// Sender delivers http hooks' CloudEvents; HookNamespace is where hook Jobs run and signing
	// Secrets live (hook.Namespace when empty).
	Sender        *hook.Sender
	HookNamespace string

	// status batches count-only status writes, by operation name.
	status statuswrite.Throttle

	mu sync.Mutex
	// waiters are the operations waiting for each node's lock, so that the holder's end wakes them.
	waiters map[string]map[string]bool
	// silenceEnds is when this manager last set each silence to end, by id.
	silenceEnds silence.Ends
	// cost is how long each operation's last reconcile took to observe and decide, by name (see ownTaskEvents).
	cost map[string]time.Duration
	// createErrs are the hook Jobs the API server refused, by name (see runHooks).
	createErrs map[string]error
	// createdChecks are the gate checks this manager created that the cache may not show yet.
	createdChecks cmdgate.Created
	// versions are, by operation, what this manager knows of its resourceVersions (see cacheBehind).
	versions skeleton.Versions
}

// New returns a Reconciler with default tunables.
func New(c client.Client, apiReader client.Reader, locks skeleton.Locker, recorder events.EventRecorder) *Reconciler {
	return &Reconciler{
		Client: c, APIReader: apiReader, Locks: locks, Recorder: recorder,
		StatusInterval: time.Second, CreateParallelism: 64, WaitRecheck: 5 * time.Second, GateRecheck: 10 * time.Second,
		Silences: silence.HTTP{Client: &http.Client{Timeout: 10 * time.Second}},
		Sender:   &hook.Sender{HTTP: &http.Client{Timeout: 10 * time.Second}},
	}
}

func (r *Reconciler) now() time.Time { return r.Now.Now() }

// scope is one reconcile's view of an operation.
type scope struct {
	op     *v1alpha1.NodeOperation
	before *v1alpha1.NodeOperationStatus
	tasks  []*v1alpha1.NodeTask
	// look holds the operation's gate checks (v1alpha1.IsGateCheck), kept apart from its tasks,
	// and what act does with them (internal/cmdgate).
	look cmdgate.Look
	in   input
	d    decision
	// start is when the reconcile began, for the cost that batching saves (see ownTaskEvents).
	start time.Time
	// checked are the gates evaluated in this reconcile: their lastChecked is refreshed when the status is written.
	checked []gateKey
	// silenceErr are the silences Alertmanager refused or did not answer for, by group and gate: the gate holds.
	silenceErr map[gateKey]error
	// hooks is the operation's hooks as this reconcile sees them; nil when it has none.
	hooks *hookView
}

// Reconcile follows the skeleton (internal/controller/skeleton): get, then observe, decide,
// write status and act. There is no finalizer: tasks carry an owner reference, and the node
// lock forgets deleted tasks through the informer.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	op := &v1alpha1.NodeOperation{}
	if err := r.Client.Get(ctx, req.NamespacedName, op); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.Name)
			return ctrl.Result{}, r.releaseOrphans(ctx, req.Name)
		}
		return ctrl.Result{}, err
	}
	if !op.DeletionTimestamp.IsZero() {
		// A foreground deletion waits for the tasks: nothing needs their record any more.
		tasks, err := r.ownTasks(ctx, op)
		if err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.release(ctx, &op.Status, tasks, true, false)
	}
	if op.Status.Phase.Finished() {
		return r.reconcileFinished(ctx, op)
	}
	if !r.Locks.Synced() {
		return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	if behind, err := r.cacheBehind(ctx, op); err != nil || behind {
		// Deciding on an operation older than the API server's could undo what it records.
		return ctrl.Result{RequeueAfter: skeleton.StaleRetry}, err
	}
	// The machine's clock, not r.Now: start measures the reconcile's work, which a held clock would hide.
	s := &scope{op: op, before: op.Status.DeepCopy(), start: time.Now()}
	return skeleton.Run(ctx, s, skeleton.Steps[*scope]{
		Observe:     r.observe,
		Decide:      r.decide,
		WriteStatus: r.writeStatus,
		Act:         r.act,
	})
}

// decide runs the pure decision and notes, in memory only, what it cost and which nodes the
// operation waits for, so that the holders' ends wake it.
func (r *Reconciler) decide(s *scope) {
	s.d = decide(&s.in)
	r.decideHooks(s)
	// The reconcile's own work, without the API writes that follow: what batching saves.
	r.noteCost(s.op.Name, time.Since(s.start))
	r.noteWaiting(s.op.Name, s.d.waiting)
}

// act creates the decided tasks under the node lock, mirrors the operation's controls onto its
// tasks, and asks to look again for nodes it waits for and for the TTL.
func (r *Reconciler) act(ctx context.Context, s *scope) (ctrl.Result, error) {
	var result ctrl.Result
	lost, err := r.createTasks(ctx, s.op, s.d.create, s.d.budget, s.d.waiting)
	if lost > 0 {
		r.noteWaiting(s.op.Name, s.d.waiting)
		result = skeleton.Within(result, r.WaitRecheck)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.actOnChecks(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if r.runHooks(ctx, s) {
		result = skeleton.Within(result, 100*time.Millisecond)
	}
	if err := r.mirror(ctx, s.op, s.tasks); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.keep(ctx, s.op, s.tasks); err != nil {
		return ctrl.Result{}, err
	}
	// s.op.Status is the status as last written: a deleted task goes only once its end is recorded there.
	if err := r.release(ctx, &s.op.Status, s.tasks, false, false); err != nil {
		return ctrl.Result{}, err
	}
	if len(s.d.waiting) > 0 {
		result = skeleton.Within(result, r.WaitRecheck)
	}
	if !s.d.recheck.IsZero() {
		result = skeleton.Within(result, s.d.recheck.Sub(r.now()))
	}
	if d := r.silenceRecheck(s.op.Status.Silences); d > 0 {
		result = skeleton.Within(result, d)
	}
	if s.d.status.Phase.Finished() {
		if err := r.restoreCordons(ctx, s.op); err != nil {
			return ctrl.Result{}, err
		}
		if ttl, ok := ttlLeft(s.op, &s.d.status, r.now()); ok {
			result = skeleton.Within(result, ttl)
		}
	}
	return result, nil
}

// observe gathers the operation's tasks and the cluster's nodes, resolves the plan, and checks
// the version policy before the operation starts.
func (r *Reconciler) observe(ctx context.Context, s *scope) error {
	op := s.op
	// The lock table is read before the cache: a task that is no longer a reservation in the
	// view is then always in the cache (see nodelock.View), so no created task is ever missed.
	s.in = input{op: op, now: metav1.NewTime(r.now()), gateRecheck: r.GateRecheck, preflightAnswer: r.PreflightAnswer, notReady: map[string]bool{}, cordoned: map[string]bool{}, tasks: map[string]map[string]taskView{}, locks: r.Locks.Snapshot()}
	tasks, err := r.ownTasks(ctx, op)
	if err != nil {
		return err
	}
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	for i := range nodes.Items {
		if !plan.NodeReady(&nodes.Items[i]) {
			s.in.notReady[nodes.Items[i].Name] = true
		}
		if nodes.Items[i].Spec.Unschedulable {
			s.in.cordoned[nodes.Items[i].Name] = true
		}
	}
	groups, err := plan.Resolve(&op.Spec, nodes.Items)
	if err != nil {
		s.in.fail = &failure{reason: ReasonInvalidSpec, message: err.Error()}
		return nil
	}
	s.in.groups = groups
	if s.in.timing, err = timings(op, groups); err != nil {
		s.in.fail = &failure{reason: ReasonInvalidSpec, message: err.Error()}
		return nil
	}
	if op.Status.StartTime == nil {
		// Admission cannot compile user CEL without a webhook: the first look does, before anything runs.
		if err := gate.Validate(&op.Spec); err != nil {
			s.in.fail = &failure{reason: ReasonInvalidSpec, message: err.Error()}
			return nil
		}
		if err := hook.Validate(&op.Spec); err != nil {
			s.in.fail = &failure{reason: ReasonInvalidSpec, message: err.Error()}
			return nil
		}
	}
	if op.Status.StartTime == nil && op.Spec.Upgrade != nil {
		f, err := r.checkVersion(ctx, op.Spec.Upgrade.KubernetesVersion)
		if err != nil {
			return err
		}
		if f != nil {
			s.in.fail = f
			return nil
		}
	}
	for _, t := range tasks {
		if v1alpha1.IsGateCheck(t) {
			// A gate's answer, not a node's work: no progress, no budget, no record (cmdgate.go).
			s.look.Checks = append(s.look.Checks, t)
		} else {
			s.tasks = append(s.tasks, t)
		}
	}
	s.in.checks = r.createdChecks.Own(s.look.Checks, s.in.locks)
	s.look.Owner, s.look.Own, s.look.Locks = checkOwner(op), s.in.checks, s.in.locks
	s.look.Now, s.look.Recheck = s.in.now.Time, s.in.gateRecheck
	for _, t := range s.tasks {
		if s.in.tasks[t.Spec.Group] == nil {
			s.in.tasks[t.Spec.Group] = map[string]taskView{}
		}
		s.in.tasks[t.Spec.Group][t.Spec.NodeName] = view(t)
	}
	for _, g := range groups {
		for _, node := range g.Nodes {
			if _, ok := s.in.tasks[g.Name][node]; ok {
				continue
			}
			if name := objname.TaskName(op.Name, g.Name, node); s.in.locks.IsReserved(name) {
				if s.in.tasks[g.Name] == nil {
					s.in.tasks[g.Name] = map[string]taskView{}
				}
				s.in.tasks[g.Name][node] = taskView{Name: name, Node: node, Group: g.Name, Phase: v1alpha1.TaskPending}
			}
		}
	}
	if s.in.holders, err = r.othersHolding(ctx, &s.in); err != nil {
		return err
	}
	r.holdSilences(ctx, s)
	if err := r.observeHooks(ctx, s); err != nil {
		return err
	}
	r.checkGates(ctx, s)
	return nil
}

// othersHolding reads from the cache the tasks of others that hold nodes the operation has still
// to do, so that decide can tell a wait that ends by itself from one only a person ends (a failed
// holder). Only held nodes cost a read.
func (r *Reconciler) othersHolding(ctx context.Context, in *input) (map[string]taskView, error) {
	out := map[string]taskView{}
	for i, g := range in.groups {
		if i < len(in.op.Status.Groups) && in.op.Status.Groups[i].Name == g.Name && in.op.Status.Groups[i].Phase == v1alpha1.GroupSucceeded {
			continue
		}
		for _, node := range g.Nodes {
			if _, own := in.tasks[g.Name][node]; own {
				continue
			}
			h, held := in.locks.Holder(node)
			if _, seen := out[h.Task]; !held || seen || h.Task == objname.TaskName(in.op.Name, g.Name, node) || in.checks[h.Task] {
				continue
			}
			if in.locks.IsReserved(h.Task) {
				out[h.Task] = taskView{Name: h.Task, Node: node, Phase: v1alpha1.TaskPending}
				continue
			}
			var t v1alpha1.NodeTask
			if err := r.Client.Get(ctx, client.ObjectKey{Name: h.Task}, &t, client.UnsafeDisableDeepCopy); err != nil {
				if apierrors.IsNotFound(err) {
					continue // gone: the lock table forgets it
				}
				return nil, fmt.Errorf("get NodeTask %s holding node %s: %w", h.Task, node, err)
			}
			v := view(&t)
			v.Recovering = t.Spec.RecoveryMode != ""
			out[h.Task] = v
		}
	}
	return out, nil
}

// timings compiles each group's scheduling: the group's own windows and delays where it sets
// them, else the operation's.
func timings(op *v1alpha1.NodeOperation, groups []plan.ResolvedGroup) ([]timing, error) {
	out := make([]timing, len(groups))
	for i, g := range groups {
		eff := g.Scheduling.Over(op.Spec.Scheduling)
		field := "spec.windows"
		if len(g.Windows) > 0 {
			// Only custom groups carry windows, and Resolve keeps their order.
			field = fmt.Sprintf("spec.custom.groups[%d].windows", i)
		}
		compiled, err := schedule.Compile(field, eff.Windows)
		if err != nil {
			return nil, err
		}
		out[i] = timing{windows: compiled, describe: schedule.DescribeAll(eff.Windows),
			postNode: durationOf(eff.PostNodeDelay), postGroup: durationOf(eff.PostGroupDelay), gates: eff.Gates, pauseBefore: eff.PauseBefore}
	}
	return out, nil
}

// durationOf is d, zero when unset.
func durationOf(d *metav1.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.Duration
}

// ownTasks lists the operation's tasks from the cache, read-only.
func (r *Reconciler) ownTasks(ctx context.Context, op *v1alpha1.NodeOperation) ([]*v1alpha1.NodeTask, error) {
	var list v1alpha1.NodeTaskList
	if err := r.Client.List(ctx, &list, skeleton.OwnedBy(kind, op.UID), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list tasks of NodeOperation %s: %w", op.Name, err)
	}
	out := make([]*v1alpha1.NodeTask, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

// releaseOrphans lets the tasks of a deleted operation go: the garbage collector deletes them,
// and no record is needed once the operation is gone. Gone means the API server says so (or
// holds another operation of that name): just after a start or a leader change the operations'
// cache can be behind the tasks', and a running task deleted by hand, let go unrecorded, would be
// created again by the next look (rule 7). One read, only when there is a task to let go.
func (r *Reconciler) releaseOrphans(ctx context.Context, name string) error {
	var list v1alpha1.NodeTaskList
	if err := r.Client.List(ctx, &list, client.MatchingLabels{v1alpha1.LabelOperation: objname.LabelValue(name)}, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list tasks of deleted NodeOperation %s: %w", name, err)
	}
	var tasks []*v1alpha1.NodeTask
	for i := range list.Items {
		if t := &list.Items[i]; !t.DeletionTimestamp.IsZero() && skeleton.ControllerUID(t, kind) != "" {
			tasks = append(tasks, t)
		}
	}
	// Where the operation is there after all, the cache is behind: its own reconcile records and
	// releases them.
	gone, err := skeleton.Orphans(ctx, r.APIReader, &v1alpha1.NodeOperation{}, kind, name, tasks)
	if err != nil {
		return err
	}
	return r.release(ctx, nil, gone, true, false)
}

// checkVersion applies the version policy against kube-system/kubeadm-config.
func (r *Reconciler) checkVersion(ctx context.Context, requested string) (*failure, error) {
	var cm corev1.ConfigMap
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: "kube-system", Name: "kubeadm-config"}, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return &failure{reason: ReasonNoKubeadmConfig, message: "kube-system/kubeadm-config not found: the current cluster version is unknown, so the upgrade cannot be checked against the version policy"}, nil
		}
		return nil, fmt.Errorf("read kube-system/kubeadm-config: %w", err)
	}
	current, err := plan.KubeadmConfigVersion(cm.Data["ClusterConfiguration"])
	if err != nil {
		return &failure{reason: plan.ReasonUnsupportedVersionSkew, message: fmt.Sprintf("kube-system/kubeadm-config: %v", err)}, nil
	}
	if err := plan.CheckUpgradeVersion(current, requested); err != nil {
		var skew *plan.VersionSkewError
		if errors.As(err, &skew) {
			return &failure{reason: skew.Reason(), message: skew.Error()}, nil
		}
		return &failure{reason: plan.ReasonUnsupportedVersionSkew, message: err.Error()}, nil
	}
	return nil, nil
}

func view(t *v1alpha1.NodeTask) taskView {
	v := taskView{Name: t.Name, Node: t.Spec.NodeName, Group: t.Spec.Group, Phase: t.EffectivePhase(), Message: t.Status.Message,
		Created: t.CreationTimestamp.Time, Started: len(t.Status.Commands) > 0 || t.Status.AgentHeartbeat != nil || t.Status.StartTime != nil}
	if t.Status.CompletionTime != nil {
		v.Done = t.Status.CompletionTime.Time
	}
	for i, c := range t.Status.Commands {
		if c.Phase == v1alpha1.CommandSkipped {
			v.Skipped = true
		}
		if c.Phase == v1alpha1.CommandFailed && v.FailedCommand == "" {
			v.FailedCommand = c.Name
			if v.FailedCommand == "" && i < len(t.Spec.Commands) {
				v.FailedCommand = t.Spec.Commands[i].DisplayName()
			}
			if v.Message == "" {
				v.Message = c.Message
			}
		}
	}
	if c := t.Lost(); c != nil {
		// The manager's mark (a lost agent fails its task in bounded time, rule 9): the task Failed with reason AgentLost or NodeDeleted,
		// or, a person having skipped it on a deleted node, Skipped.
		if c.Reason == v1alpha1.ReasonLostSkipped {
			v.Skipped = true
		} else if v.Phase == v1alpha1.TaskFailed {
			v.Message = c.Reason + ": " + c.Message
		}
	}
	if v.Phase == v1alpha1.TaskFailed && v.FailedCommand == "" {
		if i := int(t.Status.CurrentCommand); i >= 0 && i < len(t.Spec.Commands) {
			v.FailedCommand = t.Spec.Commands[i].DisplayName()
		} else {
			v.FailedCommand = "(unknown)"
		}
	}
	return v
}

// cacheBehind says whether the cached operation op is older than the API server's. The status
// write carries no lock (see statusRule), and the operations' informer may lag the tasks': a task
// deleted by hand is let go once the status records its end (release), and a look that then saw the
// task gone but not yet that record would write the record away and create the task again, running
// its commands twice (nothing deleted automatically, rule 7). The copy this manager's last status
// write replaced is known to be behind; one it wrote or read is known to be current; of any other
// (the first look after a start or a leader change, a person's edit) one read of the API server
// tells.
func (r *Reconciler) cacheBehind(ctx context.Context, op *v1alpha1.NodeOperation) (bool, error) {
	behind, err := r.versions.Behind(ctx, r.APIReader, op, &v1alpha1.NodeOperation{})
	if err != nil {
		return false, fmt.Errorf("NodeOperation %s: %w", op.Name, err)
	}
	return behind, nil
}

func (r *Reconciler) noteWaiting(op string, waiting map[string]nodelock.Holder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiters == nil {
		r.waiters = map[string]map[string]bool{}
	}
	for node, ops := range r.waiters {
		if _, still := waiting[node]; !still {
			delete(ops, op)
			if len(ops) == 0 {
				delete(r.waiters, node)
			}
		}
	}
	for node := range waiting {
		if r.waiters[node] == nil {
			r.waiters[node] = map[string]bool{}
		}
		r.waiters[node][op] = true
	}
}

// waitersOf returns the operations waiting for node.
func (r *Reconciler) waitersOf(node string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.waiters[node]))
	for op := range r.waiters[node] {
		out = append(out, op)
	}
	return out
}

func (r *Reconciler) forget(name string) {
	r.noteWaiting(name, nil)
	r.status.Forget(name)
	if r.Sender != nil {
		r.Sender.Forget(hook.Source(name))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.cost, name)
	r.versions.Forget(name)
}

// ttlLeft is how long until a finished operation with ttlSecondsAfterFinished is due for deletion.
func ttlLeft(op *v1alpha1.NodeOperation, st *v1alpha1.NodeOperationStatus, now time.Time) (time.Duration, bool) {
	if op.Spec.TTLSecondsAfterFinished == nil || st.CompletionTime == nil {
		return 0, false
	}
	due := st.CompletionTime.Add(time.Duration(*op.Spec.TTLSecondsAfterFinished) * time.Second)
	return due.Sub(now), true
}

// reconcileFinished restores the cordons the operation left, and deletes a finished operation and
// its tasks once its TTL has passed; nothing is deleted without a TTL (nothing deleted automatically, rule 7).
func (r *Reconciler) reconcileFinished(ctx context.Context, op *v1alpha1.NodeOperation) (ctrl.Result, error) {
	r.noteWaiting(op.Name, nil)
	if err := r.restoreCordons(ctx, op); err != nil {
		return ctrl.Result{}, err
	}
	if res, err := r.expireLeftSilences(ctx, op); err != nil || res.RequeueAfter > 0 {
		return res, err
	}
	left, ok := ttlLeft(op, &op.Status, r.now())
	if !ok || left > 0 {
		// The operation creates nothing more: tasks a person deleted may go.
		tasks, err := r.ownTasks(ctx, op)
		if err != nil {
			return ctrl.Result{}, err
		}
		if err := r.release(ctx, &op.Status, tasks, true, false); err != nil {
			return ctrl.Result{}, err
		}
	}
	if !ok {
		return ctrl.Result{}, nil
	}
	if left > 0 {
		return ctrl.Result{RequeueAfter: left}, nil
	}
	// Tasks are deleted explicitly too, so that the TTL holds where no garbage collector runs;
	// their finalizers go first.
	tasks, err := r.ownTasks(ctx, op)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.release(ctx, &op.Status, tasks, true, true); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.Client.DeleteAllOf(ctx, &v1alpha1.NodeTask{}, client.MatchingLabels{v1alpha1.LabelOperation: objname.LabelValue(op.Name)}); err != nil {
		return ctrl.Result{}, fmt.Errorf("delete tasks of expired NodeOperation %s: %w", op.Name, err)
	}
	if err := r.Client.Delete(ctx, op, client.PropagationPolicy(metav1.DeletePropagationBackground), client.Preconditions{UID: &op.UID}); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("delete expired NodeOperation %s: %w", op.Name, err)
	}
	log.FromContext(ctx).Info("deleted NodeOperation after ttlSecondsAfterFinished", "ttl", *op.Spec.TTLSecondsAfterFinished)
	return ctrl.Result{}, nil
}
