package nodeprofile_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/testutil"
)

// The tests here are rule 7 (deleting history by hand never makes anything run again) for a
// profile, whose record of a node's install is the node's label: a task deleted before the label
// landed, a look on a node copy from before the label, and a look on a task list from before the
// profile replaced a task of the same name.

// nothing deleted automatically (rule 7): an install that succeeded, deleted by hand before the
// manager could label its node (here an admission policy refuses the label for a while, as a
// manager that is down or cut off would not write it), stays until the label records it, and is
// then let go; its commands never run again.
func TestSafetyRule7_AnInstallDeletedBeforeItsLabelNeverRunsAgain(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	const profile, node = "unlabelled", "unlabelled-1"
	makeNode(t, ctx, node, profile, nil, kwasm)
	created := countCreates(t, ctx, profile)
	unhold := holdLabel(t, ctx, profile, node)
	makeProfile(t, ctx, profile, profile, nil)
	task := waitTask(t, ctx, profile, node, nodeprofile.ActionInstall)
	agentRun(t, ctx, task.Name)
	agentSucceed(t, ctx, task.Name)
	keptUntilLabelled(t, ctx, profile, node, task, created, unhold)
}

// nothing deleted automatically (rule 7), for a task made by a nodeops from before RecordFinalizer:
// the manager puts the finalizer on the running install, so that deleting it by hand before the
// node is labelled cannot make it run again either.
func TestSafetyRule7_AnInstallFromAnOlderNodeopsIsKeptToo(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	const profile, node = "olderinstall", "olderinstall-1"
	makeNode(t, ctx, node, profile, nil, kwasm)
	created := countCreates(t, ctx, profile)
	unhold := holdLabel(t, ctx, profile, node)
	makeProfile(t, ctx, profile, profile, nil)
	task := waitTask(t, ctx, profile, node, nodeprofile.ActionInstall)
	agentRun(t, ctx, task.Name)
	// As an older nodeops made it: no finalizer.
	must(t, env.client.Patch(ctx, task, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))))
	testutil.Eventually(t, wait, "the running install kept by the manager", func() error {
		got := &v1alpha1.NodeTask{}
		if err := env.client.Get(ctx, client.ObjectKey{Name: task.Name}, got); err != nil {
			return err
		}
		if !slices.Contains(got.Finalizers, nodeprofile.RecordFinalizer) {
			return fmt.Errorf("task %s has finalizers %v; want %s", task.Name, got.Finalizers, nodeprofile.RecordFinalizer)
		}
		return nil
	})
	agentSucceed(t, ctx, task.Name)
	keptUntilLabelled(t, ctx, profile, node, task, created, unhold)
}

