package commands

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
)

const (
	defaultDrainTimeout = 5 * time.Minute
	mirrorPodAnnotation = "kubernetes.io/config.mirror"
)

// agentLabel marks the agent's pods (DaemonSet and Jobs), which a drain leaves: evicting an agent
// would stop the task that drains, and in Job mode nothing else would spare it.
var agentLabel = labels.Set{"app.kubernetes.io/name": "nodeops-agent"}

// drainPlan is which of a node's pods a drain evicts and why it leaves or refuses the others.
type drainPlan struct {
	Evict []corev1.Pod
	// Left are pods a drain never evicts (mirror, the agent's, and, when ignored, DaemonSet pods), as "ns/name (why)".
	Left []string
	// Refused are pods that stop the drain before it starts, as "refusing to evict ns/name (why)".
	Refused []string
}

// planDrain sorts a node's pods as kubectl drain does (docs/design.md, safety rule 6); it is pure.
// agentPod is the agent's own pod, if it runs in one.
func planDrain(pods []corev1.Pod, d *v1alpha1.DrainCommand, agentPod types.NamespacedName) (drainPlan, error) {
	sel := labels.Everything()
	if d.PodSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(d.PodSelector)
		if err != nil {
			return drainPlan{}, fmt.Errorf("podSelector: %w", err)
		}
		sel = s
	}
	agents := labels.SelectorFromSet(agentLabel)
	ignoreDS := d.IgnoreDaemonSets == nil || *d.IgnoreDaemonSets
	var p drainPlan
	for _, pod := range pods {
		name := pod.Namespace + "/" + pod.Name
		switch {
		case !sel.Matches(labels.Set(pod.Labels)):
			continue
		case agentPod.Name != "" && pod.Name == agentPod.Name && pod.Namespace == agentPod.Namespace:
			p.Left = append(p.Left, name+" (the agent's own pod)")
		case agents.Matches(labels.Set(pod.Labels)):
			p.Left = append(p.Left, name+" (a nodeops agent)")
		case pod.DeletionTimestamp != nil:
			// Already going; the drain waits for it.
			p.Evict = append(p.Evict, pod)
		case pod.Annotations[mirrorPodAnnotation] != "":
			p.Left = append(p.Left, name+" (mirror pod)")
		case ownedByDaemonSet(&pod):
			if ignoreDS {
				p.Left = append(p.Left, name+" (DaemonSet)")
			} else {
				p.Refused = append(p.Refused, "refusing to evict "+name+" (DaemonSet-managed; set ignoreDaemonSets: true to leave it)")
			}
		case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
			// Finished: nothing is lost, as kubectl drain has it.
			p.Evict = append(p.Evict, pod)
		default:
			var why []string
			if metav1.GetControllerOf(&pod) == nil && !d.Force {
				why = append(why, "no controller; set force: true to evict it, it will not come back")
			}
			if hasEmptyDir(&pod) && !d.DeleteEmptyDirData {
				why = append(why, "uses emptyDir; set deleteEmptyDirData: true to evict it, its emptyDir data will be lost")
			}
			if len(why) > 0 {
				p.Refused = append(p.Refused, "refusing to evict "+name+" ("+strings.Join(why, "; ")+")")
				continue
			}
			p.Evict = append(p.Evict, pod)
		}
	}
	return p, nil
}

func ownedByDaemonSet(pod *corev1.Pod) bool {
	c := metav1.GetControllerOf(pod)
	return c != nil && c.Kind == "DaemonSet"
}

func hasEmptyDir(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir != nil {
			return true
		}
	}
	return false
}

