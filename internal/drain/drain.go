// Package drain drains a node as kubectl drain does (drain honours PodDisruptionBudgets, rule 6): Plan sorts its
// pods (pure), Run evicts them through the Eviction API, honouring PodDisruptionBudgets. The manager
// runs it for a task that asks (internal/controller/nodetask, drain.go), so no agent holds the right
// to evict (agents confined to their own node, rule 10); it imports nothing of the agent.
//
// It evicts only, through the Eviction API: it never deletes a pod, and leaves mirror pods, secret
// holder pods, and the asking agent's and the draining manager's own pods.
package drain

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	nodeopsclock "github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/secretholder"
	"github.com/nodeops/nodeops/internal/transient"
)

const (
	// DefaultTimeout is a drain's timeout when its command sets none.
	DefaultTimeout      = 5 * time.Minute
	mirrorPodAnnotation = "kubernetes.io/config.mirror"
)

// nodeopsPod reports whether pod is one of nodeops' own that a drain leaves: an agent (its DaemonSet's
// pod or an agent Job's), which the drain's task needs, or a task's secret holder, which its scripts
// read their Secrets through. Known by namespace and controller, never by label: a tenant may label
// its pods as it likes, but only nodeops (and cluster administrators) create workloads in its namespace.
func nodeopsPod(pod *corev1.Pod) (string, bool) {
	c := metav1.GetControllerOf(pod)
	if pod.Namespace != secretholder.Namespace || c == nil {
		return "", false
	}
	switch {
	case c.Kind == "DaemonSet" && c.APIVersion == "apps/v1" && c.Name == agentDaemonSet,
		c.Kind == "Job" && c.APIVersion == "batch/v1" && strings.HasPrefix(c.Name, agentDaemonSet+"-"):
		return "a nodeops agent", true
	case c.Kind == "NodeTask" && c.APIVersion == v1alpha1.GroupVersion.String():
		return "a task's secret holder", true
	}
	return "", false
}

// agentDaemonSet is the agents' DaemonSet; agent Jobs are named after it (internal/controller/agentjob).
const agentDaemonSet = "nodeops-agent"

// Plan is which of a node's pods a drain evicts and why it leaves or refuses the others.
type Plan struct {
	Evict []corev1.Pod
	// Left are pods a drain never evicts (mirror, the agent's, and, when ignored, DaemonSet pods), as "ns/name (why)".
	Left []string
	// Refused are pods that stop the drain before it starts, as "refusing to evict ns/name (why)".
	Refused []string
}

// Spared are the pods a drain leaves by name: the asking agent's and the draining manager's.
type Spared struct {
	Agent, Manager types.NamespacedName
}

