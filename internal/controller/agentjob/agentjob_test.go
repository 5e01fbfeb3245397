package agentjob_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/cmdgate"
	"github.com/nodeops/nodeops/internal/controller/agentjob"
	"github.com/nodeops/nodeops/internal/testutil"
)

var env *testutil.Env

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	logf.SetLogger(testutil.Logger())
	var err error
	env, err = testutil.Start("nodetasks")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:  env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&batchv1.Job{}: {Namespaces: map[string]cache.Config{"nodeops-system": {}}},
		}},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := agentjob.SetupWithManager(mgr, agentjob.Options{Image: "example.com/agent:test"}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeops-system"}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	return m.Run()
}

func TestJobNameIsDeterministicAndShort(t *testing.T) {
	long := strings.Repeat("n", 200)
	if agentjob.JobName("worker-1") != "nodeops-agent-worker-1" {
		t.Errorf("JobName(worker-1) = %s", agentjob.JobName("worker-1"))
	}
	if n := agentjob.JobName(long); len(n) > 63 || n != agentjob.JobName(long) || n == agentjob.JobName(long+"x") {
		t.Errorf("JobName(long) = %s", n)
	}
	// Cut at 32 characters, a 253-character name may end a label with '.' or '-'.
	for _, node := range []string{strings.Repeat("a", 31) + "." + strings.Repeat("b", 221), strings.Repeat("a", 31) + "-" + strings.Repeat("b", 221)} {
		if n := agentjob.JobName(node); len(n) > 63 || len(validation.IsDNS1123Subdomain(n)) > 0 {
			t.Errorf("JobName(%s) = %s, not a valid Job name of at most 63 characters", node, n)
		}
	}
}

// runs numbers the names tests make, so that a test run again in this process (go test -count=2)
// never takes an earlier run's Events or Jobs for its own.
var runs atomic.Int64

func unique(name string) string { return fmt.Sprintf("%s-%d", name, runs.Add(1)) }

func TestJobPerNodeWithPendingTasks(t *testing.T) {
	ctx := context.Background()
	c := env.Client
	mk := func(name, node string, paused bool) {
		task := &v1alpha1.NodeTask{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelNode: node}},
			Spec:       v1alpha1.NodeTaskSpec{NodeName: node, Paused: paused, Commands: []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}}},
		}
		if err := c.Create(ctx, task); err != nil {
			t.Fatal(err)
		}
		testutil.RemoveAtEnd(t, c, task, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "nodeops-system", Name: agentjob.JobName(node)}})
	}
	idle, busy := unique("idle-node"), unique("busy-node")
	// A paused task needs no agent until it is resumed.
	mk(unique("paused-task"), idle, true)
	mk(unique("pending-task"), busy, false)

	job := &batchv1.Job{}
	testutil.Eventually(t, 30*time.Second, "a Job for the node with a pending task", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: "nodeops-system", Name: agentjob.JobName(busy)}, job)
	})
	pod := job.Spec.Template.Spec
	ctr := pod.Containers[0]
	if pod.NodeName != busy || !pod.HostPID || !*ctr.SecurityContext.Privileged || ctr.Image != "example.com/agent:test" ||
		!strings.Contains(strings.Join(ctr.Args, " "), "--exit-when-idle") || pod.Volumes[0].HostPath.Path != "/" || ctr.VolumeMounts[0].MountPath != "/host" ||
		len(pod.Tolerations) != 1 || pod.Tolerations[0].Operator != corev1.TolerationOpExists {
		t.Errorf("agent job pod spec %+v", pod)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "nodeops-system", Name: agentjob.JobName(idle)}, &batchv1.Job{}); !apierrors.IsNotFound(err) {
		t.Errorf("a Job exists for a node with no pending task (err %v)", err)
	}

	// The agent exited while the node has work again: the finished Job is replaced.
	oldUID := job.UID
	now := metav1.Now()
	job.Status.StartTime = &now
	job.Status.CompletionTime = &now
	job.Status.Succeeded = 1
	job.Status.Conditions = []batchv1.JobCondition{
		{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	if err := c.Status().Update(ctx, job); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the finished Job replaced by a new one", func() error {
		j := &batchv1.Job{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "nodeops-system", Name: agentjob.JobName(busy)}, j); err != nil {
			return err
		}
		if j.UID == oldUID {
			return fmt.Errorf("still the old job")
		}
		return nil
	})
}

