package nodetask_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/secretholder"
	"github.com/nodeops/nodeops/internal/testutil"
)

// holderOptions are the manager's --agent-image and --agent-image-pull-policy in these tests.
var holderOptions = secretholder.Options{Image: "ghcr.io/nodeops/agent@sha256:" + fmt.Sprintf("%064d", 1), PullPolicy: corev1.PullNever}

// holderNamespace creates nodeops-system, the ServiceAccount holder pods run as (config/agent) and
// the nodes (a task on a deleted node is marked lost, a lost agent fails its task in bounded time, rule 9, and so finished).
func holderNamespace(t *testing.T, nodes ...string) {
	t.Helper()
	ctx := context.Background()
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: secretholder.Namespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: secretholder.ServiceAccount, Namespace: secretholder.Namespace}},
	}
	for _, n := range nodes {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	for _, o := range objs {
		if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

// removeWithHolder removes task and its holder pod when the test ends, the task first so that no
// holder is made for it again.
func removeWithHolder(t *testing.T, task *v1alpha1.NodeTask) {
	t.Helper()
	testutil.RemoveAtEnd(t, cl, task, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: secretholder.Namespace, Name: secretholder.PodName(task.Name)}})
}

func secretScript(valueFrom, envFrom string) v1alpha1.Command {
	return v1alpha1.Command{Script: &v1alpha1.ScriptCommand{
		Inline:  `echo "$TOKEN"`,
		Env:     []v1alpha1.EnvVar{{Name: "TOKEN", ValueFrom: &v1alpha1.EnvVarSource{SecretKeyRef: v1alpha1.SecretKeySelector{Name: valueFrom, Key: "token"}}}},
		EnvFrom: []v1alpha1.EnvFromSource{{SecretRef: v1alpha1.SecretEnvSource{Name: envFrom}}},
	}}
}

// holder is the task's holder pod as the API server has it; nil when there is none, or it is being
// deleted (envtest has no kubelet to finish the deletion of a pod bound to a node).
func holder(ctx context.Context, task string) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	err := cl.Get(ctx, client.ObjectKey{Namespace: secretholder.Namespace, Name: secretholder.PodName(task)}, pod)
	if apierrors.IsNotFound(err) || (err == nil && pod.DeletionTimestamp != nil) {
		return nil, nil
	}
	return pod, err
}

func waitHolder(t *testing.T, task string, uid types.UID) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	testutil.Eventually(t, 30*time.Second, "the secret holder pod of "+task, func() error {
		p, err := holder(context.Background(), task)
		switch {
		case err != nil:
			return err
		case p == nil:
			return fmt.Errorf("no holder pod")
		case !secretholder.OwnedBy(p, uid):
			return fmt.Errorf("holder pod %s is not the task's: owners %v", p.Name, p.OwnerReferences)
		}
		pod = p
		return nil
	})
	return pod
}

func waitNoHolder(t *testing.T, task string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "no secret holder pod of "+task, func() error {
		p, err := holder(context.Background(), task)
		if err != nil {
			return err
		}
		if p != nil {
			return fmt.Errorf("holder pod %s is there", p.Name)
		}
		return nil
	})
}

// finishDeletion does what the node's kubelet does once the holder's container stopped.
func finishDeletion(t *testing.T, task string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: secretholder.Namespace, Name: secretholder.PodName(task)}}
	if err := cl.Delete(context.Background(), pod, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// The manager keeps a secret holder pod for a task whose scripts name Secrets exactly while the task
// is unfinished: created with the task, bound to its node with one volume per Secret, deleted when the
// task failed, back when a retry runs it again, gone when it succeeded; a task naming no Secret gets none.
func TestSecretHolderPodOnlyWhileItsTaskRuns(t *testing.T) {
	ctx := context.Background()
	holderNamespace(t, "holder-n1", "holder-n2")
	agent := testutil.FakeAgent{Client: cl}
	plain := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: "holder-plain", Labels: map[string]string{v1alpha1.LabelNode: "holder-n2"}},
		Spec:       v1alpha1.NodeTaskSpec{NodeName: "holder-n2", Commands: []v1alpha1.Command{{Script: &v1alpha1.ScriptCommand{Inline: "true"}}}},
	}
	task := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: "holder-1", Labels: map[string]string{v1alpha1.LabelNode: "holder-n1"}},
		Spec: v1alpha1.NodeTaskSpec{NodeName: "holder-n1", Commands: []v1alpha1.Command{
			{Wait: &v1alpha1.WaitCommand{}},
			secretScript("nodeops-script-token", "nodeops-script-db.prod"),
			secretScript("nodeops-script-token", "nodeops-script-token"),
		}},
	}
	for _, tk := range []*v1alpha1.NodeTask{plain, task} {
		if err := cl.Create(ctx, tk); err != nil {
			t.Fatal(err)
		}
		removeWithHolder(t, tk)
	}

	pod := waitHolder(t, task.Name, task.UID)
	var secrets []string
	for _, v := range pod.Spec.Volumes {
		if v.Secret == nil || v.Secret.DefaultMode == nil || *v.Secret.DefaultMode != 0o400 || len(v.Secret.Items) != 0 {
			t.Errorf("volume %+v: want a whole Secret, mode 0400", v)
			continue
		}
		secrets = append(secrets, v.Secret.SecretName)
	}
	if !slices.Equal(secrets, []string{"nodeops-script-db.prod", "nodeops-script-token"}) {
		t.Errorf("holder pod mounts Secrets %v, want each the task names once", secrets)
	}
	c := pod.Spec.Containers[0]
	if pod.Spec.NodeName != "holder-n1" || pod.Spec.ServiceAccountName != secretholder.ServiceAccount || pod.Spec.AutomountServiceAccountToken == nil ||
		*pod.Spec.AutomountServiceAccountToken || c.Image != holderOptions.Image || c.ImagePullPolicy != corev1.PullNever ||
		!slices.Equal(c.Command, []string{"/agent", "--hold"}) || len(pod.Spec.Tolerations) != 1 || pod.Spec.Tolerations[0].Operator != corev1.TolerationOpExists {
		t.Errorf("holder pod: node %q, service account %q (token %v), container %s %s %v, tolerations %v",
			pod.Spec.NodeName, pod.Spec.ServiceAccountName, pod.Spec.AutomountServiceAccountToken, c.Image, c.ImagePullPolicy, c.Command, pod.Spec.Tolerations)
	}
	if p, err := holder(ctx, plain.Name); err != nil || p != nil {
		t.Errorf("a task naming no Secret has holder pod %v (%v)", p, err)
	}

	// Failed: no Secret is mounted on the node while a person decides.
	if err := agent.Begin(ctx, task.Name, 0); err != nil {
		t.Fatal(err)
	}
	if err := agent.End(ctx, task.Name, 0, false, "boom"); err != nil {
		t.Fatal(err)
	}
	waitNoHolder(t, task.Name)
	finishDeletion(t, task.Name)

	// A retry runs it again (the agent records it Running): the Secrets come back.
	if err := agent.Begin(ctx, task.Name, 0); err != nil {
		t.Fatal(err)
	}
	if again := waitHolder(t, task.Name, task.UID); again.UID == pod.UID {
		t.Errorf("the failed run's holder pod %s is still there", pod.UID)
	}

	if err := agent.Succeed(ctx, task.Name); err != nil {
		t.Fatal(err)
	}
	waitNoHolder(t, task.Name)
}