// keptUntilLabelled deletes task, node's install, which succeeded while holdLabel's policy refuses
// the node's label, and checks that it stays until unhold lets the label land, then goes, and that
// no install starts again.
func keptUntilLabelled(t *testing.T, ctx context.Context, profile, node string, task *v1alpha1.NodeTask, created func(string) int, unhold func()) {
	t.Helper()
	must(t, env.client.Delete(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: task.Name}}))

	// While the label cannot land, the deleted task is the node's only record: it stays.
	untilObserved(t, ctx, profile, "the deleted install kept and nothing started while the node is unlabelled", func() error {
		byNode, err := tasksOf(ctx, profile)
		if err != nil {
			return err
		}
		got := byNode[node]
		if len(got) != 1 || got[0].UID != task.UID {
			return fmt.Errorf("tasks on %s: %v; want only %s, being deleted (its install ran once)", node, names(got), task.Name)
		}
		return nil
	})

	unhold()
	waitLabel(t, ctx, profile, node, true, strings.TrimPrefix(task.Spec.Group, "install-"))
	testutil.Eventually(t, wait, "the deleted install let go once the label records it", func() error {
		err := env.client.Get(ctx, client.ObjectKey{Name: task.Name}, &v1alpha1.NodeTask{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("task %s still there (%w)", task.Name, err)
	})
	untilObserved(t, ctx, profile, "no install started again", func() error {
		if n := created(node); n != 1 {
			return fmt.Errorf("%d install tasks created on %s; want 1", n, node)
		}
		byNode, err := tasksOf(ctx, profile)
		if err != nil {
			return err
		}
		if got := byNode[node]; len(got) != 0 {
			return fmt.Errorf("tasks on %s: %v; want none", node, names(got))
		}
		return nil
	})
	waitCondition(t, ctx, profile, v1alpha1.ConditionReady, metav1.ConditionTrue)
}

// nothing deleted automatically (rule 7), with the node's copy behind: a manager that becomes the
// leader may see a task's deletion before its node's label (two informers). A look in that moment
// sees the node unlabelled and no task; it must not install again. Here the look is a reconciler
// whose cache returns the node as it was before its install (every other read is the manager's
// cache), after the install succeeded, was labelled and was deleted by hand.
func TestSafetyRule7_AStaleNodeNeverInstallsAgain(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	const profile, node = "stalenode", "stalenode-1"
	makeNode(t, ctx, node, profile, nil, kwasm)
	before := getNode(t, ctx, node)
	makeProfile(t, ctx, profile, profile, nil)
	task := provision(t, ctx, profile, node)
	must(t, env.client.Delete(ctx, &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: task.Name}}))
	testutil.Eventually(t, wait, "the manager's cache without the deleted install", func() error {
		err := env.managerClient.Get(ctx, client.ObjectKey{Name: task.Name}, &v1alpha1.NodeTask{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("the cache still has task %s (%w)", task.Name, err)
	})

	r := laggingReconciler(newStaleNode(before))
	_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: profile}})
	byNode, listErr := tasksOf(ctx, profile)
	must(t, listErr)
	if got := byNode[node]; len(got) != 0 {
		t.Fatalf("a look on the node from before its label started %v on %s (reconcile error: %v); its install would run twice", names(got), node, err)
	}
	if err != nil && !strings.Contains(err.Error(), "provisioned") {
		t.Errorf("reconcile on the stale node: %v; want nothing done, or an error saying the node is provisioned", err)
	}
}

// nothing deleted automatically (rule 7) and one task per node (rule 8), with the task list behind:
// a node that left and came back at the same spec gets a new task of its old install's name. A look
// on a task list from before that replacement would take the new task for the old one and delete
// it by name, then create a third: the task the agent runs would vanish from history. Deletes carry
// the task's UID, so a stale one deletes nothing.
func TestSafetyRule7_AStaleTaskListNeverDeletesTheNodesNewTask(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	const profile, node = "staletasks", "staletasks-1"
	makeNode(t, ctx, node, profile, nil, kwasm)
	makeProfile(t, ctx, profile, profile, nil)
	first := provision(t, ctx, profile, node)
	patchNode(t, ctx, node, `{"metadata":{"annotations":{"kwasm.sh/kwasm-node":null}}}`)
	un := waitTask(t, ctx, profile, node, nodeprofile.ActionUninstall)
	agentRun(t, ctx, un.Name)
	agentSucceed(t, ctx, un.Name)
	waitLabel(t, ctx, profile, node, false, "")
	var stale v1alpha1.NodeTaskList
	must(t, env.client.List(ctx, &stale, client.MatchingLabels{v1alpha1.LabelProfile: profile}))

	patchNode(t, ctx, node, `{"metadata":{"annotations":{"kwasm.sh/kwasm-node":"true"}}}`)
	again := waitTask(t, ctx, profile, node, nodeprofile.ActionInstall)
	if again.Name != first.Name || again.UID == first.UID {
		t.Fatalf("the install after coming back is %s (%s); want a new task named %s", again.Name, again.UID, first.Name)
	}
	agentRun(t, ctx, again.Name)
	testutil.Eventually(t, wait, "the manager's cache showing the new install running", func() error {
		var got v1alpha1.NodeTask
		if err := env.managerClient.Get(ctx, client.ObjectKey{Name: again.Name}, &got); err != nil {
			return err
		}
		if got.UID != again.UID || got.Status.Phase != v1alpha1.TaskRunning {
			return fmt.Errorf("cache has %s %s", got.UID, got.Status.Phase)
		}
		return nil
	})

	r := laggingReconciler(staleTaskList{currentProfile: currentProfile{env.managerClient}, stale: stale.Items})
	_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: profile}})
	var now v1alpha1.NodeTask
	if getErr := env.client.Get(ctx, client.ObjectKey{Name: again.Name}, &now); getErr != nil || now.UID != again.UID {
		t.Fatalf("after a look on the old task list, task %s is %q (get: %v; reconcile: %v); want the running one, %s, untouched",
			again.Name, now.UID, getErr, err, again.UID)
	}
	if !now.DeletionTimestamp.IsZero() {
		t.Fatalf("a look on the old task list deleted the running task %s (reconcile: %v)", again.Name, err)
	}
}