// A failed task needs no agent until a person asks for a retry, which only an agent carries out.
func TestJobForFailedTaskOnlyOnceRecoveryIsAsked(t *testing.T) {
	ctx := context.Background()
	c := env.Client
	node := unique("failed-node")
	task := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: unique("failed-task"), Labels: map[string]string{v1alpha1.LabelNode: node}},
		Spec:       v1alpha1.NodeTaskSpec{NodeName: node, Paused: true, Commands: []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}}},
	}
	if err := c.Create(ctx, task); err != nil {
		t.Fatal(err)
	}
	testutil.RemoveAtEnd(t, c, task, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "nodeops-system", Name: agentjob.JobName(node)}})
	// Created paused so that no Job is made before it is recorded Failed, as an agent records it.
	task.Status = v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskFailed, Reason: v1alpha1.ReasonCommandFailed, Attempt: 1,
		Commands: []v1alpha1.CommandStatus{{Name: "wait", Phase: v1alpha1.CommandFailed, Attempt: 1}}}
	if err := c.Status().Update(ctx, task); err != nil {
		t.Fatal(err)
	}
	base := task.DeepCopy()
	task.Spec.Paused = false
	if err := c.Patch(ctx, task, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Namespace: "nodeops-system", Name: agentjob.JobName(node)}
	// No Job until the controller shows it decided to run none for this generation.
	testutil.ConsistentlyUntilObserved(t, 20*time.Second, "a node whose only task failed", func() error {
		err := c.Get(ctx, key, &batchv1.Job{})
		switch {
		case err == nil:
			return errors.New("a Job exists")
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("reading the Job: %w", err)
		}
		return nil
	}, func() error {
		var list eventsv1.EventList
		if err := c.List(ctx, &list); err != nil {
			return err
		}
		want := fmt.Sprintf("at generation %d ", task.Generation)
		for _, e := range list.Items {
			if e.Regarding.Name == task.Name && e.Reason == agentjob.ReasonAwaitingPerson && strings.Contains(e.Note, want) {
				return nil
			}
		}
		return fmt.Errorf("no %s event %s", agentjob.ReasonAwaitingPerson, want)
	})
	base = task.DeepCopy()
	task.Spec.RecoveryMode = v1alpha1.RecoveryRetry
	if err := c.Patch(ctx, task, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "a Job to carry out the retry", func() error {
		return c.Get(ctx, key, &batchv1.Job{})
	})
}

// A NodeProfile's command gate check is a task like any other to the agent: its node gets an
// agent Job, whatever kind owns the check.
func TestJobForAProfilesGateCheck(t *testing.T) {
	ctx := context.Background()
	c := env.Client
	node, profile := unique("check-node"), unique("profile")
	g := &v1alpha1.Gate{Name: "resync", Command: &v1alpha1.CommandGate{Script: "true"}}
	check := cmdgate.Build(cmdgate.Owner{Kind: "NodeProfile", Name: profile, UID: types.UID(profile)}, "", g, node, node, 1)
	if !v1alpha1.IsGateCheck(check) {
		t.Fatalf("a profile's check is no gate check: %+v", check)
	}
	if err := c.Create(ctx, check); err != nil {
		t.Fatal(err)
	}
	testutil.RemoveAtEnd(t, c, check, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "nodeops-system", Name: agentjob.JobName(node)}})
	testutil.Eventually(t, 30*time.Second, "a Job for the node of the profile's check", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: "nodeops-system", Name: agentjob.JobName(node)}, &batchv1.Job{})
	})
}
