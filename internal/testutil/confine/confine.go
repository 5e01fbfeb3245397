// Package confine is the table of writes a node's agent must not make and of the Secret reads its
// token is refused, every one (agents confined to their own node, rule 10; scripts read their Secrets from their
// node's kubelet, internal/secretholder), shared by test/confinement (envtest, the policies alone)
// and test/e2e (nodeops-local's agents with their pod-bound tokens), so both check the same refusals
// with the same messages.
//
// It is for tests only: it lists refusals and changes nothing.
package confine

import (
	"context"
	"fmt"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/objname"
)

// Cluster names what the attempts act on: the agent on NodeA, TaskA on NodeA and TaskB on NodeB
// (both created by the manager), and NodeB's Lease in Namespace, taken by its agent.
type Cluster struct {
	// Admin reads objects as an administrator, to build the agent's writes from them.
	Admin        client.Client
	Namespace    string
	NodeA, NodeB string
	TaskA, TaskB string
	// WorkloadNamespace holds a pod named workload-<node> on each of NodeA and NodeB, which the agent
	// may not evict (the manager drains for it); empty: no eviction attempts.
	WorkloadNamespace string
}

// Attempt is one write the agent on NodeA must not make; the slices are parts of the refusal's message.
type Attempt struct {
	Name string
	Do   func(ctx context.Context, c client.Client) error
	// Policy: what the admission policy's refusal says (the agent's RBAC allows the request);
	// RBAC: what RBAC's says, when the shipped ClusterRole already refuses it; Or: another policy
	// that refuses it too, whose message may come first (the API server's order is not fixed).
	Policy, RBAC, Or []string
}

// Want is what the refusal says with the shipped RBAC in place: RBAC's message where it refuses first.
func (a Attempt) Want() []string {
	if a.RBAC != nil {
		return a.RBAC
	}
	return a.Policy
}

// absentNode is a node no one runs an agent on.
const absentNode = "node-c"

