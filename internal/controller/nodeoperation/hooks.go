package nodeoperation

import (
	"context"
	"fmt"
	"sort"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/hook"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/plan"
)

// Hook Jobs run in nodeops-hooks, and http hooks' signing keys are read from the one Secret
// nodeops-hooks/nodeops-hook-signing, by name, past the cache: no other Secret, no list or watch.
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create;delete,namespace=nodeops-hooks
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get,resourceNames=nodeops-hook-signing,namespace=nodeops-hooks

// Reasons of an operation held or blocked by its hooks.
const (
	// ReasonWaitingForHook: a hook runs, and the step after it waits for its success.
	ReasonWaitingForHook = "WaitingForHook"
	// ReasonHookFailed: a hook failed, could not be run, or did not answer within its timeout;
	// a person retries or skips it (kubectl nodeops retry|skip OP --hook NAME).
	ReasonHookFailed = "HookFailed"
)

// hookView is one reconcile's view of the operation's hooks: the runs as advanced by what the
// Jobs and receivers said, and what the decision after them may still add.
type hookView struct {
	on   bool
	runs map[hook.Key]*v1alpha1.HookRun
	// order is the runs' keys in the order first recorded.
	order []hook.Key
	jobs  map[string]*batchv1.Job
	// recheck is when a running hook needs a look that no watch brings (a timeout, a retry).
	recheck time.Time
	// waiting names a hook the step after it waits for, for the condition's message.
	waiting string
}

// hooksOf is the hooks of the group named group, its own over the operation's.
func hooksOf(op *v1alpha1.NodeOperation, groups []plan.ResolvedGroup, group string) *v1alpha1.Hooks {
	for i := range groups {
		if groups[i].Name == group {
			return groups[i].Hooks.Over(op.Spec.Hooks)
		}
	}
	return op.Spec.Hooks
}

// hooksAt is the list of hooks a run at k goes through: a failed node's run only tells the
// http hooks (a Job runs after a success).
func hooksAt(op *v1alpha1.NodeOperation, groups []plan.ResolvedGroup, k hook.Key) []v1alpha1.Hook {
	all := hooksOf(op, groups, k.Group).At(k.Point)
	if k.Outcome != hook.OutcomeFailed {
		return all
	}
	var out []v1alpha1.Hook
	for _, h := range all {
		if h.HTTP != nil {
			out = append(out, h)
		}
	}
	return out
}

// hasHooks reports whether the operation or a group of it declares a hook.
func hasHooks(op *v1alpha1.NodeOperation, groups []plan.ResolvedGroup) bool {
	if !op.Spec.Hooks.Empty() {
		return true
	}
	for i := range groups {
		if !groups[i].Hooks.Empty() {
			return true
		}
	}
	return false
}

