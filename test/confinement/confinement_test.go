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
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/config"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/internal/testutil/confine"
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
	env, err = testutil.StartWith(testutil.Options{CRDs: []string{"nodetasks"}, Admission: true, NodeAuthorizer: true})
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
	objs, err := config.Manifests(config.Agent, "agent/daemonset.yaml")
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
	// Pods of node-a and node-b the agent on node-a may not delete or change: node-b's installer pod,
	// and a pod on node-a that is no installer's; node-a's installer pod it may delete, not change.
	for name, p := range map[string][2]string{"installer-a": {"node-a", commands.InstallerServiceAccount},
		"installer-b": {"node-b", commands.InstallerServiceAccount}, "other-a": {"node-a", agentSA}} {
		pod := installerPod(p[0])
		pod.Name, pod.Spec.ServiceAccountName = name, p[1]
		if err := admin.Create(ctx, pod); err != nil {
			return err
		}
	}
	for _, n := range []string{ns, "default"} {
		if err := admin.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: n}}); err != nil {
			return err
		}
	}
	// node-b's Lease, as node-b's agent took it for task-b (exclusion that cannot be bypassed, rule 8).
	lease := confine.NodeLease(ns, "node-b")
	lease.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To(taskB), LeaseDurationSeconds: ptr.To[int32](60), RenewTime: ptr.To(metav1.NowMicro())}
	return admin.Create(ctx, lease)
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
		if err := manager.Create(ctx, confine.NewTask(name, node)); err != nil {
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

// cluster is what the shared refusal table (internal/testutil/confine) acts on here.
func cluster() confine.Cluster {
	return confine.Cluster{Admin: admin, Namespace: ns, NodeA: "node-a", NodeB: "node-b", TaskA: taskA, TaskB: taskB, WorkloadNamespace: workloadNS}
}

// installerPod is the pod node's agent creates for task-a's first command, a pod command asking for
// all it may: privileged, the host's PID namespace and its / at /host.
func installerPod(node string) *corev1.Pod {
	return commands.InstallerPod(ns, node, taskA, 0, installer())
}

func installer() *v1alpha1.PodCommand {
	return &v1alpha1.PodCommand{Image: "ghcr.io/kwasm/kwasm-node-installer:v0.3.1", Privileged: true, HostPID: true, MountHostRoot: true,
		Env: []v1alpha1.PodEnvVar{{Name: "NODE_ROOT", Value: "/host"}}}
}

// createPod creates node-a's installer pod changed by change.
func createPod(change func(*corev1.Pod)) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		pod := installerPod("node-a")
		change(pod)
		return c.Create(ctx, pod)
	}
}

func deletePod(name string) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		return c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}})
	}
}

// attempts is every write node-a's agent must not make: the shared table and the pod command's rows.
func attempts() []confine.Attempt { return append(cluster().Attempts(), podAttempts...) }

