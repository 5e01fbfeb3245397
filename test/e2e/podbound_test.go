package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/localcluster"
	"github.com/nodeops/nodeops/internal/secretholder"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/internal/testutil/confine"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// TestPodBoundAgents runs nodeops-local as a real install is credentialed (--agent-credentials=pod-bound):
// each node's agent with a TokenRequest token bound to a pod on its node, under config/agent's RBAC
// and config/admission's policies. The agents do their work with it (cordon, drain, a script taking
// its env from a Secret through its task's secret holder pod, uncordon on two nodes), and worker-1's
// token is refused, by the real API server, every write test/confinement lists and every Secret read
// (agents confined to their own node, rule 10).
func TestPodBoundAgents(t *testing.T) {
	t.Parallel()
	l := framework.StartLocal(t, "--control-planes=1", "--workers=2", "--agent-credentials=pod-bound")
	l.WaitNodesReady(t, 3, 3*time.Minute)
	ctx := context.Background()
	a, b := "worker-1", "worker-2"
	ns := localcluster.SystemNamespace

	t.Run("each local node's agent runs with a token bound to its stand-in pod, which carries the node", func(t *testing.T) {
		for _, node := range []string{"cp-1", a, b} {
			kubeconfig := "--kubeconfig=" + localcluster.CredentialsKubeconfig(l.Dir, "agent-"+node)
			if args := framework.ProcessArgs(t, l, "agent-"+node); !slices.Contains(args, kubeconfig) || !slices.Contains(args, "--pod-name="+localcluster.StandInAgentPodName(node)) {
				t.Errorf("agent of %s runs with %v, want %s and its pod's name", node, args, kubeconfig)
			}
			_, cs := framework.AsAgent(t, l, node)
			u := framework.WhoAmI(t, cs)
			if u.Username != "system:serviceaccount:"+ns+":"+localcluster.AgentServiceAccount {
				t.Errorf("%s's agent is %q", node, u.Username)
			}
			if got := u.Extra["authentication.kubernetes.io/node-name"]; !slices.Equal(got, []string{node}) {
				t.Errorf("%s's agent's token carries node %v (extra %v)", node, got, u.Extra)
			}
			if got := u.Extra["authentication.kubernetes.io/pod-name"]; !slices.Equal(got, []string{localcluster.StandInAgentPodName(node)}) {
				t.Errorf("%s's agent's token is bound to pod %v", node, got)
			}
			// The API server granted the lifetime asked for: nodeops-local mints it again halfway.
			if exp := tokenExpiry(t, framework.ReadFile(t, localcluster.TokenFile(l.Dir, "agent-"+node))); time.Until(exp) < 12*time.Hour {
				t.Errorf("%s's agent's token expires at %s", node, exp)
			}
		}
	})

	// The agents' work: TaskA and TaskB are what the refusals below act on.
	var taskA, taskB string
	t.Run("cordon, drain, a script with a Secret's env, and uncordon succeed on both nodes", func(t *testing.T) {
		taskA, taskB = testPodBoundWork(t, l, a, b)
	})
	if taskA == "" || taskB == "" {
		t.Fatal("no tasks to check the refusals against")
	}

	k := confine.Cluster{Admin: l.Client, Namespace: ns, NodeA: a, NodeB: b, TaskA: taskA, TaskB: taskB}
	c, cs := framework.AsAgent(t, l, a)
	t.Run("worker-1's agent token is refused every write that is not its own node's", func(t *testing.T) {
		before := map[string]*corev1.Node{}
		for _, n := range []string{a, b} {
			before[n] = getNode(t, l, n)
		}
		for _, at := range k.Attempts() {
			confine.Refused(t, at.Name, at.Do(ctx, c), at.Want())
		}
		for _, n := range []string{a, b} {
			after := getNode(t, l, n)
			if after.Spec.Unschedulable || !reflect.DeepEqual(after.Spec.Taints, before[n].Spec.Taints) || !reflect.DeepEqual(after.Labels, before[n].Labels) {
				t.Errorf("node %s changed: unschedulable %v, taints %v, labels %v", n, after.Spec.Unschedulable, after.Spec.Taints, after.Labels)
			}
		}
		for _, name := range []string{taskA, taskB} {
			task := framework.GetTask(t, l, name)
			if task.Status.Phase != v1alpha1.TaskSucceeded || task.Spec.ApprovedCommands != 0 || task.Spec.RecoveryMode != "" || task.Spec.Abort {
				t.Errorf("task %s changed: phase %s, spec %+v", name, task.Status.Phase, task.Spec)
			}
		}
	})

	t.Run("worker-1's agent token reads no Secret, not even its own script's", func(t *testing.T) {
		framework.Create(t, l, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: "default"}, StringData: map[string]string{"k": "v"}})
		// The script read podbound-env through the kubelet's stand-in (testPodBoundWork); the token itself may not.
		k.CheckSecretReads(t, c, cs, podBoundSecret, "default", "kept")
	})

	t.Run("a NodeTask made by hand is refused, saying to create a NodeOperation", func(t *testing.T) {
		err := l.Client.Create(ctx, confine.NewTask("by-hand", a))
		confine.Refused(t, "an administrator creating a NodeTask", err, []string{confine.NodeTaskCreationMessage, "creating NodeTask by-hand"})
	})

	// Refused since the manager drains for the agents, whose RBAC has no evictions
	// (test/confinement's TestSafetyRule10_AgentEvictsNoPod).
	t.Run("worker-1's agent token is refused evicting a pod on worker-2", func(t *testing.T) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "workload-on-b", Namespace: "default"},
			Spec:       corev1.PodSpec{NodeName: b, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
		}
		framework.Create(t, l, pod)
		err := c.SubResource("eviction").Create(ctx, pod, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace}})
		confine.Refused(t, "evict a pod on "+b, err, nil)
		got := &corev1.Pod{}
		if err := l.Client.Get(ctx, client.ObjectKeyFromObject(pod), got); err != nil || got.DeletionTimestamp != nil {
			t.Errorf("the pod on %s after the eviction: %v, deleting %v", b, err, got.DeletionTimestamp)
		}
	})
}

