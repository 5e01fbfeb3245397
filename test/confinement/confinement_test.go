package confinement

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/config"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/testutil"
)

const (
	ns      = "nodeops-system"
	agentSA = "nodeops-agent"
	// workloadNS holds a workload pod on each node, which no agent may evict.
	workloadNS   = "default"
	managerUser  = "system:serviceaccount:nodeops-system:nodeops-manager"
	nodeNameKey  = "authentication.kubernetes.io/node-name"
	taskA, taskB = "task-a", "task-b"
)

var (
	env   *testutil.Env
	admin client.Client
	cs    *kubernetes.Clientset
	// manager creates NodeTasks as the manager's ServiceAccount (impersonated by an administrator).
	manager client.Client
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	env, err = testutil.StartWith(testutil.Options{CRDs: []string{"nodetasks"}, Admission: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	admin = env.Client
	if cs, err = kubernetes.NewForConfig(env.Config); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	asManager := rest.CopyConfig(env.Config)
	asManager.Impersonate = rest.ImpersonationConfig{UserName: managerUser, Groups: []string{"system:masters"}}
	if manager, err = client.New(asManager, client.Options{Scheme: env.Scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := setUp(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// setUp creates the namespace, the agent's ServiceAccount and RBAC from config/agent, two nodes and
// an agent pod on each.
func setUp(ctx context.Context) error {
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}
	objs, err := testutil.Manifests(config.Agent, "agent/daemonset.yaml")
	if err != nil {
		return err
	}
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			continue
		}
		if err := admin.Create(ctx, o); err != nil {
			return fmt.Errorf("create %s %s from config/agent: %w", o.GetKind(), o.GetName(), err)
		}
	}
	for _, n := range []string{"node-a", "node-b"} {
		if err := admin.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			return err
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "agent-" + n, Namespace: ns},
			Spec: corev1.PodSpec{NodeName: n, ServiceAccountName: agentSA,
				Containers: []corev1.Container{{Name: "agent", Image: "agent"}}},
		}
		if err := admin.Create(ctx, pod); err != nil {
			return err
		}
		workload := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "workload-" + n, Namespace: workloadNS},
			Spec:       corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
		}
		if err := admin.Create(ctx, workload); err != nil {
			return err
		}
	}
	for _, n := range []string{ns, "default"} {
		if err := admin.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: n}}); err != nil {
			return err
		}
	}
	// node-b's Lease, as node-b's agent took it for task-b (safety rule 8).
	lease := agent.NodeLease(ns, "node-b")
	lease.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To(taskB), LeaseDurationSeconds: ptr.To[int32](60), RenewTime: ptr.To(metav1.NowMicro())}
	return admin.Create(ctx, lease)
}

// takeLease makes node's Lease name the task, as a taking agent writes it.
func takeLease(node, task string) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		l := agent.NodeLease(ns, node)
		if err := admin.Get(ctx, client.ObjectKeyFromObject(l), l); err != nil {
			return err
		}
		l.Spec.HolderIdentity, l.Spec.RenewTime = ptr.To(task), ptr.To(metav1.NowMicro())
		return c.Update(ctx, l)
	}
}

// token mints a token of the agent's ServiceAccount, bound to the agent pod on node (a kubelet's
// projected token) or, with node "", bound to nothing (what a legacy Secret token is like).
func token(t *testing.T, node string) string {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if node != "" {
		pod, err := cs.CoreV1().Pods(ns).Get(context.Background(), "agent-"+node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), agentSA, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s/%s bound to node %q: %v", ns, agentSA, node, err)
	}
	return tr.Status.Token
}

// as is a client and clientset of the API server that authenticate with a bearer token.
func as(t *testing.T, tok string) (client.Client, *kubernetes.Clientset) {
	t.Helper()
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tok
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

// whoami is the user the API server sees behind a client.
func whoami(t *testing.T, k *kubernetes.Clientset) authenticationv1.UserInfo {
	t.Helper()
	r, err := k.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status.UserInfo
}

// newTask is a task for node as the manager would create it.
func newTask(name, node string) *v1alpha1.NodeTask {
	return &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelNode: node}},
		Spec: v1alpha1.NodeTaskSpec{NodeName: node, ExecutionMode: v1alpha1.ExecutionControlled,
			Commands: []v1alpha1.Command{{Cordon: &v1alpha1.CordonCommand{}}}},
	}
}