// observeHooks advances the recorded hook runs by what their Jobs and receivers say (delivering
// the events due now), starts the post-node runs of tasks that succeeded (or failed, for http
// hooks), and shows a node whose post-node hooks have not all succeeded as still running (or
// failed): it counts against maxUnavailable and its group has not succeeded. An operation
// without hooks costs nothing here.
func (r *Reconciler) observeHooks(ctx context.Context, s *scope) error {
	op := s.op
	if s.in.fail != nil || (!hasHooks(op, s.in.groups) && len(op.Status.Hooks) == 0) {
		return nil
	}
	hv := &hookView{on: true, runs: map[hook.Key]*v1alpha1.HookRun{}, jobs: map[string]*batchv1.Job{}}
	s.hooks = hv
	var jobs batchv1.JobList
	if err := r.Client.List(ctx, &jobs, client.InNamespace(r.hookNamespace()), client.MatchingLabels{v1alpha1.LabelOperation: objname.LabelValue(op.Name)}); err != nil {
		return fmt.Errorf("list hook Jobs of NodeOperation %s: %w", op.Name, err)
	}
	for i := range jobs.Items {
		if j := &jobs.Items[i]; metav1.IsControlledBy(j, op) {
			hv.jobs[j.Name] = j
		}
	}
	now := s.in.now.Time
	for i := range op.Status.Hooks {
		run := op.Status.Hooks[i].DeepCopy()
		k := hook.KeyOf(run)
		hv.runs[k], hv.order = run, append(hv.order, k)
		if op.Spec.Abort {
			continue
		}
		r.advance(ctx, s, run, hooksAt(op, s.in.groups, k), now)
	}
	// Post-node runs: a task that succeeded is not done until its post-node hooks are.
	for i := range s.in.groups {
		g := &s.in.groups[i]
		if g.Name == plan.GroupPreflight || groupSucceeded(&op.Status, g.Name) {
			continue
		}
		post := hooksOf(op, s.in.groups, g.Name).At(v1alpha1.HookPostNode)
		if len(post) == 0 {
			continue
		}
		for node, t := range s.in.tasks[g.Name] {
			outcome := ""
			switch t.Phase {
			case v1alpha1.TaskSucceeded:
				outcome = hook.OutcomeSucceeded
			case v1alpha1.TaskFailed:
				outcome = hook.OutcomeFailed
			default:
				continue
			}
			k := hook.Key{Point: v1alpha1.HookPostNode, Group: g.Name, Node: node, Outcome: outcome}
			list := hooksAt(op, s.in.groups, k)
			if len(list) == 0 {
				continue
			}
			run := hv.runs[k]
			if run == nil && !op.Spec.Abort {
				run = hv.start(k, list, s.in.now)
			}
			if outcome != hook.OutcomeSucceeded || run == nil {
				continue
			}
			switch run.State {
			case v1alpha1.HookRunning:
				t.Phase = v1alpha1.TaskRunning
			case v1alpha1.HookFailed:
				t.Phase, t.FailedCommand, t.Message = v1alpha1.TaskFailed, "postNode hook "+run.Hook, run.Message
			}
			s.in.tasks[g.Name][node] = t
		}
	}
	return nil
}

func groupSucceeded(st *v1alpha1.NodeOperationStatus, group string) bool {
	for i := range st.Groups {
		if st.Groups[i].Name == group {
			return st.Groups[i].Phase == v1alpha1.GroupSucceeded
		}
	}
	return false
}

// start records a new run at k, its first hook running from now.
func (hv *hookView) start(k hook.Key, list []v1alpha1.Hook, now metav1.Time) *v1alpha1.HookRun {
	run := &v1alpha1.HookRun{Point: k.Point, Group: k.Group, Node: k.Node, Outcome: k.Outcome,
		Hook: list[0].Name, State: v1alpha1.HookRunning, Attempt: 1, Since: now}
	hv.runs[k], hv.order = run, append(hv.order, k)
	hv.soon(now.Time)
	return run
}

// soon asks for a look shortly: a new run's event is delivered by the next reconcile.
func (hv *hookView) soon(now time.Time) {
	hv.due(now.Add(100 * time.Millisecond))
}

func (hv *hookView) due(t time.Time) {
	if hv.recheck.IsZero() || t.Before(hv.recheck) {
		hv.recheck = t
	}
}

// advance moves run on by a person's retry or skip and by its current hook's result, hook after
// hook, until one is still running or has failed. A hook that cannot be run, fails, or has no
// result within its timeout fails the run: no hook passes by default (rule 14).
func (r *Reconciler) advance(ctx context.Context, s *scope, run *v1alpha1.HookRun, list []v1alpha1.Hook, now time.Time) {
	hv, ann := s.hooks, s.op.Annotations
	if int(run.Index) >= len(list) {
		return // a spec without this hook any more cannot happen (hooks are immutable): leave the record
	}
	if run.State == v1alpha1.HookFailed {
		if v := ann[v1alpha1.AnnotationRetryHookPrefix+run.Hook]; v != "" && v != run.Acted {
			run.Acted, run.State, run.Attempt, run.Since, run.Message = v, v1alpha1.HookRunning, run.Attempt+1, metav1.NewTime(now), ""
			hv.soon(now)
			return
		} else if v := ann[v1alpha1.AnnotationSkipHookPrefix+run.Hook]; v != "" && v != run.Acted {
			run.Acted = v
			nextHook(run, list, now, "hook "+run.Hook+" skipped by a person")
		}
	}
	for run.State == v1alpha1.HookRunning {
		h := &list[run.Index]
		done, ok, msg := r.result(ctx, s, run, h, now)
		if !done {
			timeout := 10 * time.Minute
			if h.Timeout != nil {
				timeout = h.Timeout.Duration
			}
			if deadline := run.Since.Add(timeout); !now.Before(deadline) {
				run.State, run.Message = v1alpha1.HookFailed, truncate(fmt.Sprintf("no result within its timeout (%s): %s", timeout, msg), 1024)
			} else {
				hv.due(deadline)
			}
			return
		}
		if !ok {
			run.State, run.Message = v1alpha1.HookFailed, truncate(msg, 1024)
			return
		}
		nextHook(run, list, now, msg)
		if run.State == v1alpha1.HookRunning {
			hv.soon(now)
			return // the next hook's Job or event goes after this is recorded
		}
	}
}

