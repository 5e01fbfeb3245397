package nodeprofile_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/testutil"
)

var kwasm = map[string]string{"kwasm.sh/kwasm-node": "true"}

// provision plays the agent on node's install task and waits for the label.
func provision(t *testing.T, ctx context.Context, profile, node string) *v1alpha1.NodeTask {
	t.Helper()
	task := waitTask(t, ctx, profile, node, nodeprofile.ActionInstall)
	agentRun(t, ctx, task.Name)
	agentSucceed(t, ctx, task.Name)
	waitLabel(t, ctx, profile, node, true, strings.TrimPrefix(task.Spec.Group, "install-"))
	return task
}

func TestProvisionByAnnotationAndSelector(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	makeNode(t, ctx, "annot-worker-1", "annot", nil, kwasm)
	makeNode(t, ctx, "annot-worker-2", "annot", nil, nil)
	makeNode(t, ctx, "annot-cp-1", "annot", map[string]string{"node-role.kubernetes.io/control-plane": ""}, kwasm)
	makeProfile(t, ctx, "annot", "annot", func(s *v1alpha1.NodeProfileSpec) {
		s.NodeSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "node-role.kubernetes.io/control-plane", Operator: metav1.LabelSelectorOpDoesNotExist}}
	})

	task := waitTask(t, ctx, "annot", "annot-worker-1", nodeprofile.ActionInstall)
	if task.Labels[v1alpha1.LabelProfile] != "annot" || task.Labels[v1alpha1.LabelNode] != "annot-worker-1" {
		t.Errorf("task labels = %v", task.Labels)
	}
	if ref := metav1.GetControllerOf(task); ref == nil || ref.Kind != "NodeProfile" || ref.Name != "annot" {
		t.Errorf("task owner = %v", ref)
	}
	hash := getProfile(t, ctx, "annot").Status.SpecHash
	if task.Spec.Group != "install-"+hash || !strings.Contains(task.Name, hash) {
		t.Errorf("task %s group %s does not carry the spec hash %s", task.Name, task.Spec.Group, hash)
	}

	agentRun(t, ctx, task.Name)
	waitCondition(t, ctx, "annot", v1alpha1.ConditionProvisioning, metav1.ConditionTrue, "1 installing")
	if n := getNode(t, ctx, "annot-worker-1"); n.Labels[nodeprofile.ProvisionedLabel("annot")] != "" {
		t.Fatalf("node labelled while its install runs: %v", n.Labels)
	}
	agentSucceed(t, ctx, task.Name)
	waitLabel(t, ctx, "annot", "annot-worker-1", true, hash)
	waitCondition(t, ctx, "annot", v1alpha1.ConditionReady, metav1.ConditionTrue, "all 1 node(s) provisioned")

	p := getProfile(t, ctx, "annot")
	if p.Status.Nodes != (v1alpha1.ProfileNodeCounts{Matched: 1, Provisioned: 1}) {
		t.Errorf("counts = %+v", p.Status.Nodes)
	}
	byNode, err := tasksOf(ctx, "annot")
	if err != nil {
		t.Fatal(err)
	}
	for _, untouched := range []string{"annot-worker-2", "annot-cp-1"} {
		if len(byNode[untouched]) > 0 {
			t.Errorf("%s got tasks %v", untouched, names(byNode[untouched]))
		}
		if n := getNode(t, ctx, untouched); n.Labels[nodeprofile.ProvisionedLabel("annot")] != "" {
			t.Errorf("%s labelled", untouched)
		}
	}

	// Annotating worker-2 brings it in; the control plane joins once it leaves the selector's exclusion.
	patchNode(t, ctx, "annot-worker-2", `{"metadata":{"annotations":{"kwasm.sh/kwasm-node":"true"}}}`)
	provision(t, ctx, "annot", "annot-worker-2")
	patchNode(t, ctx, "annot-cp-1", `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":null}}}`)
	provision(t, ctx, "annot", "annot-cp-1")
	waitCondition(t, ctx, "annot", v1alpha1.ConditionReady, metav1.ConditionTrue, "all 3 node(s) provisioned")
}

