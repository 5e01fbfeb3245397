// Package nodeprofile is the NodeProfile controller: it provisions the nodes in a profile with
// install NodeTasks under maxUnavailable and the node lock, labels them only once the install
// succeeded, uninstalls nodes that leave, keeps the profile's RuntimeClasses, and reports it all
// in the profile's status. The decisions are pure functions (decide, ComputeStatus, BuildTask,
// PlanRuntimeClasses); this file reads the world and applies them.
//
// It writes only its profiles' status, their install and uninstall NodeTasks (created under the node
// lock), its label and annotation on Nodes, and its RuntimeClasses: a task's status is its agent's.
package nodeprofile

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/cmdgate"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/gate"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/schedule"
	"github.com/nodeops/nodeops/internal/silence"
	"github.com/nodeops/nodeops/internal/statuswrite"
)

// +kubebuilder:rbac:groups=nodeops.io,resources=nodeprofiles,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=nodeops.io,resources=nodeprofiles/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=nodeops.io,resources=nodeprofiles/finalizers,verbs=update
// +kubebuilder:rbac:groups=nodeops.io,resources=nodetasks,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=node.k8s.io,resources=runtimeclasses,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Finalizer keeps a deleted profile until every node it provisioned is uninstalled.
const Finalizer = "nodeops.io/profile-uninstall"

// kind is the NodeProfile kind, as owner references and the owner index name it.
const kind = "NodeProfile"

// Defaults of Reconciler's tunables.
const (
	DefaultParallelism    = 32
	DefaultStatusInterval = time.Second
	DefaultRetryAfter     = 5 * time.Second
)

// Reconciler reconciles NodeProfiles. Build it with New or SetupWithManager.
type Reconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// Lock is the node lock table shared with the NodeOperation controller.
	Lock skeleton.Locker
	// Recorder records events on profiles; nil records none.
	Recorder events.EventRecorder
	// Parallelism bounds concurrent writes (task creates, node patches) in one reconcile.
	Parallelism int
	// StatusInterval is the least time between two status writes that change only counts and
	// messages, so that thousands of nodes finishing make a handful of status writes, not thousands.
	StatusInterval time.Duration
	// RetryAfter is when to look again at nodes waiting for a lock held by another owner's task.
	RetryAfter time.Duration
	// APIReader reads past the cache: a task whose create found it already there. SetupWithManager
	// sets the manager's when nil.
	APIReader client.Reader
	// Now is the clock; the machine's when nil.
	Now clock.Func
	// Gates evaluates spec.gates; SetupWithManager sets one reading through the manager. Without
	// one, a gate cannot be evaluated and holds (rule 14).
	Gates *gate.Checker
	// GateRecheck is how soon a gate that holds is checked again.
	GateRecheck time.Duration
	// Silences holds the Alertmanager silences of gates that ask for one; over HTTP by default.
	Silences silence.Silencer
	// SilenceLease is how far ahead a silence's end is set at each extension; silence.DefaultLease when zero.
	SilenceLease time.Duration

	// patched remembers the nodes this controller patched until the cache shows the patch.
	patched *patchedNodes
	// status batches count-only status writes, by profile name.
	status statuswrite.Throttle
	// createdChecks are the gate checks this manager created that the cache may not show yet.
	createdChecks cmdgate.Created
	// silenceEnds is when this manager last set each silence to end, by id.
	silenceEnds silence.Ends
	// versions are, by profile, what this manager knows of its resourceVersions: Reconcile looks at
	// nothing on a copy older than the API server's.
	versions skeleton.Versions
}

// New returns a Reconciler with default tunables: the one place they are set.
func New(c client.Client, lock skeleton.Locker, recorder events.EventRecorder) *Reconciler {
	return &Reconciler{
		Client: c, Lock: lock, Recorder: recorder,
		Parallelism: DefaultParallelism, StatusInterval: DefaultStatusInterval, RetryAfter: DefaultRetryAfter,
		GateRecheck: DefaultGateRecheck,
		Silences:    silence.HTTP{Client: &http.Client{Timeout: 10 * time.Second}},
		patched:     newPatchedNodes(),
	}
}