// nextHook moves run past its current hook: to the next one, or Succeeded after the last.
func nextHook(run *v1alpha1.HookRun, list []v1alpha1.Hook, now time.Time, msg string) {
	if int(run.Index)+1 < len(list) {
		run.Index++
		run.Hook, run.State, run.Attempt, run.Since, run.Message = list[run.Index].Name, v1alpha1.HookRunning, 1, metav1.NewTime(now), ""
		return
	}
	run.State, run.Message = v1alpha1.HookSucceeded, truncate(msg, 1024)
}

// result is what the current hook of run says now: a job hook's Job, or an http hook's delivery
// of the run's event (sent now when its back-off allows).
func (r *Reconciler) result(ctx context.Context, s *scope, run *v1alpha1.HookRun, h *v1alpha1.Hook, now time.Time) (done, ok bool, msg string) {
	k := hook.KeyOf(run)
	switch {
	case h.Job != nil:
		name := hook.JobName(s.op.Name, k, h.Name, run.Attempt)
		if err := r.createError(name); err != nil {
			return true, false, fmt.Sprintf("cannot create Job %s/%s: %v", r.hookNamespace(), name, err)
		}
		j, found := s.hooks.jobs[name]
		if !found {
			return false, false, fmt.Sprintf("Job %s/%s not created yet", r.hookNamespace(), name)
		}
		return hook.JobResult(j)
	case h.HTTP != nil:
		var secret corev1.Secret
		name := v1alpha1.HookSigningSecret
		if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: r.hookNamespace(), Name: name}, &secret); err != nil {
			s.hooks.due(now.Add(5 * time.Second))
			return false, false, fmt.Sprintf("cannot read the signing Secret %s/%s: %v", r.hookNamespace(), name, err)
		}
		key, has := secret.Data[h.HTTP.SigningKey]
		if !has || len(key) == 0 {
			s.hooks.due(now.Add(5 * time.Second))
			return false, false, fmt.Sprintf("the signing Secret %s/%s has no key %q", r.hookNamespace(), name, h.HTTP.SigningKey)
		}
		message := ""
		if k.Outcome == hook.OutcomeFailed {
			if t, has := s.in.tasks[k.Group][k.Node]; has {
				message = t.Message
			}
		}
		ev := hook.NewEvent(s.op, k, h.Name, run.Since.Time, message)
		out := r.Sender.Deliver(ctx, h.HTTP.URL, key, ev, now)
		if out.Delivered {
			return true, true, fmt.Sprintf("event %s (%s) delivered to %s", ev.ID, ev.Type, h.HTTP.URL)
		}
		s.hooks.due(out.Due)
		return false, false, out.Message
	}
	return true, false, "a hook with neither job nor http"
}