func TestFailedInstallIsNamedAndFixedBySpec(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	makeNode(t, ctx, "fail-1", "fail", nil, kwasm)
	makeProfile(t, ctx, "fail", "fail", nil)

	task := waitTask(t, ctx, "fail", "fail-1", nodeprofile.ActionInstall)
	agentRun(t, ctx, task.Name)
	agentFail(t, ctx, task.Name, "sha256 mismatch: got 5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03")
	c := waitCondition(t, ctx, "fail", v1alpha1.ConditionDegraded, metav1.ConditionTrue, "fail-1", "command shim failed", "sha256 mismatch")
	if c.Reason != nodeprofile.ReasonNodesFailed {
		t.Errorf("Degraded reason = %s", c.Reason)
	}
	p := getProfile(t, ctx, "fail")
	if ready := condition(p, v1alpha1.ConditionReady); ready.Status != metav1.ConditionFalse || ready.Reason != nodeprofile.ReasonNodesFailed {
		t.Errorf("Ready = %s/%s", ready.Status, ready.Reason)
	}
	if len(p.Status.Failures) != 1 || p.Status.Failures[0].Node != "fail-1" || p.Status.Failures[0].Task != task.Name ||
		!strings.Contains(p.Status.Failures[0].Message, "sha256 mismatch") {
		t.Errorf("failures = %+v", p.Status.Failures)
	}
	if p.Status.Nodes.Failed != 1 || p.Status.Nodes.Provisioned != 0 {
		t.Errorf("counts = %+v", p.Status.Nodes)
	}
	if n := getNode(t, ctx, "fail-1"); n.Labels[nodeprofile.ProvisionedLabel("fail")] != "" {
		t.Fatalf("failed node labelled")
	}
	var events corev1.EventList
	testutil.Eventually(t, wait, "a NodeFailed event", func() error {
		if err := env.client.List(ctx, &events); err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == "fail" && e.Reason == "NodeFailed" && strings.Contains(e.Message, "fail-1") {
				return nil
			}
		}
		return fmt.Errorf("none among %d events", len(events.Items))
	})

	// A person fixes the sha256: the failed task is aborted and a new one, with a new name, replaces it.
	updateProfile(t, ctx, "fail", func(p *v1alpha1.NodeProfile) { p.Spec.Install[0].InstallFile.SHA256 = strings.Repeat("b", 64) })
	// The failed task is told to abort (it no longer holds the node), then deleted as the new one
	// is created: the agent sees it go either way.
	testutil.Eventually(t, wait, "the failed task aborted or gone", func() error {
		old := &v1alpha1.NodeTask{}
		err := env.client.Get(ctx, client.ObjectKeyFromObject(task), old)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		case !old.Spec.Abort:
			return fmt.Errorf("abort not set")
		}
		return nil
	})
	fixed := provision(t, ctx, "fail", "fail-1")
	if fixed.Name == task.Name {
		t.Fatalf("the re-provision reused the task name %s", task.Name)
	}
	waitCondition(t, ctx, "fail", v1alpha1.ConditionDegraded, metav1.ConditionFalse)
	waitCondition(t, ctx, "fail", v1alpha1.ConditionReady, metav1.ConditionTrue)
	// The superseded task is history, kept with its failure (nothing deleted automatically, rule 7; it
	// used to be deleted here).
	byNode, err := tasksOf(ctx, "fail")
	if err != nil {
		t.Fatal(err)
	}
	if got := sorted(names(byNode["fail-1"])...); !reflect.DeepEqual(got, sorted(fixed.Name+"(Succeeded)", task.Name+"(Failed)")) {
		t.Errorf("tasks %v, want the fixed one and the failed one it superseded", got)
	}
}