// Attempts lists every write the agent on k.NodeA must not make.
func (k Cluster) Attempts() []Attempt {
	a, b := k.NodeA, k.NodeB
	attempts := []Attempt{
		{Name: "status of " + b + "'s task", Do: k.StatusOf(k.TaskB, v1alpha1.TaskSucceeded),
			Policy: []string{"agent on node " + a + " writes only the status of its own node's NodeTasks", "UPDATE nodetasks/status " + k.TaskB, "spec.nodeName " + b}},
		{Name: "approvedCommands of its own task", Do: PatchTask(k.TaskA, `{"spec":{"approvedCommands":1}}`),
			Policy: []string{"never its spec or metadata", "UPDATE nodetasks " + k.TaskA}, RBAC: []string{`cannot patch resource "nodetasks"`}},
		{Name: "recoveryMode of its own task", Do: PatchTask(k.TaskA, `{"spec":{"recoveryMode":"Skip"}}`),
			Policy: []string{"never its spec or metadata", "UPDATE nodetasks " + k.TaskA}, RBAC: []string{`cannot patch resource "nodetasks"`}},
		{Name: "abort its own task", Do: PatchTask(k.TaskA, `{"spec":{"abort":true}}`),
			Policy: []string{"never its spec or metadata", "UPDATE nodetasks " + k.TaskA}, RBAC: []string{`cannot patch resource "nodetasks"`}},
		{Name: "abort " + b + "'s task", Do: PatchTask(k.TaskB, `{"spec":{"abort":true}}`),
			Policy: []string{"never its spec or metadata", "UPDATE nodetasks " + k.TaskB}, RBAC: []string{`cannot patch resource "nodetasks"`}},
		{Name: "move " + b + "'s task to " + a + " by label", Do: PatchTask(k.TaskB, fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, v1alpha1.LabelNode, a)),
			Policy: []string{"never its spec or metadata", "UPDATE nodetasks " + k.TaskB}, RBAC: []string{`cannot patch resource "nodetasks"`}},
		{Name: "create a task", Do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, NewTask("made-by-agent", a))
		},
			Policy: []string{"never a create or delete", "CREATE nodetasks made-by-agent"},
			Or:     []string{NodeTaskCreationMessage, "creating NodeTask made-by-agent"},
			RBAC:   []string{`cannot create resource "nodetasks"`}},
		{Name: "delete its own task", Do: func(ctx context.Context, c client.Client) error {
			return c.Delete(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: k.TaskA}})
		}, Policy: []string{"never a create or delete", "DELETE nodetasks " + k.TaskA}, RBAC: []string{`cannot delete resource "nodetasks"`}},
		{Name: "delete " + b + "'s task", Do: func(ctx context.Context, c client.Client) error {
			return c.Delete(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: k.TaskB}})
		}, Policy: []string{"never a create or delete", "DELETE nodetasks " + k.TaskB}, RBAC: []string{`cannot delete resource "nodetasks"`}},
		{Name: "cordon " + b, Do: Cordon(b),
			Policy: []string{"agent on node " + a + " may update only its own Node", "UPDATE nodes " + b}},
		{Name: "label " + a + " provisioned", Do: PatchNode(a, `{"metadata":{"labels":{"nodeops.io/profile.x":"provisioned"}}}`),
			Policy: []string{"may not change its Node's labels", "UPDATE nodes " + a}},
		{Name: "annotate " + a, Do: PatchNode(a, `{"metadata":{"annotations":{"nodeops.io/profile.x":"hash"}}}`),
			Policy: []string{"no annotation of its Node but nodeops.io/was-unschedulable", "UPDATE nodes " + a}},
		{Name: "record certificates on " + b, Do: PatchNode(b, `{"metadata":{"annotations":{"nodeops.io/certificates":"[]"}}}`),
			Policy: []string{"agent on node " + a + " may update only its own Node", "UPDATE nodes " + b}},
		{Name: "record drift on " + b, Do: PatchNode(b, `{"metadata":{"annotations":{"nodeops.io/drift":"{}"}}}`),
			Policy: []string{"agent on node " + a + " may update only its own Node", "UPDATE nodes " + b}},
		{Name: "taint " + a, Do: PatchNode(a, `{"spec":{"taints":[{"key":"k","effect":"NoSchedule"}]}}`),
			Policy: []string{"only spec.unschedulable of its Node's spec", "UPDATE nodes " + a}},
		{Name: "finalize " + a, Do: PatchNode(a, `{"metadata":{"finalizers":["example.com/keep"]}}`),
			Policy: []string{"finalizers or ownerReferences", "UPDATE nodes " + a}},
		{Name: a + "'s status", Do: func(ctx context.Context, c client.Client) error {
			// A write the API must refuse, sent raw: statuswrite would not send it.
			return c.Status().Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a}}, Merge(`{"status":{"phase":"Running"}}`))
		}, Policy: []string{"not its status", "UPDATE nodes/status " + a}, RBAC: []string{`cannot patch resource "nodes/status"`}},
		{Name: "delete " + b, Do: func(ctx context.Context, c client.Client) error {
			return c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: b}})
		}, Policy: []string{"create or delete none", "DELETE nodes " + b}, RBAC: []string{`cannot delete resource "nodes"`}},
		{Name: "take " + b + "'s lease", Do: k.TakeLease(b, k.TaskA),
			Policy: []string{"agent on node " + a + " creates or updates only its own node's Lease (node-" + a, "UPDATE leases node-" + b}},
		{Name: "create " + absentNode + "'s lease", Do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, NodeLease(k.Namespace, absentNode))
		}, Policy: []string{"creates or updates only its own node's Lease", "CREATE leases node-" + absentNode}},
		{Name: "create " + absentNode + "'s lease annotated " + a, Do: func(ctx context.Context, c client.Client) error {
			l := NodeLease(k.Namespace, absentNode)
			l.Annotations[annotationLeaseNode] = a
			return c.Create(ctx, l)
		}, Policy: []string{"creates or updates only its own node's Lease", "CREATE leases node-" + absentNode}},
		{Name: "delete " + b + "'s lease", Do: func(ctx context.Context, c client.Client) error {
			return c.Delete(ctx, NodeLease(k.Namespace, b))
		}, Policy: []string{"deletes none", "DELETE leases node-" + b}, RBAC: []string{`cannot delete resource "leases"`}},
		{Name: "a ConfigMap", Do: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "by-agent", Namespace: k.Namespace}})
		}, Policy: []string{"writes only NodeTask status, its own Node, its node's Lease and its node's installer pods", "CREATE configmaps by-agent"}, RBAC: []string{`cannot create resource "configmaps"`}},
	}
	attempts = append(attempts, k.podAttempts()...)
	if k.WorkloadNamespace == "" {
		return attempts
	}
	// The manager drains for the agent, so the agent evicts nothing: not elsewhere, not on its own node.
	for _, n := range []string{b, a} {
		pod := "workload-" + n
		attempts = append(attempts, Attempt{Name: "evict a pod on " + n, Do: func(ctx context.Context, c client.Client) error {
			return Evict(ctx, c, k.WorkloadNamespace, pod)
		}, Policy: []string{"writes only NodeTask status, its own Node, its node's Lease and its node's installer pods", "CREATE pods/eviction " + pod}, RBAC: []string{`cannot create resource "pods/eviction"`}})
	}
	return attempts
}