// A pod under the task's holder name that another task controls (an earlier task of the same name)
// is replaced, never taken for the task's.
func TestSecretHolderPodOfAnotherTaskIsReplaced(t *testing.T) {
	ctx := context.Background()
	holderNamespace(t, "holder-n3")
	task := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: "holder-2", Labels: map[string]string{v1alpha1.LabelNode: "holder-n3"}},
		Spec:       v1alpha1.NodeTaskSpec{NodeName: "holder-n3", Commands: []v1alpha1.Command{secretScript("nodeops-script-a", "nodeops-script-b")}},
	}
	stale := secretholder.Build(task, holderOptions)
	stale.OwnerReferences[0].UID = "uid-of-an-earlier-holder-2"
	if err := cl.Create(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if err := cl.Create(ctx, task); err != nil {
		t.Fatal(err)
	}
	removeWithHolder(t, task)
	testutil.Eventually(t, 30*time.Second, "the earlier task's pod deleted", func() error {
		p := &corev1.Pod{}
		err := cl.Get(ctx, client.ObjectKeyFromObject(stale), p)
		if err == nil && p.DeletionTimestamp == nil && !secretholder.OwnedBy(p, task.UID) {
			return fmt.Errorf("still there, owned by %v", p.OwnerReferences)
		}
		return client.IgnoreNotFound(err)
	})
	finishDeletion(t, task.Name)
	waitHolder(t, task.Name, task.UID)
}

// TestSecretHolderNameTakenByAnotherPodIsReplaced (issue 24, point 4): a pod that is no holder (no
// holder label, no owner) sitting on a task's holder name is deleted and the task's holder made: the
// task's scripts are not left without their Secrets.
func TestSecretHolderNameTakenByAnotherPodIsReplaced(t *testing.T) {
	ctx := context.Background()
	holderNamespace(t, "holder-n4")
	task := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: "holder-squatted", Labels: map[string]string{v1alpha1.LabelNode: "holder-n4"}},
		Spec:       v1alpha1.NodeTaskSpec{NodeName: "holder-n4", Commands: []v1alpha1.Command{secretScript("nodeops-script-a", "nodeops-script-b")}},
	}
	squatter := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: secretholder.PodName(task.Name), Namespace: secretholder.Namespace},
		Spec: corev1.PodSpec{NodeName: "holder-n4", ServiceAccountName: secretholder.ServiceAccount,
			Containers: []corev1.Container{{Name: "c", Image: "squat"}}},
	}
	if err := cl.Create(ctx, squatter); err != nil {
		t.Fatal(err)
	}
	if err := cl.Create(ctx, task); err != nil {
		t.Fatal(err)
	}
	removeWithHolder(t, task)
	testutil.Eventually(t, 30*time.Second, "the squatting pod deleted", func() error {
		p := &corev1.Pod{}
		err := cl.Get(ctx, client.ObjectKeyFromObject(squatter), p)
		if err == nil && p.UID == squatter.UID && p.DeletionTimestamp == nil {
			return fmt.Errorf("still there")
		}
		return client.IgnoreNotFound(err)
	})
	finishDeletion(t, task.Name)
	waitHolder(t, task.Name, task.UID)
}