func TestUninstallOnLeave(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	makeNode(t, ctx, "leave-1", "leave", nil, kwasm)
	makeNode(t, ctx, "leave-2", "leave", nil, kwasm)
	makeProfile(t, ctx, "leave", "leave", func(s *v1alpha1.NodeProfileSpec) { s.MaxUnavailable = ptrIntOrString(2) })
	install1 := provision(t, ctx, "leave", "leave-1")
	provision(t, ctx, "leave", "leave-2")

	// The annotation goes: uninstall runs, and only then the label goes.
	patchNode(t, ctx, "leave-1", `{"metadata":{"annotations":{"kwasm.sh/kwasm-node":null}}}`)
	un := waitTask(t, ctx, "leave", "leave-1", nodeprofile.ActionUninstall)
	if len(un.Spec.Commands) != 1 || un.Spec.Commands[0].ContainerdRuntime == nil || !un.Spec.Commands[0].ContainerdRuntime.Remove {
		t.Errorf("uninstall commands = %+v", un.Spec.Commands)
	}
	agentRun(t, ctx, un.Name)
	if n := getNode(t, ctx, "leave-1"); n.Labels[nodeprofile.ProvisionedLabel("leave")] != v1alpha1.ProvisionedValue {
		t.Fatalf("label removed before the uninstall succeeded")
	}
	agentSucceed(t, ctx, un.Name)
	waitLabel(t, ctx, "leave", "leave-1", false, "")
	// Both tasks are kept: the install is history (nothing deleted automatically, rule 7; it used to be deleted here).
	byNode, err := tasksOf(ctx, "leave")
	if err != nil {
		t.Fatal(err)
	}
	if got := sorted(names(byNode["leave-1"])...); !reflect.DeepEqual(got, sorted(install1.Name+"(Succeeded)", un.Name+"(Succeeded)")) {
		t.Errorf("tasks %v, want the install and the uninstall", got)
	}

	// Its labels change so the selector no longer matches: it leaves too.
	patchNode(t, ctx, "leave-2", `{"metadata":{"labels":{"test":"left"}}}`)
	un2 := waitTask(t, ctx, "leave", "leave-2", nodeprofile.ActionUninstall)
	agentRun(t, ctx, un2.Name)
	agentSucceed(t, ctx, un2.Name)
	waitLabel(t, ctx, "leave", "leave-2", false, "")
	waitCondition(t, ctx, "leave", v1alpha1.ConditionReady, metav1.ConditionTrue)
	if p := getProfile(t, ctx, "leave"); p.Status.Nodes != (v1alpha1.ProfileNodeCounts{}) {
		t.Errorf("counts = %+v", p.Status.Nodes)
	}
}

func TestLeaveDuringInstall(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	makeNode(t, ctx, "midway-1", "midway", nil, kwasm)
	makeProfile(t, ctx, "midway", "midway", nil)
	install := waitTask(t, ctx, "midway", "midway-1", nodeprofile.ActionInstall)
	agentRun(t, ctx, install.Name)
	patchNode(t, ctx, "midway-1", `{"metadata":{"annotations":{"kwasm.sh/kwasm-node":null}}}`)
	testutil.Eventually(t, wait, "the running install asked to abort", func() error {
		cur := &v1alpha1.NodeTask{}
		if err := env.client.Get(ctx, client.ObjectKeyFromObject(install), cur); err != nil {
			return err
		}
		if !cur.Spec.Abort {
			return fmt.Errorf("abort not set")
		}
		return nil
	})
	// While the command runs, the node is still held: no uninstall yet.
	if byNode, err := tasksOf(ctx, "midway"); err != nil || len(byNode["midway-1"]) != 1 {
		t.Fatalf("tasks while the install runs: %v %v", byNode, err)
	}
	agentAbort(t, ctx, install.Name)
	// The install may have done part of its work: uninstall cleans up, though the node was never labelled.
	un := waitTask(t, ctx, "midway", "midway-1", nodeprofile.ActionUninstall)
	agentRun(t, ctx, un.Name)
	agentSucceed(t, ctx, un.Name)
	waitCondition(t, ctx, "midway", v1alpha1.ConditionReady, metav1.ConditionTrue)
	if n := getNode(t, ctx, "midway-1"); n.Labels[nodeprofile.ProvisionedLabel("midway")] != "" {
		t.Errorf("node labelled")
	}
}