// scope is one reconcile's view of one profile.
type scope struct {
	profile  *v1alpha1.NodeProfile
	orig     *v1alpha1.NodeProfile
	deleting bool
	hash     string
	// nodeRV: node -> resourceVersion in the cache, for patchedNodes.
	nodeRV map[string]string
	// tasks are the profile's tasks in the cache by name (shared with the cache: never modified),
	// for deletes and releases that must name the very object decide saw.
	tasks map[string]*v1alpha1.NodeTask

	// Observed: decide's input, the RuntimeClasses and the lock table's view.
	in             input
	runtimeClasses []nodev1.RuntimeClass
	locks          nodelock.View
	locksSynced    bool

	// Decided: invalid explains a spec the controller cannot act on (invalidErr is the error to
	// return); decided says decision is set.
	invalid    string
	invalidErr error
	decided    bool
	decision   decision
	classes    RuntimeClassChanges
	// starts are the tasks to create, chosen under maxUnavailable (plan.Select); retry is when to
	// look again at candidates whose node is held.
	starts []Start
	retry  time.Duration
	// window, when set, says that candidates wait outside the maintenance windows, and until
	// when (zero when none opens within a year).
	window    string
	nextStart time.Time
	// problems are profile-level faults for status.
	problems []string
	// pre is the decision observe made to know whether the gates need a check; decide reuses it.
	pre *decision
	// gateResults are the gates checked in this reconcile (nil: none); gates are the records for
	// status.gates; gateReason and gateMessage say why the gates hold the candidates ("" when not).
	gateResults             map[string]gate.Result
	gates                   []v1alpha1.GateStatus
	gateReason, gateMessage string
	// look holds the profile's command gate checks (v1alpha1.IsGateCheck), kept apart from its
	// tasks, and what act does with them (internal/cmdgate); about is the node about to start,
	// which a command gate without a node runs on ("" when none).
	look  cmdgate.Look
	about string
	// silences is status.silences after this look (nil: unchanged); silenceErr are the silences
	// Alertmanager refused or did not answer for, by gate: the gate holds.
	silences   *[]v1alpha1.SilenceStatus
	silenceErr map[string]error
}

// Reconcile follows the skeleton (internal/controller/skeleton): get, finalizer, then observe,
// decide, write status and act; once a deleted profile has nothing left on any node, act
// removes the finalizer instead of a status being written.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	p := &v1alpha1.NodeProfile{}
	if err := r.Client.Get(ctx, req.NamespacedName, p); err != nil {
		if apierrors.IsNotFound(err) {
			r.patched.forget(req.Name)
			r.status.Forget(req.Name)
			r.versions.Forget(req.Name)
			return ctrl.Result{}, r.releaseOrphans(ctx, req.Name)
		}
		return ctrl.Result{}, fmt.Errorf("get NodeProfile %s: %w", req.Name, err)
	}
	s := &scope{profile: p, orig: p.DeepCopy(), deleting: !p.DeletionTimestamp.IsZero(), hash: SpecHash(&p.Spec)}
	if s.deleting && !controllerutil.ContainsFinalizer(p, Finalizer) {
		return ctrl.Result{}, nil
	}
	if !s.deleting && !controllerutil.ContainsFinalizer(p, Finalizer) {
		before := p.ResourceVersion
		patch := client.MergeFromWithOptions(p.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(p, Finalizer)
		if err := r.Client.Patch(ctx, p, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer to NodeProfile %s: %w", p.Name, err)
		}
		r.versions.Wrote(p.Name, p.ResourceVersion, before)
		s.orig = p.DeepCopy()
	} else if len(p.Status.Silences) > 0 || len(silence.Gates(p.Spec.Gates)) > 0 {
		// The status write that follows is locked, so a decision on an older copy is never recorded;
		// but observe keeps the silences in Alertmanager, and a silence made on a copy that does not
		// show the one already made would be recorded nowhere and mute its node's alerts. Other
		// profiles go on: a look on such a copy only waits for the cache (a requeue in the lag after
		// every status write cost a 1,000-node profile about half a second).
		if behind, err := r.versions.Behind(ctx, r.live(), p, &v1alpha1.NodeProfile{}); err != nil || behind {
			return ctrl.Result{RequeueAfter: skeleton.StaleRetry}, err
		}
	}
	return skeleton.Run(ctx, s, skeleton.Steps[*scope]{
		Observe:     r.observe,
		Decide:      r.decide,
		WriteStatus: r.writeStatus,
		Act:         r.act,
	})
}

