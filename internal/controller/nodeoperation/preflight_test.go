package nodeoperation_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/testutil"
)

// preflightAnswer is how long the suite's manager gives an agent to start its preflight task.
const preflightAnswer = 4 * time.Second

// fakeKubeadm stands for kubeadm in a test root: it reports v1.37.2 and succeeds at everything.
const fakeKubeadm = "#!/bin/sh\necho v1.37.2\n"

// runAgent runs a real agent for node over root until the test ends.
func (f *fixture) runAgent(node, root string) {
	f.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agent.DefaultLeaseNamespace}}
	if err := f.c.Create(f.ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		err := agent.Run(ctx, env.Config, agent.Options{NodeName: node, HostRoot: root, ServiceManager: host.ServiceManagerLocal, Poll: 100 * time.Millisecond})
		if err != nil && ctx.Err() == nil {
			f.t.Errorf("agent of %s: %v", node, err)
		}
	})
	f.t.Cleanup(func() {
		cancel()
		wg.Wait()
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: agent.DefaultLeaseNamespace, Name: objname.NodeLeaseName(node)}}
		_ = f.c.Delete(context.Background(), lease)
	})
}

func writeFile(t *testing.T, root, p, data string, mode os.FileMode) {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
}

// The preflight refuses, before any task of the operation's work starts, a node whose root lacks
// kubeadm, one whose OS family installPackages does not know (Alpine: its family and apk are
// recognised, but auto installs only on Debian, RedHat and SUSE families), and one whose agent never answers
// (a gate that cannot be evaluated blocks, rule 14): each is named with its reason on the operation,
// in condition PreflightFailed and an Event. Fixing the nodes and retrying their preflight tasks
// (an agent started for the silent one) lets the operation go on.
func TestPreflightRefusesNodesBeforeAnyTask(t *testing.T) {
	f := newFixture(t)
	names := f.nodes(nil, "nokubeadm", "unknownos", "silent")
	debian := "ID=debian\nVERSION_ID=12\n"
	noKubeadm := hosttest.NewRoot(t, map[string]string{"/etc/os-release": debian, "/usr/bin/apt-get": ""})
	unknownOS := hosttest.NewRoot(t, map[string]string{"/etc/os-release": "ID=alpine\nVERSION_ID=3.20.0\n", "/sbin/apk": ""})
	writeFile(t, unknownOS, "/usr/bin/kubeadm", fakeKubeadm, 0o755)
	silent := hosttest.NewRoot(t, map[string]string{"/etc/os-release": debian, "/usr/bin/apt-get": ""})
	writeFile(t, silent, "/usr/bin/kubeadm", fakeKubeadm, 0o755)
	f.runAgent(names[0], noKubeadm)
	f.runAgent(names[1], unknownOS)

	op := f.operation("preflight", func(o *v1alpha1.NodeOperation) {
		o.Spec.Preflight = &v1alpha1.OperationPreflight{Checks: []v1alpha1.PreflightCheck{{PackageManager: &v1alpha1.PackageManagerCheck{}}}}
	}, v1alpha1.Group{Name: "work", Commands: []v1alpha1.Command{{KubeadmUpgradeNode: &v1alpha1.KubeadmUpgradeNodeCommand{}}}})

	var got *v1alpha1.NodeOperation
	testutil.Eventually(t, 60*time.Second, "three nodes failing the preflight", func() error {
		got = f.get(op.Name)
		if st := got.Status.Preflight; st == nil || len(st.Failed) != 3 {
			return fmt.Errorf("status.preflight %+v, phase %s", got.Status.Preflight, got.Status.Phase)
		}
		return nil
	})
	want := map[string]string{
		names[0]: "kubeadm is missing (/usr/bin/kubeadm)",
		names[1]: `unknown OS family or package manager (os-release ID "alpine", family alpine)`,
		names[2]: "the node's agent has not answered the preflight",
	}
	for _, fl := range got.Status.Preflight.Failed {
		if !strings.Contains(fl.Reason, want[fl.Node]) {
			t.Errorf("node %s failed the preflight with %q, want %q", fl.Node, fl.Reason, want[fl.Node])
		}
		if fl.Task != objname.TaskName(op.Name, plan.GroupPreflight, fl.Node) {
			t.Errorf("node %s: task %q", fl.Node, fl.Task)
		}
	}
	c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionPreflightFailed)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != "PreflightFailed" || !strings.Contains(c.Message, names[0]) {
		t.Fatalf("PreflightFailed condition %+v", c)
	}
	if got.Status.Phase != v1alpha1.OperationBlocked {
		t.Errorf("phase %s, want Blocked", got.Status.Phase)
	}
	f.waitEvent(op.Name, "PreflightFailed")
	for _, task := range f.tasks(op.Name) {
		if task.Spec.Group != plan.GroupPreflight {
			t.Fatalf("task %s of group %s exists while nodes fail the preflight", task.Name, task.Spec.Group)
		}
	}

	// Fix the nodes, retry their preflight tasks as a person does, and start the silent node's agent.
	writeFile(t, noKubeadm, "/usr/bin/kubeadm", fakeKubeadm, 0o755)
	writeFile(t, unknownOS, "/etc/os-release", debian, 0o644)
	writeFile(t, unknownOS, "/usr/bin/apt-get", "", 0o755)
	for _, n := range names[:2] {
		task := f.task(objname.TaskName(op.Name, plan.GroupPreflight, n))
		orig := task.DeepCopy()
		task.Spec.RecoveryMode = v1alpha1.RecoveryRetry
		f.must(f.c.Patch(f.ctx, task, client.MergeFrom(orig)))
	}
	f.runAgent(names[2], silent)
	done := f.waitPhase(op.Name, v1alpha1.OperationSucceeded)
	if c := meta.FindStatusCondition(done.Status.Conditions, v1alpha1.ConditionPreflightFailed); c == nil || c.Status != metav1.ConditionFalse || c.Reason != "PreflightPassed" {
		t.Errorf("after the fix, PreflightFailed %+v", c)
	}
	if done.Status.Preflight != nil {
		t.Errorf("status.preflight %+v after every node passed", done.Status.Preflight)
	}
}