func TestSpecChangeReprovisions(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	nodes := []string{"respec-1", "respec-2", "respec-3"}
	for _, n := range nodes {
		makeNode(t, ctx, n, "respec", nil, kwasm)
	}
	makeProfile(t, ctx, "respec", "respec", nil)
	for _, n := range nodes {
		provision(t, ctx, "respec", n)
	}
	old := getProfile(t, ctx, "respec").Status.SpecHash

	// Selector, trigger and maxUnavailable do not touch provisioned nodes.
	updateProfile(t, ctx, "respec", func(p *v1alpha1.NodeProfile) { p.Spec.MaxUnavailable = ptrIntOrString(1) })
	updateProfile(t, ctx, "respec", func(p *v1alpha1.NodeProfile) {
		p.Spec.Install = append(p.Spec.Install, v1alpha1.Command{Name: "restart", RestartService: &v1alpha1.RestartServiceCommand{Name: "containerd"}})
	})
	var hash string
	testutil.Eventually(t, wait, "new spec hash", func() error {
		hash = getProfile(t, ctx, "respec").Status.SpecHash
		if hash == old {
			return fmt.Errorf("still %s", hash)
		}
		return nil
	})
	// The rollout shows in status: every node still at the old hash before the first re-provision.
	testutil.Eventually(t, wait, "three nodes outdated, at the old hash", func() error {
		st := getProfile(t, ctx, "respec").Status
		if st.Nodes.Outdated != 3 || len(st.Hashes) != 1 || st.Hashes[0] != (v1alpha1.ProfileHashNodes{Hash: old, Nodes: 3}) {
			return fmt.Errorf("outdated %d, hashes %+v", st.Nodes.Outdated, st.Hashes)
		}
		return nil
	})
	for i, n := range nodes {
		task := waitTask(t, ctx, "respec", n, nodeprofile.ActionInstall)
		if task.Spec.Group != "install-"+hash || len(task.Spec.Commands) != 3 {
			t.Fatalf("re-provision task %s group %s with %d commands", task.Name, task.Spec.Group, len(task.Spec.Commands))
		}
		// One node at a time: maxUnavailable 1.
		byNode, err := tasksOf(ctx, "respec")
		if err != nil {
			t.Fatal(err)
		}
		for other, tasks := range byNode {
			for _, ot := range tasks {
				if other != n && ot.EffectivePhase().Unfinished() {
					t.Fatalf("%s runs %s while %s re-provisions", other, ot.Name, n)
				}
			}
		}
		agentRun(t, ctx, task.Name)
		agentSucceed(t, ctx, task.Name)
		waitLabel(t, ctx, "respec", n, true, hash)
		// Nodes at the new hash first, then those still at the old one.
		done := int32(i + 1)
		want := []v1alpha1.ProfileHashNodes{{Hash: hash, Nodes: done}}
		if done < 3 {
			want = append(want, v1alpha1.ProfileHashNodes{Hash: old, Nodes: 3 - done})
		}
		testutil.Eventually(t, wait, fmt.Sprintf("%d node(s) at the new hash", done), func() error {
			st := getProfile(t, ctx, "respec").Status
			if st.Nodes.Outdated != 3-done || !reflect.DeepEqual(st.Hashes, want) {
				return fmt.Errorf("outdated %d, hashes %+v, want %+v", st.Nodes.Outdated, st.Hashes, want)
			}
			return nil
		})
	}
	waitCondition(t, ctx, "respec", v1alpha1.ConditionReady, metav1.ConditionTrue, "all 3")
	// Each node keeps its first install as history beside the new one (nothing deleted
	// automatically, rule 7; the first used to be deleted here).
	byNode, err := tasksOf(ctx, "respec")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		got := byNode[n]
		groups := map[string]bool{}
		for _, task := range got {
			groups[task.Spec.Group] = true
		}
		if len(got) != 2 || !groups["install-"+hash] {
			t.Errorf("%s: %v, want the new install and the one it superseded", n, names(got))
		}
	}
}