// runDrain evicts the node's pods through the Eviction API. An eviction a PodDisruptionBudget refuses
// (429) is tried again until the timeout; then the drain fails naming the pod and the budget.
// In DryRun the evictions are server-side dry runs (Env's client) and nothing is waited for.
func runDrain(ctx context.Context, env *Env, d *v1alpha1.DrainCommand) (Result, error) {
	timeout := defaultDrainTimeout
	if d.Timeout != nil && d.Timeout.Duration > 0 {
		timeout = d.Timeout.Duration
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	pods := &corev1.PodList{}
	if err := retryTransient(ctx, func() error {
		return env.Client.List(ctx, pods, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", env.NodeName)})
	}); err != nil {
		return Result{}, fmt.Errorf("listing the pods of node %s: %w", env.NodeName, err)
	}
	plan, err := planDrain(pods.Items, d, env.AgentPod)
	if err != nil {
		return Result{}, err
	}
	for _, l := range plan.Left {
		env.printf("leaving %s\n", l)
	}
	if len(plan.Refused) > 0 {
		return Result{}, fmt.Errorf("cannot drain node %s: %s", env.NodeName, strings.Join(plan.Refused, "; "))
	}

	pending := map[types.UID]corev1.Pod{}
	for _, pod := range plan.Evict {
		pending[pod.UID] = pod
	}
	blocked := map[types.UID]string{}
	evicted := map[types.UID]bool{}
	for len(pending) > 0 {
		for _, pod := range sortedPods(pending) {
			if evicted[pod.UID] || pod.DeletionTimestamp != nil {
				continue
			}
			err := evict(ctx, env, &pod, d.GracePeriodSeconds)
			switch {
			case err == nil, apierrors.IsNotFound(err):
				evicted[pod.UID] = true
				delete(blocked, pod.UID)
				env.printf("evicted %s/%s\n", pod.Namespace, pod.Name)
			case apierrors.IsTooManyRequests(err):
				if _, seen := blocked[pod.UID]; !seen {
					env.printf("eviction of %s/%s refused by a disruption budget; retrying\n", pod.Namespace, pod.Name)
				}
				blocked[pod.UID] = pdbFor(ctx, env, &pod, err)
			case ctx.Err() != nil:
			case Transient(err):
				// The API server failed for a moment (a 503): the eviction is tried again with the others.
				blocked[pod.UID] = "the API server, which failed the eviction: " + err.Error()
			case errors.Is(err, context.DeadlineExceeded):
				blocked[pod.UID] = "the API server, which did not answer the eviction in time"
			default:
				return Result{}, fmt.Errorf("evicting pod %s/%s: %w", pod.Namespace, pod.Name, err)
			}
		}
		// A dry-run eviction leaves its pod in place: nothing goes away to wait for, only refusals to retry.
		if env.DryRun {
			if len(blocked) == 0 {
				break
			}
		} else if err := forgetGone(ctx, env, pending, evicted); err != nil {
			return Result{}, err
		}
		if len(pending) == 0 {
			break
		}
		if err := clock.Sleep(ctx, env.poll()); err != nil {
			return Result{}, drainTimeoutError(env.NodeName, timeout, pending, blocked)
		}
	}
	return Result{Message: fmt.Sprintf("drained node %s: %d pods evicted, %d left", env.NodeName, len(plan.Evict), len(plan.Left))}, nil
}

// evictCallTimeout bounds one eviction request, so one pod the server is slow about (a budget it has
// not yet computed) does not hold up the others.
const evictCallTimeout = 10 * time.Second

func evict(ctx context.Context, env *Env, pod *corev1.Pod, grace *int64) error {
	ctx, cancel := context.WithTimeout(ctx, evictCallTimeout)
	defer cancel()
	ev := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{GracePeriodSeconds: grace, Preconditions: &metav1.Preconditions{UID: &pod.UID}},
	}
	// In DryRun the client makes this a server-side dry run; the server carries that into the eviction.
	return env.Client.SubResource("eviction").Create(ctx, pod, ev)
}

// forgetGone drops from pending the pods that no longer exist (or were replaced under the same name).
func forgetGone(ctx context.Context, env *Env, pending map[types.UID]corev1.Pod, evicted map[types.UID]bool) error {
	for uid, pod := range pending {
		if !evicted[uid] && pod.DeletionTimestamp == nil {
			continue
		}
		cur := &corev1.Pod{}
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(&pod), cur)
		switch {
		case apierrors.IsNotFound(err) || (err == nil && cur.UID != uid):
			delete(pending, uid)
		case err != nil && ctx.Err() == nil:
			return fmt.Errorf("reading pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	return nil
}

// pdbFor names the disruption budget that refused an eviction, as "budget ns/name", or the server's words.
func pdbFor(ctx context.Context, env *Env, pod *corev1.Pod, evictErr error) string {
	pdbs := &policyv1.PodDisruptionBudgetList{}
	if err := env.Client.List(ctx, pdbs, client.InNamespace(pod.Namespace)); err == nil {
		var names []string
		for _, pdb := range pdbs.Items {
			sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			if err == nil && !sel.Empty() && sel.Matches(labels.Set(pod.Labels)) {
				names = append(names, pod.Namespace+"/"+pdb.Name)
			}
		}
		if len(names) > 0 {
			return "PodDisruptionBudget " + strings.Join(names, ", ")
		}
	}
	var status apierrors.APIStatus
	if errors.As(evictErr, &status) {
		return status.Status().Message
	}
	return evictErr.Error()
}

func drainTimeoutError(node string, timeout time.Duration, pending map[types.UID]corev1.Pod, blocked map[types.UID]string) error {
	var parts []string
	for _, pod := range sortedPods(pending) {
		if why, ok := blocked[pod.UID]; ok {
			parts = append(parts, fmt.Sprintf("eviction of pod %s/%s refused by %s", pod.Namespace, pod.Name, why))
		} else {
			parts = append(parts, fmt.Sprintf("pod %s/%s still terminating", pod.Namespace, pod.Name))
		}
	}
	return fmt.Errorf("drain of node %s timed out after %s: %s", node, timeout, strings.Join(parts, "; "))
}

func sortedPods(m map[types.UID]corev1.Pod) []corev1.Pod {
	out := make([]corev1.Pod, 0, len(m))
	for _, p := range m {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}
