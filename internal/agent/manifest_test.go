package agent_test

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/controller/agentjob"
	"github.com/nodeops/nodeops/internal/host/hosttest"
	"github.com/nodeops/nodeops/internal/testutil"
)

// TestAgentWorksWithItsDeploymentRBAC installs config/agent/daemonset.yaml and runs an agent as its
// ServiceAccount: every API call the commands make must be allowed by the manifest's ClusterRole.
func TestAgentWorksWithItsDeploymentRBAC(t *testing.T) {
	ctx := context.Background()
	data, err := os.ReadFile("../../config/agent/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// nodeops-system, the agent's namespace, exists already (TestMain).
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
			t.Fatal(err)
		}
		// The pod command's tests may have made the installer's ServiceAccount already.
		if err := cl.Create(ctx, obj); apierrors.IsAlreadyExists(err) && obj.GetName() == commands.InstallerServiceAccount {
			continue
		} else if err != nil {
			t.Fatalf("creating %s %s from the manifest: %v", obj.GetKind(), obj.GetName(), err)
		}
		// Gone when the test ends, so that it can run again (-count=2).
		t.Cleanup(func() {
			if err := cl.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
				t.Errorf("deleting %s %s: %v", obj.GetKind(), obj.GetName(), err)
			}
		})
	}
	create(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rbac-1"}})
	create(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "victim", Namespace: "default"},
		Spec:       corev1.PodSpec{NodeName: "rbac-1", Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
	})

	asAgent := rest.CopyConfig(cfg)
	asAgent.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:nodeops-system:nodeops-agent"}
	root := hosttest.NewRoot(t, nil)
	createSecret(t, "nodeops-script-rbac", map[string]string{"RBAC_WORD": "no-secrets-rbac"})
	secretVolumes(t, map[string]string{"rbac-1": root})
	stop := startAgentWith(t, asAgent, agent.Options{NodeName: "rbac-1", HostRoot: root})
	defer stop()
	zero := int64(0)
	create(t, newTask("rbac-1", "rbac-1", v1alpha1.ExecutionAuto,
		v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}},
		// The victim has no controller: force, as the drain refuses it otherwise (drain honours PodDisruptionBudgets, rule 6).
		v1alpha1.Command{Drain: &v1alpha1.DrainCommand{GracePeriodSeconds: &zero, Force: true}},
		v1alpha1.Command{Uncordon: &v1alpha1.UncordonCommand{}},
		// Creates its pod in nodeops-system, reads it and its log, deletes it (the Role nodeops-agent-pods).
		podCommand(),
		// Its env from a Secret the agent may not read: through the task's secret holder pod.
		v1alpha1.Command{Script: &v1alpha1.ScriptCommand{Inline: `echo "$RBAC_WORD" > /rbac-word`,
			EnvFrom: []v1alpha1.EnvFromSource{{SecretRef: v1alpha1.SecretEnvSource{Name: "nodeops-script-rbac"}}}}},
	))
	testutil.EndPod(t, cl, testutil.WaitPod(t, cl, podKey("rbac-1")), 0)
	task := waitTask(t, "rbac-1", func(tk *v1alpha1.NodeTask) bool {
		return !tk.EffectivePhase().Unfinished() || tk.Status.Phase == v1alpha1.TaskFailed
	})
	if task.Status.Phase != v1alpha1.TaskSucceeded {
		t.Fatalf("task %s: %s", task.Status.Phase, task.Status.Message)
	}
	if tail := task.Status.Commands[3].OutputTail; strings.Contains(tail, "forbidden") {
		t.Errorf("the pod command's output: %s", tail)
	}
	podGone(t, podKey("rbac-1"))
	if got := hosttest.ReadFile(t, root, "/rbac-word"); got != "no-secrets-rbac\n" {
		t.Errorf("the script got %q from its Secret", got)
	}
	if err := cl.Get(ctx, client.ObjectKey{Namespace: commands.SecretNamespace, Name: "nodeops-script-rbac"}, &corev1.Secret{}); err != nil {
		t.Fatal(err)
	}
	asAgentClient, err := client.New(asAgent, client.Options{Scheme: cl.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := asAgentClient.Get(ctx, client.ObjectKey{Namespace: commands.SecretNamespace, Name: "nodeops-script-rbac"}, &corev1.Secret{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent's RBAC getting its script's Secret: %v, want Forbidden", err)
	}
}

// TestSafetyRule12_AgentPodsOutliveTheGracePeriod: the kubelet kills an agent's pod
// terminationGracePeriodSeconds after SIGTERM, so every way the agent is deployed must give it more
// than its default --shutdown-grace-period (every command has a timeout, rule 12).
func TestSafetyRule12_AgentPodsOutliveTheGracePeriod(t *testing.T) {
	grace := int64(agent.DefaultShutdownGracePeriod / time.Second)
	check := func(where string, got int64) {
		if got <= grace {
			t.Errorf("%s: terminationGracePeriodSeconds %d, want more than the agent's shutdown grace period (%ds)", where, got, grace)
		}
	}
	job := agentjob.BuildJob("n", agentjob.Options{})
	check("agent Job", ptr.Deref(job.Spec.Template.Spec.TerminationGracePeriodSeconds, 30))
	for _, file := range []string{"../../config/agent/daemonset.yaml", "../../charts/nodeops/templates/agent.yaml"} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`terminationGracePeriodSeconds: (\d+)`).FindSubmatch(data)
		if m == nil {
			t.Errorf("%s sets no terminationGracePeriodSeconds (the default, 30s, is too short)", file)
			continue
		}
		n, _ := strconv.ParseInt(string(m[1]), 10, 64)
		check(file, n)
	}
}

// TestSafetyRule6_AgentPodsKnowTheirOwnName: every way the agent is deployed tells it its pod's
// name and namespace (cmd/agent's --pod-name and --pod-namespace defaults), so its drain spares it.
func TestSafetyRule6_AgentPodsKnowTheirOwnName(t *testing.T) {
	want := map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
	job := agentjob.BuildJob("n", agentjob.Options{})
	got := map[string]string{}
	for _, e := range job.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			got[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	for name, path := range want {
		if got[name] != path {
			t.Errorf("agent Job: %s is %q, want the downward API's %s", name, got[name], path)
		}
	}
	for _, file := range []string{"../../config/agent/daemonset.yaml", "../../charts/nodeops/templates/agent.yaml"} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for name, path := range want {
			re := regexp.MustCompile(`- name: ` + name + `\s+valueFrom:\s+fieldRef:\s+fieldPath: ` + regexp.QuoteMeta(path))
			if !re.Match(data) {
				t.Errorf("%s does not set %s from %s", file, name, path)
			}
		}
	}
}