func TestDeletionUninstallsThenRemovesFinalizer(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	makeNode(t, ctx, "gone-1", "gone", nil, kwasm)
	makeNode(t, ctx, "gone-2", "gone", nil, kwasm)
	makeProfile(t, ctx, "gone", "gone", func(s *v1alpha1.NodeProfileSpec) {
		s.RuntimeClasses = []v1alpha1.RuntimeClassSpec{{Name: "gone-wasmedge", Handler: "wasmedge"}}
	})
	provision(t, ctx, "gone", "gone-1")
	provision(t, ctx, "gone", "gone-2")
	p := getProfile(t, ctx, "gone")
	if err := env.client.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ctx, "gone", v1alpha1.ConditionReady, metav1.ConditionFalse)
	for _, n := range []string{"gone-1", "gone-2"} {
		un := waitTask(t, ctx, "gone", n, nodeprofile.ActionUninstall)
		if _, err := getProfileErr(ctx, "gone"); err != nil {
			t.Fatalf("profile gone before %s was uninstalled: %v", n, err)
		}
		agentRun(t, ctx, un.Name)
		agentSucceed(t, ctx, un.Name)
		waitLabel(t, ctx, "gone", n, false, "")
	}
	testutil.Eventually(t, wait, "profile deleted", func() error {
		_, err := getProfileErr(ctx, "gone")
		if apierrors.IsNotFound(err) {
			return nil
		}
		return stillThere(err)
	})
	testutil.Eventually(t, wait, "RuntimeClass deleted", func() error {
		err := env.client.Get(ctx, client.ObjectKey{Name: "gone-wasmedge"}, &nodev1.RuntimeClass{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return stillThere(err)
	})
}

func TestDeletedNodeIsForgotten(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	makeNode(t, ctx, "forget-1", "forget", nil, kwasm)
	makeProfile(t, ctx, "forget", "forget", nil)
	task := waitTask(t, ctx, "forget", "forget-1", nodeprofile.ActionInstall)
	agentRun(t, ctx, task.Name)
	if err := env.client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "forget-1"}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, wait, "the deleted node's task deleted", func() error {
		byNode, err := tasksOf(ctx, "forget")
		if err != nil {
			return err
		}
		if len(byNode) > 0 {
			return fmt.Errorf("tasks %v", byNode)
		}
		return nil
	})
	c := waitCondition(t, ctx, "forget", v1alpha1.ConditionReady, metav1.ConditionTrue)
	if c.Reason != nodeprofile.ReasonNoNodes {
		t.Errorf("Ready reason = %s", c.Reason)
	}
}