// tasks (re)creates task-a on node-a and task-b on node-b as the manager.
func tasks(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for name, node := range map[string]string{taskA: "node-a", taskB: "node-b"} {
		err := admin.Delete(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: name}})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		testutil.Eventually(t, 10*time.Second, "task "+name+" gone", func() error {
			err := admin.Get(ctx, client.ObjectKey{Name: name}, &v1alpha1.NodeTask{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return err
			}
			return fmt.Errorf("still there")
		})
		if err := manager.Create(ctx, newTask(name, node)); err != nil {
			t.Fatalf("the manager creating %s: %v", name, err)
		}
	}
}

func get(t *testing.T, name string) *v1alpha1.NodeTask {
	t.Helper()
	task := &v1alpha1.NodeTask{}
	if err := admin.Get(context.Background(), client.ObjectKey{Name: name}, task); err != nil {
		t.Fatal(err)
	}
	return task
}

func node(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{}
	if err := admin.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	return n
}

func merge(s string) client.Patch { return client.RawPatch(types.MergePatchType, []byte(s)) }

// attempt is one write an agent on node-a must not make; want are parts of the refusal's message.
type attempt struct {
	name string
	do   func(ctx context.Context, c client.Client) error
	// policy: what the admission policy's refusal says (the agent's RBAC allows the request);
	// rbac: what RBAC's says, when the shipped ClusterRole already refuses it; or: another policy
	// that refuses it too, whose message may come first (the API server's order is not fixed).
	policy, rbac, or []string
}

func statusOf(name string, phase v1alpha1.TaskPhase) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		task := &v1alpha1.NodeTask{}
		if err := admin.Get(ctx, client.ObjectKey{Name: name}, task); err != nil {
			return err
		}
		task.Status.Phase = phase
		return c.Status().Update(ctx, task)
	}
}

func patchTask(name, patch string) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		return c.Patch(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: name}}, merge(patch))
	}
}

func patchNode(name, patch string) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		return c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, merge(patch))
	}
}

// cordon runs the agent's own cordon command against node with the agent's client.
func cordon(name string) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		_, err := commands.Run(ctx, &commands.Env{NodeName: name, Client: c}, &v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}})
		return err
	}
}