// observe reads the lock table's view, then the RuntimeClasses, nodes and the profile's tasks
// from the cache, into decide's input.
func (r *Reconciler) observe(ctx context.Context, s *scope) error {
	p := s.profile
	m, err := NewMembership(&p.Spec)
	if err != nil {
		s.invalid, s.invalidErr = err.Error(), reconcile.TerminalError(fmt.Errorf("NodeProfile %s: %w", p.Name, err))
		return nil
	}
	// The lock table before the cache, as the NodeOperation controller reads it.
	s.locks, s.locksSynced = r.Lock.Snapshot(), r.Lock.Synced()
	var classes nodev1.RuntimeClassList
	if err := r.Client.List(ctx, &classes); err != nil {
		return fmt.Errorf("list RuntimeClasses: %w", err)
	}
	s.runtimeClasses = classes.Items
	var nodes corev1.NodeList
	// Read-only use of the cached objects: copying thousands of nodes per reconcile is the cost to avoid.
	if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	var tasks v1alpha1.NodeTaskList
	if err := r.Client.List(ctx, &tasks, skeleton.OwnedBy(kind, p.UID), client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list NodeTasks of NodeProfile %s: %w", p.Name, err)
	}
	in := input{
		Hash:           s.hash,
		HasUninstall:   len(p.Spec.Uninstall) > 0,
		MaxUnavailable: p.Spec.MaxUnavailable,
		TTL:            p.Spec.TTLSecondsAfterFinished,
		Now:            r.Now.Now(),
		Nodes:          make([]NodeView, 0, len(nodes.Items)),
	}
	s.nodeRV = make(map[string]string, len(nodes.Items))
	for i := range nodes.Items {
		n := &nodes.Items[i]
		s.nodeRV[n.Name] = n.ResourceVersion
		v := NodeView{
			Name:     n.Name,
			Member:   !s.deleting && m.Contains(n.Labels, n.Annotations),
			Ready:    plan.NodeReady(n),
			Cordoned: n.Spec.Unschedulable,
		}
		marks(&v, n, p.Name, p.Spec.ProvisionedLabels)
		in.Nodes = append(in.Nodes, v)
	}
	s.tasks = make(map[string]*v1alpha1.NodeTask, len(tasks.Items))
	var checks []*v1alpha1.NodeTask
	for i := range tasks.Items {
		if t := &tasks.Items[i]; v1alpha1.IsGateCheck(t) {
			// A gate's answer, not a node's work: no membership, no budget, no count (internal/cmdgate).
			checks = append(checks, t)
		} else if v, ok := ViewTask(t); ok {
			in.Tasks = append(in.Tasks, v)
			s.tasks[t.Name] = t
		}
	}
	in.Tasks = addReserved(p.Name, s.hash, in.Tasks, s.locks, in.Now)
	s.in = in
	s.look = cmdgate.Look{Owner: checkOwner(p), Checks: checks, Own: r.createdChecks.Own(checks, s.locks), Locks: s.locks, Now: in.Now, Recheck: r.GateRecheck}
	r.holdSilences(ctx, s)
	if len(p.Spec.Gates) > 0 {
		// Admission cannot compile user CEL without a webhook: the manager does, before anything runs.
		if err := gate.ValidateGates("spec.gates", p.Spec.Gates); err != nil {
			s.invalid, s.invalidErr = err.Error(), reconcile.TerminalError(fmt.Errorf("NodeProfile %s: %w", p.Name, err))
			return nil
		}
		// The gates cost a check only when a task would start now were it not for them.
		if d, err := decide(in); err == nil {
			s.pre = &d
			if wantsGates(p, d) && windowsOpen(p, in.Now) {
				starts, _ := chooseStarts(p, s.hash, d, s.locks, s.locksSynced, r.RetryAfter, s.look.Own)
				if len(starts) > 0 {
					s.about = starts[0].Node
				}
				r.checkGates(ctx, s)
				r.silenceNewNodes(ctx, s, starts)
			}
		}
	}
	return nil
}

