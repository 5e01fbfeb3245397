package nodeoperation_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/cli"
	"github.com/nodeops/nodeops/internal/controller/nodeoperation"
	"github.com/nodeops/nodeops/internal/testutil"
)

// TestPauseBeforeHoldsTheNamedNodeOnce: an operation pauses before a node named in pauseBefore,
// naming it, with no task for it; `kubectl nodeops resume` lets it start, and the same node in a
// later group does not pause the operation again.
func TestPauseBeforeHoldsTheNamedNodeOnce(t *testing.T) {
	f := newFixture(t)
	nodes := f.nodes(nil, "n1", "n2", "n3")
	held := nodes[1]
	op := f.operation("pausebefore", func(o *v1alpha1.NodeOperation) {
		o.Spec.PauseBefore = []string{held}
	}, v1alpha1.Group{Name: "first", Commands: []v1alpha1.Command{script("a")}},
		v1alpha1.Group{Name: "second", Commands: []v1alpha1.Command{script("b")}})

	hasTask := func(group, node string) bool {
		for _, task := range f.tasks(op.Name) {
			if task.Spec.Group == group && task.Spec.NodeName == node {
				return true
			}
		}
		return false
	}
	// The first node runs; the operation then pauses before the held node.
	f.runAll(f.waitTasks(op.Name, 1)[0].Name)
	paused := f.waitPhase(op.Name, v1alpha1.OperationPaused)
	c := condition(paused, v1alpha1.ConditionProgressing)
	if c.Reason != nodeoperation.ReasonPausedBeforeNode || !strings.Contains(c.Message, "paused before node "+held) || paused.Status.PausedBefore != held {
		t.Fatalf("paused with %s: %q, pausedBefore %q; want %s naming %s", c.Reason, c.Message, paused.Status.PausedBefore, nodeoperation.ReasonPausedBeforeNode, held)
	}
	// The status above was written by the reconcile that decided to start nothing; tasks are
	// created after that write, so any task for the held node would already exist.
	if hasTask("first", held) {
		t.Fatalf("a task for %s exists while the operation is paused before it", held)
	}

	var out bytes.Buffer
	o := cli.NewOptions(genericiooptions.IOStreams{Out: &out, ErrOut: &out})
	o.NewClient = func() (cli.Client, error) { return f.c, nil }
	if code := cli.Run(o, []string{"resume", op.Name}); code != 0 {
		t.Fatalf("kubectl nodeops resume: exit %d: %s", code, out.String())
	}
	if !strings.Contains(out.String(), "resumed before node "+held) {
		t.Errorf("resume said %q", out.String())
	}
	if got := f.get(op.Name).Spec.ResumedBefore; len(got) != 1 || got[0] != held {
		t.Fatalf("spec.resumedBefore = %v, want [%s]", got, held)
	}

	testutil.Eventually(t, 30*time.Second, "a task for the resumed node", func() error {
		if !hasTask("first", held) {
			return fmt.Errorf("no task for %s yet", held)
		}
		return nil
	})
	// Every node of both groups runs; the held node's second group never pauses again.
	testutil.Eventually(t, 60*time.Second, "the operation to succeed without pausing again", func() error {
		got := f.get(op.Name)
		if got.Status.PausedBefore != "" || got.Status.Phase == v1alpha1.OperationPaused {
			return fmt.Errorf("paused again: %s", condition(got, v1alpha1.ConditionProgressing).Message)
		}
		if got.Status.Phase == v1alpha1.OperationSucceeded {
			return nil
		}
		for _, task := range f.tasks(op.Name) {
			if task.Status.Phase == "" || task.Status.Phase == v1alpha1.TaskPending {
				f.runAll(task.Name)
			}
		}
		return fmt.Errorf("phase %s", got.Status.Phase)
	})
	if !hasTask("second", held) {
		t.Errorf("no task for %s in the second group", held)
	}
}