func TestRuntimeClasses(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	tol := []corev1.Toleration{{Key: "wasm", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	p := makeProfile(t, ctx, "rc", "rc", func(s *v1alpha1.NodeProfileSpec) {
		s.RuntimeClasses = []v1alpha1.RuntimeClassSpec{
			{Name: "rc-wasmedge", Handler: "wasmedge", Tolerations: tol},
			{Name: "rc-spin", Handler: "spin"},
		}
	})
	getRC := func(name string) (*nodev1.RuntimeClass, error) {
		rc := &nodev1.RuntimeClass{}
		return rc, env.client.Get(ctx, client.ObjectKey{Name: name}, rc)
	}
	var rc *nodev1.RuntimeClass
	testutil.Eventually(t, wait, "RuntimeClass rc-wasmedge", func() (err error) { rc, err = getRC("rc-wasmedge"); return err })
	if rc.Handler != "wasmedge" || rc.Scheduling == nil || rc.Scheduling.NodeSelector["nodeops.io/profile.rc"] != "provisioned" ||
		len(rc.Scheduling.NodeSelector) != 1 || len(rc.Scheduling.Tolerations) != 1 || rc.Scheduling.Tolerations[0].Key != "wasm" {
		t.Errorf("rc-wasmedge = handler %s scheduling %+v", rc.Handler, rc.Scheduling)
	}
	if ref := metav1.GetControllerOf(rc); ref == nil || ref.UID != p.UID {
		t.Errorf("rc-wasmedge owner = %v", ref)
	}

	// In step with the spec: a new handler (immutable, so recreated), new tolerations, one removed.
	testutil.Eventually(t, wait, "update profile", func() error {
		p := getProfile(t, ctx, "rc")
		p.Spec.RuntimeClasses = []v1alpha1.RuntimeClassSpec{{Name: "rc-spin", Handler: "spin2", Tolerations: tol}}
		return env.client.Update(ctx, p)
	})
	testutil.Eventually(t, wait, "rc-spin recreated with handler spin2", func() error {
		rc, err := getRC("rc-spin")
		if err != nil {
			return err
		}
		if rc.Handler != "spin2" || rc.Scheduling == nil || len(rc.Scheduling.Tolerations) != 1 {
			return fmt.Errorf("handler %s scheduling %+v", rc.Handler, rc.Scheduling)
		}
		return nil
	})
	testutil.Eventually(t, wait, "rc-wasmedge deleted", func() error {
		if _, err := getRC("rc-wasmedge"); !apierrors.IsNotFound(err) {
			return stillThere(err)
		}
		return nil
	})

	// Someone else's RuntimeClass is left alone and reported.
	foreign := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "rc-foreign"}, Handler: "runc"}
	if err := env.client.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.client.Delete(context.Background(), foreign) })
	testutil.Eventually(t, wait, "update profile", func() error {
		p := getProfile(t, ctx, "rc")
		p.Spec.RuntimeClasses = append(p.Spec.RuntimeClasses, v1alpha1.RuntimeClassSpec{Name: "rc-foreign", Handler: "wasmtime"})
		return env.client.Update(ctx, p)
	})
	c := waitCondition(t, ctx, "rc", v1alpha1.ConditionDegraded, metav1.ConditionTrue, "rc-foreign")
	if c.Reason != nodeprofile.ReasonRuntimeClassConflict {
		t.Errorf("Degraded reason = %s", c.Reason)
	}
	if rc, err := getRC("rc-foreign"); err != nil || rc.Handler != "runc" || metav1.GetControllerOf(rc) != nil {
		t.Errorf("foreign RuntimeClass touched: %v %+v", err, rc)
	}
}