var attempts = []attempt{
	{name: "status of node-b's task", do: statusOf(taskB, v1alpha1.TaskSucceeded),
		policy: []string{"agent on node node-a writes only the status of its own node's NodeTasks", "UPDATE nodetasks/status task-b", "spec.nodeName node-b"}},
	{name: "approvedCommands of its own task", do: patchTask(taskA, `{"spec":{"approvedCommands":1}}`),
		policy: []string{"never its spec or metadata", "UPDATE nodetasks task-a"}, rbac: []string{`cannot patch resource "nodetasks"`}},
	{name: "recoveryMode of its own task", do: patchTask(taskA, `{"spec":{"recoveryMode":"Skip"}}`),
		policy: []string{"never its spec or metadata", "UPDATE nodetasks task-a"}, rbac: []string{`cannot patch resource "nodetasks"`}},
	{name: "abort its own task", do: patchTask(taskA, `{"spec":{"abort":true}}`),
		policy: []string{"never its spec or metadata", "UPDATE nodetasks task-a"}, rbac: []string{`cannot patch resource "nodetasks"`}},
	{name: "move node-b's task to node-a by label", do: patchTask(taskB, `{"metadata":{"labels":{"nodeops.io/node":"node-a"}}}`),
		policy: []string{"never its spec or metadata", "UPDATE nodetasks task-b"}, rbac: []string{`cannot patch resource "nodetasks"`}},
	{name: "create a task", do: func(ctx context.Context, c client.Client) error {
		return c.Create(ctx, newTask("made-by-agent", "node-a"))
	},
		policy: []string{"never a create or delete", "CREATE nodetasks made-by-agent"},
		or:     []string{"NodeTasks are created by nodeops' manager; create a NodeOperation (kubectl nodeops ...) instead", "creating NodeTask made-by-agent"},
		rbac:   []string{`cannot create resource "nodetasks"`}},
	{name: "delete its own task", do: func(ctx context.Context, c client.Client) error {
		return c.Delete(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: taskA}})
	}, policy: []string{"never a create or delete", "DELETE nodetasks task-a"}, rbac: []string{`cannot delete resource "nodetasks"`}},
	{name: "cordon node-b", do: cordon("node-b"),
		policy: []string{"agent on node node-a may update only its own Node", "UPDATE nodes node-b"}},
	{name: "label node-a provisioned", do: patchNode("node-a", `{"metadata":{"labels":{"nodeops.io/profile.x":"provisioned"}}}`),
		policy: []string{"may not change its Node's labels", "UPDATE nodes node-a"}},
	{name: "annotate node-a", do: patchNode("node-a", `{"metadata":{"annotations":{"nodeops.io/profile.x":"hash"}}}`),
		policy: []string{"no annotation of its Node but nodeops.io/was-unschedulable", "UPDATE nodes node-a"}},
	{name: "record certificates on node-b", do: patchNode("node-b", `{"metadata":{"annotations":{"nodeops.io/certificates":"[]"}}}`),
		policy: []string{"agent on node node-a may update only its own Node", "UPDATE nodes node-b"}},
	{name: "taint node-a", do: patchNode("node-a", `{"spec":{"taints":[{"key":"k","effect":"NoSchedule"}]}}`),
		policy: []string{"only spec.unschedulable of its Node's spec", "UPDATE nodes node-a"}},
	{name: "finalize node-a", do: patchNode("node-a", `{"metadata":{"finalizers":["example.com/keep"]}}`),
		policy: []string{"finalizers or ownerReferences", "UPDATE nodes node-a"}},
	{name: "node-a's status", do: func(ctx context.Context, c client.Client) error {
		return c.Status().Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, merge(`{"status":{"phase":"Running"}}`))
	}, policy: []string{"not its status", "UPDATE nodes/status node-a"}, rbac: []string{`cannot patch resource "nodes/status"`}},
	{name: "delete node-b", do: func(ctx context.Context, c client.Client) error {
		return c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}})
	}, policy: []string{"create or delete none", "DELETE nodes node-b"}, rbac: []string{`cannot delete resource "nodes"`}},
	{name: "take node-b's lease", do: takeLease("node-b", taskA),
		policy: []string{"agent on node node-a creates or updates only its own node's Lease (node-node-a", "UPDATE leases node-node-b"}},
	{name: "create node-c's lease", do: func(ctx context.Context, c client.Client) error {
		return c.Create(ctx, agent.NodeLease(ns, "node-c"))
	}, policy: []string{"creates or updates only its own node's Lease", "CREATE leases node-node-c"}},
	{name: "create node-c's lease annotated node-a", do: func(ctx context.Context, c client.Client) error {
		l := agent.NodeLease(ns, "node-c")
		l.Annotations[agent.AnnotationLeaseNode] = "node-a"
		return c.Create(ctx, l)
	}, policy: []string{"creates or updates only its own node's Lease", "CREATE leases node-node-c"}},
	{name: "delete node-b's lease", do: func(ctx context.Context, c client.Client) error {
		return c.Delete(ctx, agent.NodeLease(ns, "node-b"))
	}, policy: []string{"deletes none", "DELETE leases node-node-b"}, rbac: []string{`cannot delete resource "leases"`}},
	{name: "a ConfigMap", do: func(ctx context.Context, c client.Client) error {
		return c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "by-agent", Namespace: ns}})
	}, policy: []string{"writes only NodeTask status, its own Node and its node's Lease", "CREATE configmaps by-agent"}, rbac: []string{`cannot create resource "configmaps"`}},
	// The manager drains for the agent, so an agent evicts nothing: not elsewhere, not on its own node.
	{name: "evict a pod on node-b", do: func(ctx context.Context, c client.Client) error { return evict(ctx, c, workloadNS, "workload-node-b") },
		policy: []string{"writes only NodeTask status, its own Node and its node's Lease", "CREATE pods/eviction workload-node-b"}, rbac: []string{`cannot create resource "pods/eviction"`}},
	{name: "evict a pod on node-a", do: func(ctx context.Context, c client.Client) error { return evict(ctx, c, workloadNS, "workload-node-a") },
		policy: []string{"writes only NodeTask status, its own Node and its node's Lease", "CREATE pods/eviction workload-node-a"}, rbac: []string{`cannot create resource "pods/eviction"`}},
}

