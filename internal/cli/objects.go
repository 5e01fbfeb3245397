package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
)

func getOperation(ctx context.Context, c Client, name string) (*nodeopsv1.NodeOperation, error) {
	op := &nodeopsv1.NodeOperation{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, op); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("nodeoperation %q not found", name)
		}
		return nil, fmt.Errorf("getting nodeoperation %q: %w", name, err)
	}
	return op, nil
}

// listTasks returns the operation's tasks in display order: by group, then by node.
func listTasks(ctx context.Context, c Client, op *nodeopsv1.NodeOperation) ([]nodeopsv1.NodeTask, error) {
	var list nodeopsv1.NodeTaskList
	if err := c.List(ctx, &list, client.MatchingLabels{nodeopsv1.LabelOperation: op.Name}); err != nil {
		return nil, fmt.Errorf("listing tasks of nodeoperation %q: %w", op.Name, err)
	}
	sortTasks(op, list.Items)
	return list.Items, nil
}

// groupNames is the operation's groups in order: from its status, else from a custom spec.
func groupNames(op *nodeopsv1.NodeOperation) []string {
	var names []string
	for _, g := range op.Status.Groups {
		names = append(names, g.Name)
	}
	if len(names) == 0 && op.Spec.Custom != nil {
		for _, g := range op.Spec.Custom.Groups {
			names = append(names, g.Name)
		}
	}
	return names
}

func sortTasks(op *nodeopsv1.NodeOperation, tasks []nodeopsv1.NodeTask) {
	order := map[string]int{}
	for i, n := range groupNames(op) {
		order[n] = i
	}
	rank := func(g string) int {
		if i, ok := order[g]; ok {
			return i
		}
		return len(order)
	}
	sort.SliceStable(tasks, func(i, j int) bool {
		a, b := &tasks[i], &tasks[j]
		if ra, rb := rank(a.Spec.Group), rank(b.Spec.Group); ra != rb {
			return ra < rb
		}
		if a.Spec.NodeName != b.Spec.NodeName {
			return a.Spec.NodeName < b.Spec.NodeName
		}
		return a.Name < b.Name
	})
}

// taskFinished: the task will do nothing more on its own.
func taskFinished(t *nodeopsv1.NodeTask) bool {
	p := t.EffectivePhase()
	return p == nodeopsv1.TaskSucceeded || p == nodeopsv1.TaskAborted
}

// awaitingApproval: a Controlled task whose next command has not been approved yet.
func awaitingApproval(t *nodeopsv1.NodeTask) bool {
	if t.Spec.ExecutionMode != nodeopsv1.ExecutionControlled || taskFinished(t) || t.Spec.Abort {
		return false
	}
	if t.EffectivePhase() == nodeopsv1.TaskFailed {
		return false
	}
	next := t.Status.CurrentCommand
	return next >= t.Spec.ApprovedCommands && int(next) < len(t.Spec.Commands)
}

// currentCommandName names the command running or next to run, "" when there is none.
func currentCommandName(t *nodeopsv1.NodeTask) string {
	i := int(t.Status.CurrentCommand)
	if i < 0 || i >= len(t.Spec.Commands) {
		return ""
	}
	return t.Spec.Commands[i].DisplayName()
}

// failedCommand is the index of the failed command, or -1.
func failedCommand(t *nodeopsv1.NodeTask) int {
	for i := range t.Status.Commands {
		if t.Status.Commands[i].Phase == nodeopsv1.CommandFailed {
			return i
		}
	}
	if t.EffectivePhase() == nodeopsv1.TaskFailed {
		i := int(t.Status.CurrentCommand)
		if i >= 0 && i < len(t.Spec.Commands) {
			return i
		}
	}
	return -1
}

func commandStatus(t *nodeopsv1.NodeTask, i int) *nodeopsv1.CommandStatus {
	if i < 0 || i >= len(t.Status.Commands) {
		return nil
	}
	return &t.Status.Commands[i]
}

// printObject writes obj as json or yaml with its apiVersion and kind set.
func printObject(w io.Writer, s *runtime.Scheme, obj runtime.Object, format string) error {
	if err := setKinds(s, obj); err != nil {
		return err
	}
	return printData(w, obj, format)
}

// printData writes any value as json or yaml.
func printData(w io.Writer, v any, format string) error {
	var out []byte
	var err error
	switch format {
	case "json":
		out, err = json.MarshalIndent(v, "", "  ")
		out = append(out, '\n')
	case "yaml":
		out, err = yaml.Marshal(v)
	default:
		return fmt.Errorf("unknown output format %q: use json or yaml", format)
	}
	if err != nil {
		return fmt.Errorf("encoding %s: %w", format, err)
	}
	_, err = w.Write(out)
	return err
}

func setKinds(s *runtime.Scheme, obj runtime.Object) error {
	gvk, err := apiutil.GVKForObject(obj, s)
	if err != nil {
		return fmt.Errorf("finding kind: %w", err)
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	switch l := obj.(type) {
	case *nodeopsv1.NodeOperationList:
		for i := range l.Items {
			if err := setKinds(s, &l.Items[i]); err != nil {
				return err
			}
		}
	case *nodeopsv1.NodeTaskList:
		for i := range l.Items {
			if err := setKinds(s, &l.Items[i]); err != nil {
				return err
			}
		}
	case *nodeopsv1.NodeProfileList:
		for i := range l.Items {
			if err := setKinds(s, &l.Items[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

func validateOutput(format string, allowed ...string) error {
	if format == "" {
		return nil
	}
	for _, a := range allowed {
		if format == a {
			return nil
		}
	}
	return fmt.Errorf("unknown output format %q: use one of %v", format, allowed)
}