func TestSampleWasmShims(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "samples", "wasm-shims.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p := &v1alpha1.NodeProfile{}
	if err := yaml.UnmarshalStrict(data, p); err != nil {
		t.Fatalf("sample does not decode strictly: %v", err)
	}
	if p.Spec.Trigger == nil || p.Spec.Trigger.Annotation != "kwasm.sh/kwasm-node=true" {
		t.Errorf("trigger = %+v", p.Spec.Trigger)
	}
	var shims, handlers, restarts []string
	for _, c := range p.Spec.Install {
		switch {
		case c.InstallFile != nil:
			shims = append(shims, filepath.Base(c.InstallFile.Path))
		case c.ContainerdRuntime != nil:
			handlers = append(handlers, c.ContainerdRuntime.Name+"="+c.ContainerdRuntime.RuntimeType)
		case c.RestartService != nil:
			restarts = append(restarts, c.RestartService.Name)
		}
	}
	if got := strings.Join(shims, ","); got != "containerd-shim-wasmedge-v1,containerd-shim-wasmtime-v1,containerd-shim-spin-v2" {
		t.Errorf("shims = %s", got)
	}
	if got := strings.Join(handlers, ","); got != "wasmedge=io.containerd.wasmedge.v1,wasmtime=io.containerd.wasmtime.v1,spin=io.containerd.spin.v2" {
		t.Errorf("handlers = %s", got)
	}
	if len(restarts) != 1 || restarts[0] != "containerd" {
		t.Errorf("restarts = %v", restarts)
	}
	removed := 0
	for _, c := range p.Spec.Uninstall {
		if (c.InstallFile != nil && c.InstallFile.Remove) || (c.ContainerdRuntime != nil && c.ContainerdRuntime.Remove) {
			removed++
		}
	}
	if removed != 6 {
		t.Errorf("uninstall removes %d things, want 3 shims and 3 handlers", removed)
	}

	// The API server accepts it as written (CEL rules included) and the controller creates its
	// RuntimeClasses; limited to this test's nodes so that other tests' annotated nodes stay out.
	p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"test": "sample"}}
	makeNode(t, ctx, "sample-1", "sample", nil, kwasm)
	if err := env.client.Create(ctx, p); err != nil {
		t.Fatalf("create the sample: %v", err)
	}
	t.Cleanup(func() { forceDelete(context.Background(), p.Name) })
	for _, name := range []string{"wasmedge", "wasmtime", "spin"} {
		testutil.Eventually(t, wait, "RuntimeClass "+name, func() error {
			rc := &nodev1.RuntimeClass{}
			if err := env.client.Get(ctx, client.ObjectKey{Name: name}, rc); err != nil {
				return err
			}
			if rc.Handler != name || rc.Scheduling.NodeSelector["nodeops.io/profile.wasm-shims"] != "provisioned" {
				return fmt.Errorf("handler %s scheduling %+v", rc.Handler, rc.Scheduling)
			}
			return nil
		})
		t.Cleanup(func() {
			_ = env.client.Delete(context.Background(), &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}})
		})
	}
	task := waitTask(t, ctx, "wasm-shims", "sample-1", nodeprofile.ActionInstall)
	if len(task.Spec.Commands) != 7 {
		t.Errorf("install task has %d commands, want 7", len(task.Spec.Commands))
	}
}