// refused checks that err is a refusal whose message has every part of want.
func refused(t *testing.T, what string, err error, want []string) {
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

// TestTokensCarryTheirNode: the API server puts the pod's node into a pod-bound token's user, and
// nothing into an unbound one (the premise of the policy).
func TestTokensCarryTheirNode(t *testing.T) {
	_, k := as(t, token(t, "node-a"))
	u := whoami(t, k)
	if u.Username != "system:serviceaccount:nodeops-system:nodeops-agent" {
		t.Errorf("username %q", u.Username)
	}
	if got := u.Extra[nodeNameKey]; len(got) != 1 || got[0] != "node-a" {
		t.Errorf("a token bound to the pod on node-a has %s %v (extra %v)", nodeNameKey, got, u.Extra)
	}
	_, k = as(t, token(t, ""))
	if u := whoami(t, k); len(u.Extra[nodeNameKey]) != 0 {
		t.Errorf("an unbound token has %s %v", nodeNameKey, u.Extra[nodeNameKey])
	}
}

// TestSafetyRule10_AgentOnNodeAIsRefused: every write node-a's agent must not make is refused, first by the
// shipped RBAC and admission together, then by the admission policy alone (the agent's
// ServiceAccount bound to cluster-admin), so neither layer leans on the other.
func TestSafetyRule10_AgentOnNodeAIsRefused(t *testing.T) {
	ctx := context.Background()
	c, agentCS := as(t, token(t, "node-a"))
	tasks(t)
	taints := node(t, "node-a").Spec.Taints // the API server's not-ready taint
	t.Run("shipped RBAC", func(t *testing.T) {
		// A cluster-admin binding of an earlier run (-count) may linger in the RBAC informer.
		testutil.Eventually(t, 10*time.Second, "the agent's shipped RBAC alone", func() error {
			if err := c.List(ctx, &corev1.SecretList{}, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
				return fmt.Errorf("listing Secrets: %w, want Forbidden", err)
			}
			return nil
		})
		for _, a := range attempts {
			want := a.rbac
			if want == nil {
				want = a.policy
			}
			refused(t, a.name, a.do(ctx, c), want)
		}
		_, err := cs.CoreV1().Secrets(ns).Get(ctx, "kept", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the secret is not there: %v", err)
		}
		// Scripts' env from Secrets: get by name in nodeops-system is the one read allowed (the
		// agent itself reads only labelled Secrets its task names; README "Security").
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kept"}, &corev1.Secret{}); err != nil {
			t.Errorf("get a Secret in %s, which scripts' env needs: %v", ns, err)
		}
		refused(t, "read a Secret outside "+ns, c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "kept"}, &corev1.Secret{}), []string{`cannot get resource "secrets"`})
		refused(t, "list Secrets", c.List(ctx, &corev1.SecretList{}), []string{`cannot list resource "secrets"`})
		refused(t, "list Secrets in "+ns, c.List(ctx, &corev1.SecretList{}, client.InNamespace(ns)), []string{`cannot list resource "secrets"`})
		w, err := agentCS.CoreV1().Secrets(ns).Watch(ctx, metav1.ListOptions{})
		if err == nil {
			w.Stop()
		}
		refused(t, "watch Secrets in "+ns, err, []string{`cannot watch resource "secrets"`})
	})
	t.Run("admission alone", func(t *testing.T) {
		bindClusterAdmin(t)
		for _, a := range attempts {
			err := a.do(ctx, c)
			if a.or != nil && err != nil && strings.Contains(err.Error(), a.or[0]) {
				refused(t, a.name, err, a.or)
				continue
			}
			refused(t, a.name, err, a.policy)
		}
	})
	if n := node(t, "node-b"); n.Spec.Unschedulable {
		t.Errorf("node-b was cordoned")
	}
	if n := node(t, "node-a"); len(n.Labels) > 0 || !reflect.DeepEqual(n.Spec.Taints, taints) {
		t.Errorf("node-a changed: labels %v taints %v", n.Labels, n.Spec.Taints)
	}
	if task := get(t, taskA); task.Spec.ApprovedCommands != 0 || task.Spec.RecoveryMode != "" || task.Spec.Abort {
		t.Errorf("task-a's spec changed: %+v", task.Spec)
	}
	if task := get(t, taskB); task.Status.Phase != "" || task.Labels[v1alpha1.LabelNode] != "node-b" {
		t.Errorf("task-b changed: phase %q labels %v", task.Status.Phase, task.Labels)
	}
}