var podAttempts = []confine.Attempt{
	{Name: "create a pod on node-b", Do: func(ctx context.Context, c client.Client) error { return c.Create(ctx, installerPod("node-b")) },
		Policy: []string{"agent on node node-a creates pods only in its namespace (nodeops-system) with spec.nodeName node-a", "CREATE pods", "(spec.nodeName node-b)"}},
	{Name: "create a pod outside its namespace", Do: createPod(func(p *corev1.Pod) { p.Namespace = "default" }),
		Policy: []string{"creates pods only in its namespace (nodeops-system)", "in namespace default"}, RBAC: []string{`cannot create resource "pods"`}},
	{Name: "create a pod as another ServiceAccount", Do: createPod(func(p *corev1.Pod) { p.Spec.ServiceAccountName = agentSA }),
		Policy: []string{"creates pods only with spec.serviceAccountName nodeops-installer", "(spec.serviceAccountName nodeops-agent)"}},
	{Name: "create a pod that may mount a token", Do: createPod(func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = nil }),
		Policy: []string{"spec.automountServiceAccountToken false", "CREATE pods installer-node-a"}},
	{Name: "create a pod mounting a Secret", Do: createPod(func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "kept"}}})
	}), Policy: []string{"spec.volumes are only the hostPath / (no secret", "CREATE pods installer-node-a"}},
	{Name: "create a pod mounting a host path other than /", Do: createPod(func(p *corev1.Pod) { p.Spec.Volumes[0].HostPath.Path = "/etc/kubernetes/pki" }),
		Policy: []string{"spec.volumes are only the hostPath /", "CREATE pods installer-node-a"}},
	{Name: "create a pod taking env from a Secret", Do: createPod(func(p *corev1.Pod) {
		p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "kept"}, Key: "k"}}})
	}), Policy: []string{"env has plain values only (no envFrom, no valueFrom)", "CREATE pods installer-node-a"}},
	{Name: "create a pod on the host's network", Do: createPod(func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
		Policy: []string{"without spec.hostNetwork or spec.hostIPC", "CREATE pods installer-node-a"}},
	{Name: "delete node-b's installer pod", Do: deletePod("installer-b"),
		Policy: []string{"deletes only its node's nodeops-installer pods", "DELETE pods installer-b", "(spec.nodeName node-b)"}},
	{Name: "delete a pod on node-a that is no installer's", Do: deletePod("other-a"),
		Policy: []string{"deletes only its node's nodeops-installer pods", "DELETE pods other-a"}},
	{Name: "change its node's installer pod", Do: func(ctx context.Context, c client.Client) error {
		return c.Patch(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "installer-a", Namespace: ns}}, confine.Merge(`{"metadata":{"labels":{"x":"y"}}}`))
	}, Policy: []string{"and updates none", "UPDATE pods installer-a"}, RBAC: []string{`cannot patch resource "pods"`}},
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
		for _, a := range attempts() {
			confine.Refused(t, a.Name, a.Do(ctx, c), a.Want())
		}
		_, err := cs.CoreV1().Secrets(ns).Get(ctx, "kept", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the secret is not there: %v", err)
		}
		// No Secret at all, not even by name in nodeops-system: scripts read theirs from the volumes
		// their node's kubelet mounts for the task's secret holder pod (docs/operations/security.md).
		cluster().CheckSecretReads(t, c, agentCS, "kept", "default", "kept")
	})
	t.Run("admission alone", func(t *testing.T) {
		bindClusterAdmin(t)
		for _, a := range attempts() {
			err := a.Do(ctx, c)
			if a.Or != nil && err != nil && strings.Contains(err.Error(), a.Or[0]) {
				confine.Refused(t, a.Name, err, a.Or)
				continue
			}
			confine.Refused(t, a.Name, err, a.Policy)
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
// task's status from Running to Succeeded (the allowed path), cordon then uncordon of its node
// by the agent's own commands, which set spec.unschedulable and the annotation, and a pod command's
// pod on its node.
func TestAgentOnNodeAWorks(t *testing.T) {
	ctx := context.Background()
	c, agentCS := as(t, token(t, "node-a"))
	tasks(t)
	for _, phase := range []v1alpha1.TaskPhase{v1alpha1.TaskRunning, v1alpha1.TaskSucceeded} {
		if err := cluster().StatusOf(taskA, phase)(ctx, c); err != nil {
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
	if err := c.Status().Patch(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: taskA}}, confine.Merge(hb)); err != nil {
		t.Errorf("node-a's agent renewing its heartbeat (a status merge patch): %v", err)
	}

	// Its node's Lease (exclusion that cannot be bypassed, rule 8): created, then taken over and renewed by updates.
	lease := confine.NodeLease(ns, "node-a")
	lease.Spec.HolderIdentity = ptr.To(taskA)
	if err := c.Create(ctx, lease); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("node-a's agent creating its node's lease: %v", err)
	}
	if err := cluster().TakeLease("node-a", taskA)(ctx, c); err != nil {
		t.Errorf("node-a's agent renewing its node's lease: %v", err)
	}

	if err := confine.Cordon("node-a")(ctx, c); err != nil {
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

	// The pod command, run by the agent's own handler: its pod on node-a (privileged, host PID, the
	// host's / mounted), read, its log asked for, then deleted. Envtest has no kubelet: the test
	// writes the pod's status as one would.
	done := make(chan error, 1)
	go func() {
		env := &commands.Env{NodeName: "node-a", Task: taskA, Namespace: ns, Client: c, Poll: 100 * time.Millisecond}
		_, err := commands.Run(ctx, env, &v1alpha1.Command{Pod: installer()})
		done <- err
	}()
	key := client.ObjectKeyFromObject(installerPod("node-a"))
	testutil.EndPod(t, admin, testutil.WaitPod(t, admin, key), 0)
	if err := <-done; err != nil {
		t.Errorf("node-a's agent running a pod command on node-a: %v", err)
	}
	if err := admin.Get(ctx, key, &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pod command's pod after it ended: %v, want NotFound (deleted by the agent)", err)
	}
	// Its log (pods/log): the API server lets the agent ask, then finds no kubelet to ask.
	if err := agentCS.CoreV1().Pods(ns).GetLogs("installer-a", &corev1.PodLogOptions{}).Do(ctx).Error(); apierrors.IsForbidden(err) {
		t.Errorf("node-a's agent reading a pod's log: %v", err)
	}

	// A control plane's agent records its certificates' expiry on its own Node (agent.CertificateReader).
	reading := v1alpha1.EncodeCertificates([]v1alpha1.CertificateExpiry{{Name: "apiserver", NotAfter: metav1.Now()}})
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.AnnotationCertificates: reading}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := confine.PatchNode("node-a", string(patch))(ctx, c); err != nil {
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
	confine.Refused(t, "status of node-a's task", cluster().StatusOf(taskA, v1alpha1.TaskSucceeded)(ctx, c), append(want, "UPDATE nodetasks/status task-a"))
	confine.Refused(t, "cordon node-a", confine.Cordon("node-a")(ctx, c), append(want, "UPDATE nodes node-a"))
	// An eviction the shipped RBAC refuses before admission (TestSafetyRule10_AgentEvictsNoPod).
	confine.Refused(t, "evict the agent pod on node-b", confine.Evict(ctx, c, ns, "agent-node-b"), []string{`cannot create resource "pods/eviction"`})
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
	confine.Refused(t, "status of node-b's task", cluster().StatusOf(taskB, v1alpha1.TaskSucceeded)(ctx, c), []string{"own node's NodeTasks", "task-b"})
	if err := cluster().StatusOf(taskA, v1alpha1.TaskRunning)(ctx, c); err != nil {
		t.Errorf("status of its own task: %v", err)
	}
}

// TestSafetyRule10_OnlyTheManagerCreatesTasks: an administrator is refused too, with the way to run work instead.
func TestSafetyRule10_OnlyTheManagerCreatesTasks(t *testing.T) {
	err := admin.Create(context.Background(), confine.NewTask("by-admin", "node-a"))
	confine.Refused(t, "an administrator creating a NodeTask", err, []string{
		confine.NodeTaskCreationMessage, "creating NodeTask by-admin"})
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
		confine.Refused(t, "node-a's agent evicting a pod on "+n, confine.Evict(ctx, c, workloadNS, "workload-"+n), []string{`cannot create resource "pods/eviction"`})
		if err := admin.Get(ctx, client.ObjectKey{Namespace: workloadNS, Name: "workload-" + n}, &corev1.Pod{}); err != nil {
			t.Errorf("the pod on %s after the agent's eviction: %v", n, err)
		}
	}
	confine.Refused(t, "node-a's agent listing pods", c.List(ctx, &corev1.PodList{}), []string{`cannot list resource "pods"`})
	// What it still needs: a control plane's mirror pods, by name.
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "agent-node-a"}, &corev1.Pod{}); err != nil {
		t.Errorf("node-a's agent reading a pod by name: %v", err)
	}
}