// decideHooks applies the hooks to the pure decision: the operation's first task waits for the
// preOperation hooks, each node's task for its preNode hooks, and Succeeded for the
// postOperation hooks; a failed hook blocks. It records the runs in the status.
func (r *Reconciler) decideHooks(s *scope) {
	hv := s.hooks
	if hv == nil || s.in.fail != nil {
		return
	}
	op, d, st := s.op, &s.d, &s.d.status
	now := s.in.now
	starting := !op.Spec.Abort && !st.Phase.Finished()
	if pre := op.Spec.Hooks.At(v1alpha1.HookPreOperation); len(pre) > 0 && len(d.create) > 0 && starting {
		k := hook.Key{Point: v1alpha1.HookPreOperation}
		run := hv.runs[k]
		if run == nil {
			run = hv.start(k, pre, now)
		}
		if run.State != v1alpha1.HookSucceeded {
			d.create = nil
			hv.waiting = fmt.Sprintf("preOperation hook %s", run.Hook)
		}
	}
	if len(d.create) > 0 && d.create[0].group.Name != plan.GroupPreflight {
		group := d.create[0].group.Name
		if pre := hooksOf(op, s.in.groups, group).At(v1alpha1.HookPreNode); len(pre) > 0 {
			failed := false
			for _, run := range hv.runs {
				failed = failed || run.Point == v1alpha1.HookPreNode && run.Group == group && run.State == v1alpha1.HookFailed
			}
			keep := d.create[:0:0]
			for _, c := range d.create {
				k := hook.Key{Point: v1alpha1.HookPreNode, Group: group, Node: c.node}
				run := hv.runs[k]
				if run == nil && !failed && starting {
					run = hv.start(k, pre, now)
				}
				if run != nil && run.State == v1alpha1.HookSucceeded {
					keep = append(keep, c)
				} else if run != nil && hv.waiting == "" {
					hv.waiting = fmt.Sprintf("preNode hook %s of node %s", run.Hook, c.node)
				}
			}
			d.create = keep
		}
	}
	if post := op.Spec.Hooks.At(v1alpha1.HookPostOperation); len(post) > 0 && st.Phase == v1alpha1.OperationSucceeded {
		k := hook.Key{Point: v1alpha1.HookPostOperation}
		run := hv.runs[k]
		if run == nil {
			run = hv.start(k, post, now)
		}
		if run.State != v1alpha1.HookSucceeded {
			st.Phase, st.CompletionTime = v1alpha1.OperationRunning, nil
			hv.waiting = fmt.Sprintf("postOperation hook %s", run.Hook)
		}
	}
	st.Hooks = hv.records(s)
	if !st.Phase.Finished() && !op.Spec.Abort {
		if f := firstFailed(st.Hooks); f != nil {
			msg := fmt.Sprintf("hook %s (%s) failed: %s; kubectl nodeops retry %s --hook %s runs it again, skip --hook %s passes it, or abort the operation",
				f.Hook, where(f), f.Message, op.Name, f.Hook, f.Hook)
			st.Phase = v1alpha1.OperationBlocked
			for i := range st.Groups {
				if st.Groups[i].Name == f.Group {
					st.Groups[i].Phase, st.Groups[i].Message = v1alpha1.GroupBlocked, msg
				}
			}
			setConditions(st, op.Generation, v1alpha1.OperationBlocked, ReasonHookFailed, msg)
		} else if hv.waiting != "" && st.Phase == v1alpha1.OperationRunning && len(d.create) == 0 {
			setConditions(st, op.Generation, v1alpha1.OperationRunning, ReasonWaitingForHook, "waiting for "+hv.waiting)
		}
	}
	if !hv.recheck.IsZero() && (d.recheck.IsZero() || hv.recheck.Before(d.recheck)) {
		d.recheck = hv.recheck
	}
}

// records is the runs to keep in the status, in the order first recorded: a node's preNode run
// goes once its task exists, and a group's postNode runs once the group succeeded.
func (hv *hookView) records(s *scope) []v1alpha1.HookRun {
	var out []v1alpha1.HookRun
	for _, k := range hv.order {
		run := hv.runs[k]
		switch {
		case k.Point == v1alpha1.HookPreNode && run.State == v1alpha1.HookSucceeded:
			if _, has := s.in.tasks[k.Group][k.Node]; has {
				continue
			}
		case k.Point == v1alpha1.HookPostNode && groupSucceeded(&s.d.status, k.Group):
			continue
		}
		out = append(out, *run)
	}
	return out
}

func firstFailed(runs []v1alpha1.HookRun) *v1alpha1.HookRun {
	var failed []*v1alpha1.HookRun
	for i := range runs {
		if runs[i].State == v1alpha1.HookFailed {
			failed = append(failed, &runs[i])
		}
	}
	if len(failed) == 0 {
		return nil
	}
	sort.SliceStable(failed, func(a, b int) bool { return failed[a].Since.Before(&failed[b].Since) })
	return failed[0]
}