// bindClusterAdmin binds the agent's ServiceAccount to cluster-admin for the rest of the test.
func bindClusterAdmin(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test-agent-cluster-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: agentSA, Namespace: ns}},
	}
	if err := admin.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(ctx, b) })
	// RBAC is read from an informer: wait until the binding counts.
	c, _ := as(t, token(t, "node-a"))
	testutil.Eventually(t, 10*time.Second, "cluster-admin binding in effect", func() error {
		return c.List(ctx, &corev1.SecretList{}, client.InNamespace(ns))
	})
}

// TestAgentOnNodeAWorks: what the agent does need still works with its pod-bound token: its own
// task's status from Running to Succeeded (the allowed path), and cordon then uncordon of its node
// by the agent's own commands, which set spec.unschedulable and the annotation.
func TestAgentOnNodeAWorks(t *testing.T) {
	ctx := context.Background()
	c, _ := as(t, token(t, "node-a"))
	tasks(t)
	for _, phase := range []v1alpha1.TaskPhase{v1alpha1.TaskRunning, v1alpha1.TaskSucceeded} {
		if err := statusOf(taskA, phase)(ctx, c); err != nil {
			t.Fatalf("node-a's agent setting its own task %s: %v", phase, err)
		}
	}
	if got := get(t, taskA).Status.Phase; got != v1alpha1.TaskSucceeded {
		t.Errorf("task-a is %q, want Succeeded", got)
	}
	ts, err := json.Marshal(metav1.NowMicro())
	if err != nil {
		t.Fatal(err)
	}
	hb := `{"status":{"agentHeartbeat":` + string(ts) + `}}`
	if err := c.Status().Patch(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: taskA}}, merge(hb)); err != nil {
		t.Errorf("node-a's agent renewing its heartbeat (a status merge patch): %v", err)
	}

	// Its node's Lease (safety rule 8): created, then taken over and renewed by updates.
	lease := agent.NodeLease(ns, "node-a")
	lease.Spec.HolderIdentity = ptr.To(taskA)
	if err := c.Create(ctx, lease); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("node-a's agent creating its node's lease: %v", err)
	}
	if err := takeLease("node-a", taskA)(ctx, c); err != nil {
		t.Errorf("node-a's agent renewing its node's lease: %v", err)
	}

	if err := cordon("node-a")(ctx, c); err != nil {
		t.Fatalf("node-a's agent cordoning node-a: %v", err)
	}
	n := node(t, "node-a")
	if !n.Spec.Unschedulable || !strings.HasPrefix(n.Annotations[commands.AnnotationWasUnschedulable], "false,") {
		t.Errorf("after cordon: unschedulable %v, annotations %v", n.Spec.Unschedulable, n.Annotations)
	}
	_, err = commands.Run(ctx, &commands.Env{NodeName: "node-a", Client: c}, &v1alpha1.Command{Uncordon: &v1alpha1.UncordonCommand{}})
	if err != nil {
		t.Fatalf("node-a's agent uncordoning node-a: %v", err)
	}
	if n := node(t, "node-a"); n.Spec.Unschedulable || n.Annotations[commands.AnnotationWasUnschedulable] != "" {
		t.Errorf("after uncordon: unschedulable %v, annotations %v", n.Spec.Unschedulable, n.Annotations)
	}

	// A control plane's agent records its certificates' expiry on its own Node (agent.CertificateReader).
	reading := v1alpha1.EncodeCertificates([]v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: metav1.Now()}})
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.AnnotationCertificates: reading}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := patchNode("node-a", string(patch))(ctx, c); err != nil {
		t.Fatalf("node-a's agent recording its certificates on node-a: %v", err)
	}
	if got := node(t, "node-a").Annotations[v1alpha1.AnnotationCertificates]; got != reading {
		t.Errorf("node-a's certificates annotation %q, want %q", got, reading)
	}
}