// testPodBoundWork runs cordon, drain, a script and uncordon on nodes a and b, one at a time, under
// a Deployment with a pod on each, and returns the two tasks.
func testPodBoundWork(t *testing.T, l *framework.Local, a, b string) (taskA, taskB string) {
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "e2e-podbound"}}
	framework.Create(t, l, ns)
	t.Cleanup(func() { _ = l.Client.Delete(ctx, ns) })
	labels := map[string]string{"app": "spread"}
	framework.Create(t, l, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "spread", Namespace: ns.Name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					// One pod per schedulable worker, so each drain has a pod to evict.
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: localcluster.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule,
						LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, NodeTaintsPolicy: ptr.To(corev1.NodeInclusionPolicyHonor),
					}},
					Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
				},
			},
		},
	})
	testutil.EventuallyEvery(t, 2*time.Minute, framework.PollInterval, "a running pod of spread on each worker", func(ctx context.Context) error {
		var pods corev1.PodList
		if err := l.Client.List(ctx, &pods, client.InNamespace(ns.Name), client.MatchingLabels(labels)); err != nil {
			return err
		}
		on := map[string]bool{}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				on[p.Spec.NodeName] = true
			}
		}
		if !on[a] || !on[b] {
			return fmt.Errorf("running on %v", on)
		}
		return nil
	})
	framework.Create(t, l, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: podBoundSecret, Namespace: localcluster.SystemNamespace},
		StringData: map[string]string{"GREETING": "hello"},
	})

	op := customOp("podbound-work", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: localcluster.LabelHostname, Operator: metav1.LabelSelectorOpIn, Values: []string{a, b}},
	}},
		v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}},
		v1alpha1.Command{Drain: &v1alpha1.DrainCommand{Timeout: &metav1.Duration{Duration: 2 * time.Minute}}},
		v1alpha1.Command{Script: &v1alpha1.ScriptCommand{
			Inline:  `mkdir -p /var/tmp && echo "ran on $NODEOPS_NODE_NAME" | tee /var/tmp/podbound; [ "$GREETING" = hello ] && echo "read its Secret"`,
			EnvFrom: []v1alpha1.EnvFromSource{{SecretRef: v1alpha1.SecretEnvSource{Name: podBoundSecret}}},
		}},
		v1alpha1.Command{Uncordon: &v1alpha1.UncordonCommand{}})
	// One node at a time: the Deployment's evicted pod has the other worker to go to.
	op.Spec.Custom.Groups[0].MaxUnavailable = ptr.To(intstr.FromInt32(1))
	framework.Create(t, l, op)
	framework.WaitForOperation(t, l, framework.WaitForOperationInput{Name: op.Name, Phase: v1alpha1.OperationSucceeded, FailIfBlocked: true})

	tasks := framework.OperationTasks(t, l, op.Name)
	if len(tasks) != 2 {
		t.Fatalf("%d tasks, want one on each of %s and %s", len(tasks), a, b)
	}
	for _, task := range tasks {
		node := task.Spec.NodeName
		switch node {
		case a:
			taskA = task.Name
		case b:
			taskB = task.Name
		}
		if len(task.Status.Commands) != 4 {
			t.Fatalf("task %s has %d command results, want 4", task.Name, len(task.Status.Commands))
		}
		for _, cmd := range task.Status.Commands {
			if cmd.Phase != v1alpha1.CommandSucceeded {
				t.Errorf("%s: %s is %s: %s", task.Name, cmd.Name, cmd.Phase, cmd.Message)
			}
		}
		drain := task.Status.Commands[1]
		if !strings.Contains(drain.OutputTail, "evicted e2e-podbound/spread-") {
			t.Errorf("%s's drain evicted no pod of spread: %s\n%s", node, drain.Message, drain.OutputTail)
		}
		own := fmt.Sprintf("leaving %s/%s (the agent's own pod)", localcluster.SystemNamespace, localcluster.StandInAgentPodName(node))
		if !strings.Contains(drain.OutputTail, own) {
			t.Errorf("%s's drain does not say %q:\n%s", node, own, drain.OutputTail)
		}
		holder := localcluster.SystemNamespace + "/" + secretholder.PodName(task.Name)
		if out := task.Status.Commands[2].OutputTail; !strings.Contains(out, "ran on "+node) || !strings.Contains(out, "read its Secret") ||
			!strings.Contains(out, "from pod "+holder+"'s volume") {
			t.Errorf("%s's script printed %q, want it to have read its Secret from pod %s", node, out, holder)
		}
		if got, _ := os.ReadFile(filepath.Join(l.NodeRoot(node), "var/tmp/podbound")); string(got) != "ran on "+node+"\n" {
			t.Errorf("%s's root has %q from the script", node, got)
		}
		if n := getNode(t, l, node); n.Spec.Unschedulable || n.Annotations[commands.AnnotationWasUnschedulable] != "" {
			t.Errorf("%s after uncordon: unschedulable %v, annotations %v", node, n.Spec.Unschedulable, n.Annotations)
		}
	}
	// The manager made one secret holder pod per task (the manager's token, under
	// config/admission/manager-pods.yaml) and deleted it once the task finished.
	testutil.EventuallyEvery(t, time.Minute, framework.PollInterval, "no secret holder pod left", func(ctx context.Context) error {
		var pods corev1.PodList
		if err := l.Client.List(ctx, &pods, client.InNamespace(localcluster.SystemNamespace), client.MatchingLabels{secretholder.LabelComponent: secretholder.Component}); err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("pod %s is left", pods.Items[0].Name)
		}
		return nil
	})
	return taskA, taskB
}

// podBoundSecret is the Secret the pod-bound agents' scripts take their env from.
const podBoundSecret = "nodeops-script-podbound-env"

func getNode(t *testing.T, l *framework.Local, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{}
	if err := l.Client.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	return n
}

// tokenExpiry is the exp claim of a ServiceAccount token (a JWT), read without verifying it.
func tokenExpiry(t *testing.T, token string) time.Time {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("a token of %d parts", len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		Exp int64 `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	return time.Unix(claims.Exp, 0)
}
