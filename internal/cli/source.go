package cli

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
)

var errOperationGone = errors.New("operation was deleted")

// opSource keeps an operation and its tasks current from list + watch, re-listing when a watch ends.
type opSource struct {
	c     Client
	name  string
	op    *nodeopsv1.NodeOperation
	tasks map[string]*nodeopsv1.NodeTask
	opW   watch.Interface
	taskW watch.Interface
}

func newOpSource(ctx context.Context, c Client, name string) (*opSource, error) {
	s := &opSource{c: c, name: name}
	if err := s.relistOperation(ctx); err != nil {
		return nil, err
	}
	if err := s.relistTasks(ctx); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

func (s *opSource) stop() {
	if s.opW != nil {
		s.opW.Stop()
	}
	if s.taskW != nil {
		s.taskW.Stop()
	}
}

func (s *opSource) relistOperation(ctx context.Context) error {
	if s.opW != nil {
		s.opW.Stop()
		s.opW = nil
	}
	var list nodeopsv1.NodeOperationList
	sel := client.MatchingFields{"metadata.name": s.name}
	if err := s.c.List(ctx, &list, sel); err != nil {
		return fmt.Errorf("getting nodeoperation %q: %w", s.name, err)
	}
	if len(list.Items) == 0 {
		if s.op != nil {
			return errOperationGone
		}
		return fmt.Errorf("nodeoperation %q not found", s.name)
	}
	s.op = &list.Items[0]
	w, err := s.c.Watch(ctx, &nodeopsv1.NodeOperationList{}, sel,
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true}})
	if err != nil {
		return fmt.Errorf("watching nodeoperation %q: %w", s.name, err)
	}
	s.opW = w
	return nil
}

func (s *opSource) relistTasks(ctx context.Context) error {
	if s.taskW != nil {
		s.taskW.Stop()
		s.taskW = nil
	}
	var list nodeopsv1.NodeTaskList
	sel := client.MatchingLabels{nodeopsv1.LabelOperation: s.name}
	if err := s.c.List(ctx, &list, sel); err != nil {
		return fmt.Errorf("listing tasks of nodeoperation %q: %w", s.name, err)
	}
	s.tasks = make(map[string]*nodeopsv1.NodeTask, len(list.Items))
	for i := range list.Items {
		s.tasks[list.Items[i].Name] = &list.Items[i]
	}
	w, err := s.c.Watch(ctx, &nodeopsv1.NodeTaskList{}, sel,
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true}})
	if err != nil {
		return fmt.Errorf("watching tasks of nodeoperation %q: %w", s.name, err)
	}
	s.taskW = w
	return nil
}

// reconnect re-lists and watches again whatever watch is down.
func (s *opSource) reconnect(ctx context.Context) error {
	if s.opW == nil {
		if err := s.relistOperation(ctx); err != nil {
			return err
		}
	}
	if s.taskW == nil {
		return s.relistTasks(ctx)
	}
	return nil
}

// applyOperationEvent returns whether the state changed; ok=false when the watch ended and was re-listed.
func (s *opSource) applyOperationEvent(ctx context.Context, ev watch.Event, ok bool) (bool, error) {
	if !ok || ev.Type == watch.Error {
		return true, s.relistOperation(ctx)
	}
	switch ev.Type {
	case watch.Deleted:
		return true, errOperationGone
	case watch.Added, watch.Modified:
		if op, isOp := ev.Object.(*nodeopsv1.NodeOperation); isOp {
			s.op = op
			return true, nil
		}
	}
	return false, nil
}

func (s *opSource) applyTaskEvent(ctx context.Context, ev watch.Event, ok bool) (bool, error) {
	if !ok || ev.Type == watch.Error {
		return true, s.relistTasks(ctx)
	}
	t, isTask := ev.Object.(*nodeopsv1.NodeTask)
	if !isTask {
		return false, nil
	}
	switch ev.Type {
	case watch.Deleted:
		delete(s.tasks, t.Name)
		return true, nil
	case watch.Added, watch.Modified:
		s.tasks[t.Name] = t
		return true, nil
	}
	return false, nil
}

// snapshot returns the tasks in display order.
func (s *opSource) snapshot() (*nodeopsv1.NodeOperation, []nodeopsv1.NodeTask) {
	tasks := make([]nodeopsv1.NodeTask, 0, len(s.tasks))
	for _, t := range s.tasks {
		tasks = append(tasks, *t)
	}
	sortTasks(s.op, tasks)
	return s.op, tasks
}