// windowsOpen reports whether the profile's windows let a task start at now; windows that cannot
// be evaluated do not (decide then reports the spec invalid).
func windowsOpen(p *v1alpha1.NodeProfile, now time.Time) bool {
	w, err := schedule.Compile("spec.windows", p.Spec.Windows)
	if err != nil {
		return false
	}
	open, _ := w.At(now)
	return open
}

// addReserved returns listed plus the profile's tasks at hash that the lock table holds as
// reservations (created, or being created, and not yet in the cache): the one answer to cache lag
// after a create, which the NodeOperation controller reads too. A reservation of a name listed
// already is that name's earlier task, as the cache still shows it.
func addReserved(profile, hash string, listed []TaskView, locks nodelock.View, now time.Time) []TaskView {
	if len(locks.Reserved) == 0 {
		return listed
	}
	seen := make(map[string]bool, len(listed))
	for _, t := range listed {
		seen[t.Name] = true
	}
	for name, node := range locks.Reserved {
		if seen[name] {
			continue
		}
		for _, a := range []Action{ActionInstall, ActionUninstall} {
			if name == TaskName(profile, a, hash, node) {
				listed = append(listed, TaskView{Name: name, Node: node, Action: a, Hash: hash, Phase: v1alpha1.TaskPending, Created: now})
			}
		}
	}
	return listed
}

// decide plans the RuntimeClasses, decides every node (the pure decide) and chooses the tasks to start
// (chooseStarts), from the scope alone.
func (r *Reconciler) decide(s *scope) {
	if s.invalid != "" {
		return
	}
	s.classes = PlanRuntimeClasses(s.profile, s.runtimeClasses, s.deleting)
	s.problems = append(s.problems, s.classes.Conflicts...)
	var d decision
	var err error
	if s.pre != nil {
		d = *s.pre
	} else {
		d, err = decide(s.in)
	}
	if err != nil {
		s.invalid, s.invalidErr = err.Error(), reconcile.TerminalError(fmt.Errorf("NodeProfile %s: %w", s.profile.Name, err))
		return
	}
	s.decision, s.decided = d, true
	s.starts, s.retry = chooseStarts(s.profile, s.hash, d, s.locks, s.locksSynced, r.RetryAfter, s.look.Own)
	windows, err := schedule.Compile("spec.windows", s.profile.Spec.Windows)
	if err != nil {
		// A window that cannot be evaluated never lets work go on.
		s.invalid, s.invalidErr = err.Error(), reconcile.TerminalError(fmt.Errorf("NodeProfile %s: %w", s.profile.Name, err))
		s.decided, s.starts = false, nil
		return
	}
	s.gates = keptGates(s.profile)
	if len(d.Starts) == 0 {
		return
	}
	if open, next := windows.At(s.in.Now); !open {
		// No new task starts outside the windows; running ones go on to their end.
		s.starts = nil
		when := "no window opens within a year"
		wait := 24 * time.Hour
		if !next.IsZero() {
			when, wait = "next opens at "+next.UTC().Format(time.RFC3339), next.Sub(s.in.Now)
		}
		s.window, s.nextStart = fmt.Sprintf("outside the maintenance windows (%s): %s", schedule.DescribeAll(s.profile.Spec.Windows), when), next
		s.retry = wait
		return
	}
	if wantsGates(s.profile, d) {
		// After the windows, the gates: while one does not pass no new task starts; running ones go on.
		v := applyGates(s.profile, s.gateResults, metav1.NewTime(s.in.Now), r.GateRecheck)
		s.gates = v.Gates
		for _, g := range v.Gates {
			if g.State == v1alpha1.GateTimedOut {
				// Blocked until a person acts: a check of this gate still running is told to abort.
				s.look.Drop("", g.Name)
			}
		}
		if v.Reason != "" {
			s.starts = nil
			s.gateReason, s.gateMessage = v.Reason, v.Message
			s.retry = 0
			if !v.Recheck.IsZero() {
				s.retry = max(v.Recheck.Sub(s.in.Now), 100*time.Millisecond)
			}
		} else {
			s.starts = gatedStarts(s.profile, s.starts, v.Gates, s.about)
		}
	}
}