// TestAStaleLookNeverAbortsTheNodesNewTask: a node that left and came back at the same spec gets a
// new install of its old install's name. A look on copies from before (the node gone from the
// profile, its first install still pending) decides to stop that first install; asked by name, the
// new install would be told to abort while its agent runs it, and the node would wait for a person.
// The abort carries the task's UID, so a stale one stops nothing.
func TestAStaleLookNeverAbortsTheNodesNewTask(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	const profile, node = "staleabort", "staleabort-1"
	makeNode(t, ctx, node, profile, nil, kwasm)
	makeProfile(t, ctx, profile, profile, nil)
	first := waitTask(t, ctx, profile, node, nodeprofile.ActionInstall)
	var staleTasks v1alpha1.NodeTaskList
	must(t, env.client.List(ctx, &staleTasks, client.MatchingLabels{v1alpha1.LabelProfile: profile}))

	patchNode(t, ctx, node, `{"metadata":{"annotations":{"kwasm.sh/kwasm-node":null}}}`)
	left := getNode(t, ctx, node)
	un := waitTask(t, ctx, profile, node, nodeprofile.ActionUninstall)
	agentRun(t, ctx, un.Name)
	agentSucceed(t, ctx, un.Name)

	patchNode(t, ctx, node, `{"metadata":{"annotations":{"kwasm.sh/kwasm-node":"true"}}}`)
	var again v1alpha1.NodeTask
	testutil.Eventually(t, wait, "a new install named like the first", func() error {
		if err := env.client.Get(ctx, client.ObjectKey{Name: first.Name}, &again); err != nil {
			return err
		}
		if again.UID == first.UID {
			return fmt.Errorf("%s is still the first install", first.Name)
		}
		return nil
	})
	agentRun(t, ctx, again.Name)

	lagging := newStaleNode(left)
	lagging.StaleGet.Client = staleTaskList{currentProfile: currentProfile{env.managerClient}, stale: staleTasks.Items}
	r := laggingReconciler(lagging)
	_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: profile}})
	var now v1alpha1.NodeTask
	must(t, env.client.Get(ctx, client.ObjectKey{Name: again.Name}, &now))
	if now.UID != again.UID || now.Spec.Abort {
		t.Fatalf("after a look on copies from before the node came back, task %s (%s) has abort %v (reconcile: %v); want the running install %s untouched",
			now.Name, now.UID, now.Spec.Abort, err, again.UID)
	}
}

// laggingReconciler is a second NodeProfile reconciler beside the manager's, sharing its lock
// table, reading through c.
func laggingReconciler(c client.Client) *nodeprofile.Reconciler {
	r := nodeprofile.New(c, env.locks, events.NewFakeRecorder(100))
	r.APIReader = env.client
	r.StatusInterval = time.Hour
	return r
}

// currentProfile is the manager's cached client, except that profiles are read from the API
// server: a look on a profile copy older than the API server's does nothing at all
// (TestAStaleProfileMakesNoSilence), and the tests beside it are about other copies.
type currentProfile struct{ client.Client }