// InstallerPod is the pod a pod command of TaskA makes on NodeA, as the agent on NodeA makes it
// (commands.InstallerPod), changed by change.
func (k Cluster) InstallerPod(change func(*corev1.Pod)) *corev1.Pod {
	pod := commands.InstallerPod(k.Namespace, k.NodeA, k.TaskA, 0, &v1alpha1.PodCommand{Image: "registry.k8s.io/pause:3.10"})
	if change != nil {
		change(pod)
	}
	return pod
}

// createPod creates, with the agent's client, NodeA's installer pod changed by change.
func (k Cluster) createPod(change func(*corev1.Pod)) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error { return c.Create(ctx, k.InstallerPod(change)) }
}

// podAttempts are the pods the agent on NodeA must not make on its own node: none that hands its
// node's kubelet a Secret (the Node authorizer follows imagePullSecrets and resourceClaims too), none
// with labels of nodeops' other pods (the manager's metrics Service), none under another name than
// its node's one (another node's pod, or a second pod).
func (k Cluster) podAttempts() []Attempt {
	a, b := k.NodeA, k.NodeB
	mine := "CREATE pods " + objname.InstallerPodName(a)
	return []Attempt{
		{Name: "a pod naming a Secret in imagePullSecrets", Do: k.createPod(func(p *corev1.Pod) {
			p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "kept"}}
		}), Policy: []string{"creates pods without spec.imagePullSecrets", mine}},
		{Name: "a pod with a resourceClaim", Do: k.createPod(func(p *corev1.Pod) {
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("someone-elses")}}
		}), Policy: []string{"spec.resourceClaims", mine}},
		{Name: "a pod labelled as the manager", Do: k.createPod(func(p *corev1.Pod) {
			p.Labels = map[string]string{"app.kubernetes.io/name": "nodeops-manager", "app.kubernetes.io/instance": "nodeops",
				"app.kubernetes.io/component": "manager", "app.kubernetes.io/part-of": "nodeops"}
		}), Policy: []string{"creates pods with exactly the labels nodeops sets", mine}},
		{Name: "a pod with one label more", Do: k.createPod(func(p *corev1.Pod) { p.Labels["app.kubernetes.io/instance"] = "nodeops" }),
			Policy: []string{"creates pods with exactly the labels nodeops sets", mine}},
		{Name: "a pod owned by a NodeTask", Do: k.createPod(func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeTask", Name: k.TaskA, UID: "u", Controller: ptr.To(true)}}
		}), Policy: []string{"creates pods with exactly the labels nodeops sets", mine}},
		{Name: "a pod under " + b + "'s installer pod name", Do: k.createPod(func(p *corev1.Pod) { p.Name = objname.InstallerPodName(b) }),
			Policy: []string{"agent on node " + a + " creates one pod at a time, named " + objname.InstallerPodName(a), "CREATE pods " + objname.InstallerPodName(b)}},
		{Name: "a pod under a secret holder's name", Do: k.createPod(func(p *corev1.Pod) { p.Name = objname.SecretHolderPodName(k.TaskB) }),
			Policy: []string{"creates one pod at a time, named " + objname.InstallerPodName(a), "CREATE pods " + objname.SecretHolderPodName(k.TaskB)}},
		{Name: "a second pod", Do: k.createPod(func(p *corev1.Pod) { p.Name = objname.InstallerPodName(a) + "-2" }),
			Policy: []string{"creates one pod at a time", "CREATE pods " + objname.InstallerPodName(a) + "-2"}},
	}
}

// Evict asks, with c, for the eviction of the pod namespace/name.
func Evict(ctx context.Context, c client.Client, namespace, name string) error {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	return c.SubResource("eviction").Create(ctx, p, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}})
}

// NodeTaskCreationMessage is how config/admission/nodetask-creation.yaml refuses a NodeTask made by
// anyone but the manager: it says how to run work instead.
const NodeTaskCreationMessage = "NodeTasks are created by nodeops' manager; create a NodeOperation (kubectl nodeops ...) instead"