// where is a run's point in words.
func where(run *v1alpha1.HookRun) string {
	switch run.Point {
	case v1alpha1.HookPreNode:
		return fmt.Sprintf("preNode, group %s, node %s", run.Group, run.Node)
	case v1alpha1.HookPostNode:
		if run.Outcome == hook.OutcomeFailed {
			return fmt.Sprintf("postNode after a failure, group %s, node %s", run.Group, run.Node)
		}
		return fmt.Sprintf("postNode, group %s, node %s", run.Group, run.Node)
	case v1alpha1.HookPreOperation:
		return "preOperation"
	}
	return "postOperation"
}

// runHooks creates the Job of each running job hook the status as written records: intent is
// recorded before the Job exists, and its deterministic name makes a second create a no-op. It
// reports whether a create failed, which the next look records.
func (r *Reconciler) runHooks(ctx context.Context, s *scope) (again bool) {
	if s.hooks == nil {
		return false
	}
	for i := range s.op.Status.Hooks {
		run := &s.op.Status.Hooks[i]
		if run.State != v1alpha1.HookRunning || s.op.Spec.Abort {
			continue
		}
		list := hooksAt(s.op, s.in.groups, hook.KeyOf(run))
		if int(run.Index) >= len(list) || list[run.Index].Job == nil {
			continue
		}
		h := &list[run.Index]
		name := hook.JobName(s.op.Name, hook.KeyOf(run), h.Name, run.Attempt)
		if _, has := s.hooks.jobs[name]; has {
			continue
		}
		job, err := hook.BuildJob(s.op, hook.KeyOf(run), h, run.Attempt)
		if err == nil {
			err = r.Client.Create(ctx, job)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			// The next look fails the hook with this reason (a hook that cannot be run blocks, rule 14).
			r.noteCreateError(name, err)
			again = true
		}
	}
	return again
}

func (r *Reconciler) hookNamespace() string {
	if r.HookNamespace != "" {
		return r.HookNamespace
	}
	return hook.Namespace
}

func (r *Reconciler) noteCreateError(job string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.createErrs == nil {
		r.createErrs = map[string]error{}
	}
	r.createErrs[job] = err
}

func (r *Reconciler) createError(job string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.createErrs[job]
}

// hookJobOwner maps a hook Job to the operation that controls it.
func hookJobOwner(_ context.Context, o client.Object) []reconcile.Request {
	if _, ok := o.GetLabels()[v1alpha1.LabelHook]; !ok {
		return nil
	}
	ref := metav1.GetControllerOf(o)
	if ref == nil || ref.Kind != kind {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: ref.Name}}}
}

// hookTransitions are the Kubernetes Events of the runs that succeeded or failed in this write.
func hookTransitions(before, after *v1alpha1.NodeOperationStatus) []opEvent {
	if equality.Semantic.DeepEqual(before.Hooks, after.Hooks) {
		return nil
	}
	old := map[hook.Key]v1alpha1.HookRun{}
	for _, r := range before.Hooks {
		old[hook.KeyOf(&r)] = r
	}
	var out []opEvent
	for i := range after.Hooks {
		run := &after.Hooks[i]
		was, had := old[hook.KeyOf(run)]
		if had && was.State == run.State && was.Index == run.Index && was.Attempt == run.Attempt {
			continue
		}
		switch run.State {
		case v1alpha1.HookRunning:
			out = append(out, opEvent{corev1.EventTypeNormal, "HookStarted", "RunHook", fmt.Sprintf("hook %s (%s) started", run.Hook, where(run))})
		case v1alpha1.HookSucceeded:
			out = append(out, opEvent{corev1.EventTypeNormal, "HookSucceeded", "RunHook", fmt.Sprintf("hooks (%s) succeeded: %s", where(run), run.Message)})
		case v1alpha1.HookFailed:
			out = append(out, opEvent{corev1.EventTypeWarning, ReasonHookFailed, "RunHook", fmt.Sprintf("hook %s (%s) failed: %s", run.Hook, where(run), run.Message)})
		}
	}
	return out
}
