package nodeoperation_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/nodelock"
	"github.com/nodeops/nodeops/internal/testutil"
)

// Two operations over the same nodes never have tasks holding one node at once, checked on every
// task event the API server sends; the one that waits says so, naming the node and the holder.
func TestSafetyRule1_OverlappingOperationsShareNoNode(t *testing.T) {
	f := newFixture(t)
	f.nodes(nil, "n1", "n2", "n3", "n4")

	// Watch every task event from the API server, in order.
	var list v1alpha1.NodeTaskList
	if err := f.c.List(f.ctx, &list); err != nil {
		t.Fatal(err)
	}
	w, err := f.c.Watch(f.ctx, &v1alpha1.NodeTaskList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var mu sync.Mutex
	var violation string
	finished := map[string]bool{} // tasks the watch saw finish, so the check is not vacuous
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		holding := map[string]string{} // task -> node
		for ev := range w.ResultChan() {
			task, ok := ev.Object.(*v1alpha1.NodeTask)
			if !ok || !strings.HasPrefix(task.Name, f.id) {
				continue
			}
			if ev.Type == watch.Deleted || !nodelock.Holds(task) {
				delete(holding, task.Name)
				mu.Lock()
				finished[task.Name] = true
				mu.Unlock()
				continue
			}
			holding[task.Name] = task.Spec.NodeName
			for other, node := range holding {
				if other != task.Name && node == task.Spec.NodeName {
					mu.Lock()
					violation = fmt.Sprintf("tasks %s and %s both hold node %s", other, task.Name, node)
					mu.Unlock()
				}
			}
		}
	}()

	mu100 := func(o *v1alpha1.NodeOperation) { o.Spec.MaxUnavailable = intOrStr("100%") }
	a := f.operation("a", mu100, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	f.waitTasks(a.Name, 4)
	b := f.operation("b", mu100, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	testutil.Eventually(t, 20*time.Second, "b waits for a's nodes", func() error {
		op := f.get(b.Name)
		c := meta.FindStatusCondition(op.Status.Conditions, v1alpha1.ConditionProgressing)
		if c == nil || c.Reason != "WaitingForNode" || !strings.Contains(c.Message, f.id+"-n1") || !strings.Contains(c.Message, "NodeOperation/"+a.Name) {
			return fmt.Errorf("Progressing %+v", c)
		}
		return nil
	})
	if n := len(f.tasks(b.Name)); n != 0 {
		t.Fatalf("b has %d tasks while a holds every node", n)
	}

	// Play the agent for both operations, finishing tasks in random order.
	f.playAgents(rand.New(rand.NewPCG(1, 2)), nil, a.Name, b.Name)
	f.waitPhase(a.Name, v1alpha1.OperationSucceeded)
	f.waitPhase(b.Name, v1alpha1.OperationSucceeded)
	if n := len(f.tasks(b.Name)); n != 4 {
		t.Fatalf("b ran %d tasks", n)
	}
	w.Stop()
	<-watchDone
	mu.Lock()
	defer mu.Unlock()
	if violation != "" {
		t.Fatal(violation)
	}
	if len(finished) != 8 {
		t.Fatalf("the watch saw %d of 8 tasks finish", len(finished))
	}
}