// SecretReads are the Secret reads the agent's token is refused, by RBAC alone (reads are not
// admission's business): a get of the Secret named name in k.Namespace (a script's Secret, which
// the agent reads from its node's kubelet's volume instead: internal/secretholder) and of
// otherNamespace's Secret named other, and any list or watch, here or anywhere.
func (k Cluster) SecretReads(cs kubernetes.Interface, name, otherNamespace, other string) []Attempt {
	forbidden := func(verb string) []string { return []string{`cannot ` + verb + ` resource "secrets"`} }
	return []Attempt{
		{Name: "get the Secret " + k.Namespace + "/" + name, RBAC: forbidden("get"), Do: func(ctx context.Context, c client.Client) error {
			return c.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: name}, &corev1.Secret{})
		}},
		{Name: "get a Secret outside " + k.Namespace, RBAC: forbidden("get"), Do: func(ctx context.Context, c client.Client) error {
			return c.Get(ctx, client.ObjectKey{Namespace: otherNamespace, Name: other}, &corev1.Secret{})
		}},
		{Name: "list Secrets", RBAC: forbidden("list"), Do: func(ctx context.Context, c client.Client) error {
			return c.List(ctx, &corev1.SecretList{})
		}},
		{Name: "list Secrets in " + k.Namespace, RBAC: forbidden("list"), Do: func(ctx context.Context, c client.Client) error {
			return c.List(ctx, &corev1.SecretList{}, client.InNamespace(k.Namespace))
		}},
		{Name: "watch Secrets in " + k.Namespace, RBAC: forbidden("watch"), Do: func(ctx context.Context, _ client.Client) error {
			w, err := cs.CoreV1().Secrets(k.Namespace).Watch(ctx, metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		}},
	}
}

// CheckSecretReads checks, with the agent's client c and clientset cs, that every one of SecretReads is refused.
func (k Cluster) CheckSecretReads(t *testing.T, c client.Client, cs kubernetes.Interface, name, otherNamespace, other string) {
	t.Helper()
	for _, a := range k.SecretReads(cs, name, otherNamespace, other) {
		Refused(t, a.Name, a.Do(context.Background(), c), a.Want())
	}
}

// Refused checks that err is a refusal whose message has every part of want.
func Refused(t *testing.T, what string, err error, want []string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: allowed, want refused", what)
		return
	}
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("%s: %v, want Forbidden", what, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: refused with %q, which does not say %q", what, err, w)
		}
	}
}

// NewTask is a task for node as the manager would create it.
func NewTask(name, node string) *v1alpha1.NodeTask {
	return &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelNode: node}},
		Spec: v1alpha1.NodeTaskSpec{NodeName: node, ExecutionMode: v1alpha1.ExecutionControlled,
			Commands: []v1alpha1.Command{{Cordon: &v1alpha1.CordonCommand{}}}},
	}
}

// StatusOf sets the task's phase with the client it is given, as an agent's status write.
func (k Cluster) StatusOf(name string, phase v1alpha1.TaskPhase) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		task := &v1alpha1.NodeTask{}
		if err := k.Admin.Get(ctx, client.ObjectKey{Name: name}, task); err != nil {
			return err
		}
		task.Status.Phase = phase
		// Raw on purpose: it tests what the API allows and refuses, which statuswrite's own check would hide.
		return c.Status().Update(ctx, task)
	}
}

// TakeLease makes node's Lease name the task, as a taking agent (of an earlier version) writes it;
// the administrator creates the Lease first when no agent did.
func (k Cluster) TakeLease(node, task string) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		l := NodeLease(k.Namespace, node)
		err := k.Admin.Get(ctx, client.ObjectKeyFromObject(l), l)
		if apierrors.IsNotFound(err) {
			l = NodeLease(k.Namespace, node)
			err = k.Admin.Create(ctx, l)
		}
		if err != nil {
			return err
		}
		l.Spec.HolderIdentity, l.Spec.RenewTime = ptr.To(task), ptr.To(metav1.NowMicro())
		return c.Update(ctx, l)
	}
}

// PatchTask merge-patches a NodeTask.
func PatchTask(name, patch string) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		return c.Patch(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: name}}, Merge(patch))
	}
}

// PatchNode merge-patches a Node.
func PatchNode(name, patch string) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		return c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, Merge(patch))
	}
}

// Cordon runs the agent's own cordon command against node with the client it is given.
func Cordon(name string) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		_, err := commands.Run(ctx, &commands.Env{NodeName: name, Client: c}, &v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}})
		return err
	}
}

// Merge is a JSON merge patch.
func Merge(s string) client.Patch { return client.RawPatch(types.MergePatchType, []byte(s)) }

// annotationLeaseNode carries a node Lease's node: admission confines an agent to its own node's
// Lease by it (config/admission). Agents hold their node by a lock on the node itself now, but the
// confinement of the Leases they may still write is kept and tested.
const annotationLeaseNode = "nodeops.io/node-name"

// NodeLease is node's Lease in namespace as agents created it.
func NodeLease(namespace, node string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Namespace:   namespace,
		Name:        objname.NodeLeaseName(node),
		Labels:      map[string]string{v1alpha1.LabelNode: objname.LabelValue(node)},
		Annotations: map[string]string{annotationLeaseNode: node},
	}}
}