// PlanFor sorts a node's pods as kubectl drain does (drain honours PodDisruptionBudgets, rule 6); it is pure.
func PlanFor(pods []corev1.Pod, d *v1alpha1.DrainCommand, spared Spared) (Plan, error) {
	sel := labels.Everything()
	if d.PodSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(d.PodSelector)
		if err != nil {
			return Plan{}, fmt.Errorf("podSelector: %w", err)
		}
		sel = s
	}
	ignoreDS := d.IgnoreDaemonSets == nil || *d.IgnoreDaemonSets
	var p Plan
	for _, pod := range pods {
		name := pod.Namespace + "/" + pod.Name
		why, ours := nodeopsPod(&pod)
		switch {
		case !sel.Matches(labels.Set(pod.Labels)):
			continue
		case is(pod, spared.Agent):
			p.Left = append(p.Left, name+" (the agent's own pod)")
		case is(pod, spared.Manager):
			p.Left = append(p.Left, name+" (the manager's own pod, which drains)")
		case ours:
			p.Left = append(p.Left, name+" ("+why+")")
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

func is(pod corev1.Pod, n types.NamespacedName) bool {
	return n.Name != "" && pod.Name == n.Name && pod.Namespace == n.Namespace
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

// Target is the node a drain empties and how it reaches the cluster.
type Target struct {
	Node string
	// AgentPod is the pod of the agent that asked, spared like every nodeops agent's; empty outside a pod.
	AgentPod types.NamespacedName
	// Manager is the pod of the manager that drains, which the drain leaves: evicting it would stop
	// the drain, and on a one-node cluster its replacement could not schedule on the cordoned node.
	Manager types.NamespacedName
	// Client creates the evictions.
	Client client.Client
	// Reader reads the node's pods and the namespaces' PodDisruptionBudgets, without a cache.
	Reader client.Reader
	// DryRun makes every eviction a server-side dry run and waits for nothing.
	DryRun bool
	// Poll is how often the drain looks again; 2s when zero.
	Poll time.Duration
	// Out receives a line for each pod left, evicted or held up; nil for none.
	Out io.Writer
	// Clock measures the drain's timeout; the real clock when nil. A test holds it to end a drain
	// only once it has seen what the drain must report.
	Clock clock.WithDelayedExecution
}

func (t *Target) printf(format string, args ...any) {
	if t.Out != nil {
		_, _ = fmt.Fprintf(t.Out, format, args...)
	}
}

func (t *Target) poll() time.Duration {
	if t.Poll > 0 {
		return t.Poll
	}
	return 2 * time.Second
}

// Run evicts the node's pods through the Eviction API and returns what it did, as
// "drained node n: 2 pods evicted, 1 left". An eviction a PodDisruptionBudget refuses (429) is tried
// again until the timeout; then the drain fails naming the pod and the budget. A moment of API
// server failure (a 503) is waited out, on the pod list as on the evictions.
func Run(ctx context.Context, t Target, d *v1alpha1.DrainCommand) (string, error) {
	timeout := DefaultTimeout
	if d.Timeout != nil && d.Timeout.Duration > 0 {
		timeout = d.Timeout.Duration
	}
	clk := t.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	deadline := clk.AfterFunc(timeout, cancel)
	defer deadline.Stop()
	if t.DryRun {
		t.Client = client.NewDryRunClient(t.Client)
	}

	pods := &corev1.PodList{}
	if err := transient.Retry(ctx, func() error {
		return t.Reader.List(ctx, pods, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", t.Node)})
	}); err != nil {
		return "", fmt.Errorf("listing the pods of node %s: %w", t.Node, err)
	}
	plan, err := PlanFor(pods.Items, d, Spared{Agent: t.AgentPod, Manager: t.Manager})
	if err != nil {
		return "", err
	}
	for _, l := range plan.Left {
		t.printf("leaving %s\n", l)
	}
	if len(plan.Refused) > 0 {
		return "", fmt.Errorf("cannot drain node %s: %s", t.Node, strings.Join(plan.Refused, "; "))
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
			err := evict(ctx, t.Client, &pod, d.GracePeriodSeconds)
			switch {
			case err == nil, apierrors.IsNotFound(err):
				evicted[pod.UID] = true
				delete(blocked, pod.UID)
				t.printf("evicted %s/%s\n", pod.Namespace, pod.Name)
			case apierrors.IsTooManyRequests(err):
				if _, seen := blocked[pod.UID]; !seen {
					t.printf("eviction of %s/%s refused by a disruption budget; retrying\n", pod.Namespace, pod.Name)
				}
				blocked[pod.UID] = pdbFor(ctx, t.Reader, &pod, err)
			case ctx.Err() != nil:
				// The timeout came during the request: a pod never answered for is not "still terminating".
				if _, seen := blocked[pod.UID]; !seen {
					blocked[pod.UID] = "the API server, which had not answered the eviction when the drain timed out"
				}
			case transient.Is(err):
				// The API server failed for a moment (a 503): the eviction is tried again with the others.
				blocked[pod.UID] = "the API server, which failed the eviction: " + err.Error()
			case errors.Is(err, context.DeadlineExceeded):
				blocked[pod.UID] = "the API server, which did not answer the eviction in time"
			default:
				return "", fmt.Errorf("evicting pod %s/%s: %w", pod.Namespace, pod.Name, err)
			}
		}
		// A dry-run eviction leaves its pod in place: nothing goes away to wait for, only refusals to retry.
		if t.DryRun {
			if len(blocked) == 0 {
				break
			}
		} else if err := forgetGone(ctx, t.Reader, pending, evicted); err != nil {
			return "", err
		}
		if len(pending) == 0 {
			break
		}
		if err := nodeopsclock.Sleep(ctx, t.poll()); err != nil {
			return "", drainTimeoutError(t.Node, timeout, pending, blocked)
		}
	}
	return fmt.Sprintf("drained node %s: %d pods evicted, %d left", t.Node, len(plan.Evict), len(plan.Left)), nil
}

// evictCallTimeout bounds one eviction request, so one pod the server is slow about (a budget it has
// not yet computed) does not hold up the others.
const evictCallTimeout = 10 * time.Second

func evict(ctx context.Context, c client.Client, pod *corev1.Pod, grace *int64) error {
	ctx, cancel := context.WithTimeout(ctx, evictCallTimeout)
	defer cancel()
	ev := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{GracePeriodSeconds: grace, Preconditions: &metav1.Preconditions{UID: &pod.UID}},
	}
	// In DryRun the client makes this a server-side dry run; the server carries that into the eviction.
	return c.SubResource("eviction").Create(ctx, pod, ev)
}

// forgetGone drops from pending the pods that no longer exist (or were replaced under the same name).
func forgetGone(ctx context.Context, r client.Reader, pending map[types.UID]corev1.Pod, evicted map[types.UID]bool) error {
	for uid, pod := range pending {
		if !evicted[uid] && pod.DeletionTimestamp == nil {
			continue
		}
		cur := &corev1.Pod{}
		err := r.Get(ctx, client.ObjectKeyFromObject(&pod), cur)
		switch {
		case apierrors.IsNotFound(err) || (err == nil && cur.UID != uid):
			delete(pending, uid)
		case err != nil && ctx.Err() == nil && !transient.Is(err):
			// A moment's API server failure is looked at again on the next round.
			return fmt.Errorf("reading pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	return nil
}

// pdbFor names the disruption budget that refused an eviction, as "budget ns/name", or the server's words.
// Its read does not share the drain's deadline: a refusal just before the timeout is named as well.
func pdbFor(ctx context.Context, r client.Reader, pod *corev1.Pod, evictErr error) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	pdbs := &policyv1.PodDisruptionBudgetList{}
	if err := r.List(ctx, pdbs, client.InNamespace(pod.Namespace)); err == nil {
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