// chooseStarts picks, with plan.Select, the decision's candidates that start now: a candidate
// whose node another task holds counts against maxUnavailable (budgets are cluster-wide, rule 11)
// and waits, looked at again after retryAfter, or after lockLag when the holder is the
// profile's own finished task (the lock table follows the informer a moment behind the cache).
// A node one of the profile's own gate checks (checks, by name) holds is not held: the check
// runs there so that the node may start. Nothing starts before the lock table has synced.
func chooseStarts(p *v1alpha1.NodeProfile, hash string, d decision, locks nodelock.View, synced bool, retryAfter time.Duration, checks map[string]bool) ([]Start, time.Duration) {
	if len(d.Starts) == 0 || d.Room == 0 {
		return nil, 0
	}
	if !synced {
		return nil, lockLag
	}
	owner := nodelock.ProfileOwner(p.Name)
	var retry time.Duration
	held := map[string]bool{}
	for _, st := range d.Starts {
		h, ok := locks.Holder(st.Node)
		if !ok || h.Task == TaskName(p.Name, st.Action, hash, st.Node) || checks[h.Task] {
			continue
		}
		held[st.Node] = true
		wait := retryAfter
		if h.Owner == owner {
			wait = lockLag
		}
		if retry == 0 || wait < retry {
			retry = wait
		}
	}
	return plan.Select(d.Starts, d.Limit, d.Unavailable, func(st Start) bool { return held[st.Node] }), retry
}

// act carries out the decision: RuntimeClasses, aborts, deletions, node patches and the chosen
// tasks under the node lock; once a deleted profile is done, it removes the finalizer.
func (r *Reconciler) act(ctx context.Context, s *scope) (ctrl.Result, error) {
	rcErr := r.syncRuntimeClasses(ctx, s)
	if s.invalid != "" {
		return ctrl.Result{}, errors.Join(rcErr, s.invalidErr)
	}
	res, err := r.apply(ctx, s)
	checkErr := cmdgate.Writer{Client: r.Client, Live: r.APIReader, Locks: r.Lock, Created: &r.createdChecks, Parallel: r.Parallelism}.Act(ctx, &s.look)
	if err = errors.Join(rcErr, err, checkErr); err != nil {
		return ctrl.Result{}, err
	}
	if s.deleting && s.decision.Done {
		// Every node is uninstalled: the tasks' record is not needed any more; the finalizer goes,
		// and with it the profile.
		if err := r.releaseAll(ctx, slices.Collect(maps.Values(s.tasks))); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.removeFinalizer(ctx, s)
	}
	return skeleton.LowestNonZero(res, ctrl.Result{RequeueAfter: s.retry}, ctrl.Result{RequeueAfter: s.decision.Expire},
		ctrl.Result{RequeueAfter: r.silenceRecheck(s.profile.Status.Silences)}), nil
}