// TestSafetyRule10_TokenWithoutANodeIsRefused: the agent's ServiceAccount with a token bound to no pod (as a
// legacy Secret token is) may write nothing, not even its node's task status or a cordon.
func TestSafetyRule10_TokenWithoutANodeIsRefused(t *testing.T) {
	ctx := context.Background()
	c, _ := as(t, token(t, ""))
	tasks(t)
	want := []string{"writes only with a token bound to its pod on a node"}
	refused(t, "status of node-a's task", statusOf(taskA, v1alpha1.TaskSucceeded)(ctx, c), append(want, "UPDATE nodetasks/status task-a"))
	refused(t, "cordon node-a", cordon("node-a")(ctx, c), append(want, "UPDATE nodes node-a"))
	// An eviction the shipped RBAC refuses before admission (TestSafetyRule10_AgentEvictsNoPod).
	refused(t, "evict the agent pod on node-b", evict(ctx, c, ns, "agent-node-b"), []string{`cannot create resource "pods/eviction"`})
}

// TestAgentGroupIsConfined: any user in the group nodeops.io:agents is an agent, with the node its
// credentials carry (here set by impersonation, as an authenticating proxy would).
func TestAgentGroupIsConfined(t *testing.T) {
	ctx := context.Background()
	tasks(t)
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "some-agent", Groups: []string{"system:masters", "nodeops.io:agents"},
		Extra: map[string][]string{nodeNameKey: {"node-a"}}}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	refused(t, "status of node-b's task", statusOf(taskB, v1alpha1.TaskSucceeded)(ctx, c), []string{"own node's NodeTasks", "task-b"})
	if err := statusOf(taskA, v1alpha1.TaskRunning)(ctx, c); err != nil {
		t.Errorf("status of its own task: %v", err)
	}
}

// TestSafetyRule10_OnlyTheManagerCreatesTasks: an administrator is refused too, with the way to run work instead.
func TestSafetyRule10_OnlyTheManagerCreatesTasks(t *testing.T) {
	err := admin.Create(context.Background(), newTask("by-admin", "node-a"))
	refused(t, "an administrator creating a NodeTask", err, []string{
		"NodeTasks are created by nodeops' manager; create a NodeOperation (kubectl nodeops ...) instead",
		"creating NodeTask by-admin"})
	tasks(t) // the manager can
}

// TestSafetyRule10_AgentEvictsNoPod: an Eviction names a pod, not its node, so no admission policy
// can confine evictions to the agent's node; the manager drains instead (internal/controller/nodetask,
// drain.go), and node-a's agent token evicts nothing: not a pod on node-b, not one on node-a, and it
// lists no pods. (Refused by admission alone too: the evictions in TestSafetyRule10_AgentOnNodeAIsRefused.)
func TestSafetyRule10_AgentEvictsNoPod(t *testing.T) {
	ctx := context.Background()
	c, _ := as(t, token(t, "node-a"))
	// A cluster-admin binding of an earlier test may linger in the RBAC informer.
	testutil.Eventually(t, 10*time.Second, "the agent's shipped RBAC alone", func() error {
		if err := c.List(ctx, &corev1.SecretList{}, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
			return fmt.Errorf("listing Secrets: %w, want Forbidden", err)
		}
		return nil
	})
	for _, n := range []string{"node-b", "node-a"} {
		refused(t, "node-a's agent evicting a pod on "+n, evict(ctx, c, workloadNS, "workload-"+n), []string{`cannot create resource "pods/eviction"`})
		if err := admin.Get(ctx, client.ObjectKey{Namespace: workloadNS, Name: "workload-" + n}, &corev1.Pod{}); err != nil {
			t.Errorf("the pod on %s after the agent's eviction: %v", n, err)
		}
	}
	refused(t, "node-a's agent listing pods", c.List(ctx, &corev1.PodList{}), []string{`cannot list resource "pods"`})
	// What it still needs: a control plane's mirror pods, by name.
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "agent-node-a"}, &corev1.Pod{}); err != nil {
		t.Errorf("node-a's agent reading a pod by name: %v", err)
	}
}

func evict(ctx context.Context, c client.Client, namespace, pod string) error {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: namespace}}
	return c.SubResource("eviction").Create(ctx, p, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: namespace}})
}