func (c currentProfile) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*v1alpha1.NodeProfile); ok {
		return env.client.Get(ctx, key, obj, opts...)
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// staleNode is the manager's cached client, except that it returns one node as it was, read or listed.
type staleNode struct {
	testutil.StaleGet
	stale *corev1.Node
}

func newStaleNode(stale *corev1.Node) staleNode {
	return staleNode{StaleGet: testutil.StaleGet{Client: currentProfile{env.managerClient}, Stale: stale}, stale: stale}
}

func (c staleNode) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.StaleGet.List(ctx, list, opts...); err != nil {
		return err
	}
	if nodes, ok := list.(*corev1.NodeList); ok {
		for i := range nodes.Items {
			if nodes.Items[i].Name == c.stale.Name {
				nodes.Items[i] = *c.stale.DeepCopy()
			}
		}
	}
	return nil
}

// staleTaskList is the manager's cached client, except that it lists the tasks as they were.
type staleTaskList struct {
	currentProfile
	stale []v1alpha1.NodeTask
}

func (c staleTaskList) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if tasks, ok := list.(*v1alpha1.NodeTaskList); ok {
		tasks.Items = make([]v1alpha1.NodeTask, len(c.stale))
		for i := range c.stale {
			c.stale[i].DeepCopyInto(&tasks.Items[i])
		}
		return nil
	}
	return c.currentProfile.List(ctx, list, opts...)
}

// holdLabel makes the API server refuse the profile's label on node (a ValidatingAdmissionPolicy)
// until the returned function is called, and waits until the refusal is in force.
func holdLabel(t *testing.T, ctx context.Context, profile, node string) (unhold func()) {
	t.Helper()
	name := "hold-" + node
	label := nodeprofile.ProvisionedLabel(profile)
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{
				ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test": profile}},
				ResourceRules: []admissionv1.NamedRuleWithOperations{{RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Update},
					Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes"}},
				}}},
			},
			Validations: []admissionv1.Validation{{
				Expression: fmt.Sprintf("!has(object.metadata.labels) || !(%q in object.metadata.labels)", label),
				Message:    "the test holds the label " + label,
			}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
		},
	}
	must(t, env.client.Create(ctx, policy))
	must(t, env.client.Create(ctx, binding))
	var once sync.Once
	unhold = func() {
		once.Do(func() {
			_ = env.client.Delete(context.Background(), binding)
			_ = env.client.Delete(context.Background(), policy)
		})
	}
	t.Cleanup(unhold)
	try := fmt.Sprintf(`{"metadata":{"labels":{%q:"provisioned"}}}`, label)
	testutil.Eventually(t, wait, "the label refused", func() error {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
		err := env.client.Patch(ctx, n, client.RawPatch(types.MergePatchType, []byte(try)), client.DryRunAll)
		if err == nil {
			return fmt.Errorf("a dry run of the label was let through")
		}
		if !strings.Contains(err.Error(), "holds the label") {
			return fmt.Errorf("a dry run of the label failed otherwise: %w", err)
		}
		return nil
	})
	return unhold
}

// countCreates follows the profile's tasks from now on and returns how many install tasks were
// created on a node (by UID), however briefly they lived.
func countCreates(t *testing.T, ctx context.Context, profile string) (created func(node string) int) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	seen := map[string]map[types.UID]bool{}
	done := follow(ctx, &v1alpha1.NodeTaskList{}, client.MatchingLabels{v1alpha1.LabelProfile: profile}, func(ev watch.Event) {
		task, ok := ev.Object.(*v1alpha1.NodeTask)
		if !ok || !strings.HasPrefix(task.Spec.Group, string(nodeprofile.ActionInstall)+"-") {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if seen[task.Spec.NodeName] == nil {
			seen[task.Spec.NodeName] = map[types.UID]bool{}
		}
		seen[task.Spec.NodeName][task.UID] = true
	})
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("following the tasks: %v", err)
		}
	})
	return func(node string) int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen[node])
	}
}