// ViewTask turns a task into what decide needs; ok is false for a task the profile did not build.
func ViewTask(t *v1alpha1.NodeTask) (TaskView, bool) {
	action, hash, ok := parseGroup(t.Spec.Group)
	if !ok {
		return TaskView{}, false
	}
	var completed time.Time
	if t.Status.CompletionTime != nil {
		completed = t.Status.CompletionTime.Time
	}
	return TaskView{
		Completed: completed,
		Name:      t.Name,
		Node:      t.Spec.NodeName,
		Action:    action,
		Hash:      hash,
		Phase:     t.EffectivePhase(),
		Abort:     t.Spec.Abort,
		Created:   createdAt(t),
		Failure:   FailureMessage(t),
		Deleting:  !t.DeletionTimestamp.IsZero(),
		Kept:      controllerutil.ContainsFinalizer(t, RecordFinalizer),
	}, true
}

// CreatedAnnotation records when the profile created a task, to the nanosecond: a node's tasks
// are ordered by creation to find its latest, and creationTimestamp has whole seconds, too coarse
// now that superseded tasks are kept beside their successor.
const CreatedAnnotation = "nodeops.io/profile-task-created"

// createdAt is when the task was created: CreatedAnnotation, else its creationTimestamp.
func createdAt(t *v1alpha1.NodeTask) time.Time {
	if at, err := time.Parse(time.RFC3339Nano, t.Annotations[CreatedAnnotation]); err == nil {
		return at
	}
	return t.CreationTimestamp.Time
}

// FailureMessage explains a failed or aborted task by its failed command and that command's
// message, which is what a person needs to fix it; "" for a task that did not fail.
func FailureMessage(t *v1alpha1.NodeTask) string {
	phase := t.EffectivePhase()
	if phase != v1alpha1.TaskFailed && phase != v1alpha1.TaskAborted {
		return ""
	}
	for _, c := range t.Status.Commands {
		if c.Phase == v1alpha1.CommandFailed {
			msg := c.Message
			if msg == "" {
				msg = t.Status.Message
			}
			if msg == "" && c.ExitCode != nil {
				msg = fmt.Sprintf("exit code %d", *c.ExitCode)
			}
			return fmt.Sprintf("command %s failed: %s", c.Name, msg)
		}
	}
	switch {
	case t.Status.Message != "":
		return t.Status.Message
	case t.Status.Reason != "":
		return fmt.Sprintf("task %s: %s", phase, t.Status.Reason)
	}
	return fmt.Sprintf("task %s", phase)
}

func (r *Reconciler) event(p *v1alpha1.NodeProfile, kind, reason, action, note string) {
	if r.Recorder != nil {
		r.Recorder.Eventf(p, nil, kind, reason, action, "%s", note)
	}
}

var _ reconcile.Reconciler = &Reconciler{}

// marks sets v's Labelled, Installed and Hash from what node carries for the profile named profile.
func marks(v *NodeView, node *corev1.Node, profile string, extra []v1alpha1.ProvisionedLabel) {
	v.Installed = node.Labels[ProvisionedLabel(profile)] == v1alpha1.ProvisionedValue
	v.Labelled = v.Installed && hasProvisionedLabels(node, extra)
	v.Hash = node.Annotations[HashAnnotation(profile)]
}

// hasProvisionedLabels reports whether node carries the profile's spec.provisionedLabels, so that
// a change of them relabels provisioned nodes without installing again.
func hasProvisionedLabels(node *corev1.Node, extra []v1alpha1.ProvisionedLabel) bool {
	for _, l := range extra {
		if node.Labels[l.Key] != l.ValueOn(node.Name) {
			return false
		}
	}
	return true
}