// TestMaxUnavailableOver200Nodes provisions 200 nodes with autoProvision while a fake agent
// finishes tasks in random orders (some failing, then deleted by a person to retry), and checks
// on every NodeTask event the API server sends that no more than maxUnavailable nodes hold an
// unfinished task.
func TestMaxUnavailableOver200Nodes(t *testing.T) {
	needEnv(t)
	const total, limit = 200, 10
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range total {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := createNode(t, ctx, fmt.Sprintf("many-%03d", i), "many", nil, nil); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	var mu sync.Mutex
	peak, violation := 0, ""
	holding := map[string]string{} // task -> node
	taskWatch := follow(ctx, &v1alpha1.NodeTaskList{}, client.MatchingLabels{v1alpha1.LabelProfile: "many"}, func(ev watch.Event) {
		task, ok := ev.Object.(*v1alpha1.NodeTask)
		if !ok {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if ev.Type == watch.Deleted || !nodelock.Holds(task) {
			delete(holding, task.Name)
		} else {
			holding[task.Name] = task.Spec.NodeName
		}
		nodes := map[string]bool{}
		for _, n := range holding {
			nodes[n] = true
		}
		peak = max(peak, len(nodes))
		if len(nodes) > limit && violation == "" {
			violation = fmt.Sprintf("%d nodes hold unfinished tasks after %s of %s", len(nodes), ev.Type, task.Name)
		}
	})

	// Every change to the nodes from here on is the controller's: exactly one patch per node.
	nodeWrites := map[string]int{}
	nodeWatch := follow(ctx, &corev1.NodeList{}, client.MatchingLabels{"test": "many"}, func(ev watch.Event) {
		if n, ok := ev.Object.(*corev1.Node); ok && ev.Type == watch.Modified {
			mu.Lock()
			nodeWrites[n.Name]++
			mu.Unlock()
		}
	})

	makeProfile(t, ctx, "many", "many", func(s *v1alpha1.NodeProfileSpec) {
		s.Trigger = nil
		s.AutoProvision = true
		s.MaxUnavailable = ptrIntOrString(limit)
	})

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	// Liveness is judged by progress, not by a total: the play stops when no further node was
	// provisioned for stallAfter, however slow a loaded machine makes the whole run.
	const stallAfter = 2 * time.Minute
	playCtx, stopPlay := context.WithCancel(ctx)
	defer stopPlay()
	provisioned, lastProgress, stalled := -1, time.Now(), ""
	err := agent().Play(playCtx, rng, testutil.Play{
		Tasks: func() ([]v1alpha1.NodeTask, error) {
			var list v1alpha1.NodeTaskList
			if err := env.client.List(ctx, &list, client.MatchingLabels{v1alpha1.LabelProfile: "many"}); err != nil {
				return nil, err
			}
			sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
			return list.Items, nil
		},
		Done: func([]v1alpha1.NodeTask) bool {
			p := getProfile(t, ctx, "many")
			if n := int(p.Status.Nodes.Provisioned); n != provisioned {
				provisioned, lastProgress = n, time.Now()
			} else if time.Since(lastProgress) > stallAfter {
				stalled = fmt.Sprintf("no node provisioned for %s: %d of %d provisioned", stallAfter, provisioned, total)
				stopPlay()
			}
			return p.Status.Nodes.Provisioned == total && condition(p, v1alpha1.ConditionReady).Status == metav1.ConditionTrue
		},
		Batch: true,
		Step: func(ctx context.Context, task *v1alpha1.NodeTask) error {
			switch task.EffectivePhase() {
			case v1alpha1.TaskPending:
				return agent().Begin(ctx, task.Name, 0)
			case v1alpha1.TaskFailed:
				if err := env.client.Delete(ctx, task); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
				return nil
			default:
				if rng.IntN(20) == 0 {
					return agent().End(ctx, task.Name, 0, false, "random failure")
				}
				return agent().Succeed(ctx, task.Name)
			}
		},
	})
	if stalled != "" {
		t.Fatal(stalled)
	}
	must(t, err)
	var nodes corev1.NodeList
	if err := env.client.List(ctx, &nodes, client.MatchingLabels{"test": "many", nodeprofile.ProvisionedLabel("many"): v1alpha1.ProvisionedValue}); err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != total {
		t.Errorf("%d nodes labelled, want %d", len(nodes.Items), total)
	}
	cancel()
	for what, ch := range map[string]<-chan error{"tasks": taskWatch, "nodes": nodeWatch} {
		if err := <-ch; err != nil {
			t.Errorf("following %s: %v", what, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, n := range nodes.Items {
		if nodeWrites[n.Name] > 1 {
			t.Errorf("node %s written %d times, want one patch per provisioned node", n.Name, nodeWrites[n.Name])
		}
	}
	if violation != "" {
		t.Fatal(violation)
	}
	if peak < 2 {
		t.Errorf("peak %d: tasks did not run in parallel", peak)
	}
	t.Logf("peak %d nodes with unfinished tasks (maxUnavailable %d)", peak, limit)
}

func getProfileErr(ctx context.Context, name string) (*v1alpha1.NodeProfile, error) {
	p := &v1alpha1.NodeProfile{}
	return p, env.client.Get(ctx, client.ObjectKey{Name: name}, p)
}

func ptrIntOrString(v int) *intstr.IntOrString {
	x := intstr.FromInt32(int32(v))
	return &x
}

// stillThere explains why an object that should be gone is not.
func stillThere(getErr error) error {
	if getErr != nil {
		return fmt.Errorf("get: %w", getErr)
	}
	return fmt.Errorf("still there")
}

func sorted(s ...string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}
