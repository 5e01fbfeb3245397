package cli

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/hook"
	"github.com/nodeops/nodeops/internal/plan"
)

// allHooks is every hook the operation or one of its groups declares, by point.
func allHooks(op *nodeopsv1.NodeOperation) []nodeopsv1.Hook {
	var out []nodeopsv1.Hook
	add := func(h *nodeopsv1.Hooks) {
		if h != nil {
			out = append(append(append(append(out, h.PreOperation...), h.PreNode...), h.PostNode...), h.PostOperation...)
		}
	}
	add(op.Spec.Hooks)
	if op.Spec.Custom != nil {
		for i := range op.Spec.Custom.Groups {
			add(op.Spec.Custom.Groups[i].Hooks)
		}
	}
	return out
}

// recoverHook retries or skips a failed hook: it sets the annotation prefix+hook to a new value,
// on which the manager acts once for each run of that hook that failed.
func (o *Options) recoverHook(ctx context.Context, c Client, name, hookName, node string, mode nodeopsv1.RecoveryMode) error {
	if node != "" {
		return fmt.Errorf("--hook acts on every failed run of the operation's hook: it takes no --node")
	}
	op := &nodeopsv1.NodeOperation{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, op); err != nil {
		return fmt.Errorf("getting nodeoperation %q: %w", name, err)
	}
	found := false
	for _, h := range allHooks(op) {
		found = found || h.Name == hookName
	}
	if !found {
		return fmt.Errorf("nodeoperation %s has no hook %q", name, hookName)
	}
	failed := 0
	for _, r := range op.Status.Hooks {
		if r.Hook == hookName && r.State == nodeopsv1.HookFailed {
			failed++
		}
	}
	if failed == 0 {
		return fmt.Errorf("nodeoperation %s: hook %s has not failed", name, hookName)
	}
	prefix, done := nodeopsv1.AnnotationRetryHookPrefix, "runs again"
	if mode == nodeopsv1.RecoverySkip {
		prefix, done = nodeopsv1.AnnotationSkipHookPrefix, "skipped"
	}
	if err := patchOperation(ctx, c, op, func(op *nodeopsv1.NodeOperation) {
		if op.Annotations == nil {
			op.Annotations = map[string]string{}
		}
		// A new value each time: the manager acts once per value.
		op.Annotations[prefix+hookName] = time.Now().UTC().Format(time.RFC3339Nano)
	}); err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "nodeoperation/%s: hook %s %s (%d failed runs)\n", name, hookName, done, failed)
	return nil
}

// hookLines are the hooks of a group in words, by point, for plan and describe.
func hookLines(h *nodeopsv1.Hooks) []string {
	var out []string
	for _, p := range []struct {
		name  string
		hooks []nodeopsv1.Hook
	}{{"preOperation", h.At(nodeopsv1.HookPreOperation)}, {"preNode", h.At(nodeopsv1.HookPreNode)}, {"postNode", h.At(nodeopsv1.HookPostNode)}, {"postOperation", h.At(nodeopsv1.HookPostOperation)}} {
		for i := range p.hooks {
			out = append(out, p.name+" "+hook.Describe(&p.hooks[i]))
		}
	}
	return out
}

// hookRunLine is one recorded hook run in words, for describe.
func hookRunLine(r *nodeopsv1.HookRun) string {
	where := string(r.Point)
	if r.Node != "" {
		where += fmt.Sprintf(" %s/%s", r.Group, r.Node)
	}
	if r.Outcome == hook.OutcomeFailed {
		where += " (after a failure)"
	}
	line := fmt.Sprintf("%s: %s %s (attempt %d, since %s)", where, r.Hook, r.State, r.Attempt, r.Since.UTC().Format(time.RFC3339))
	if r.Message != "" {
		line += ": " + r.Message
	}
	return line
}

// groupHooks are the hooks around a planned group: the operation's preOperation hooks on the
// first group, the group's preNode and postNode (its own over the operation's), and the
// operation's postOperation hooks on the last group.
func groupHooks(op *nodeopsv1.NodeOperation, groups []plan.ResolvedGroup, name string) []string {
	var own *nodeopsv1.Hooks
	first, last := len(groups) > 0 && groups[0].Name == name, len(groups) > 0 && groups[len(groups)-1].Name == name
	for i := range groups {
		if groups[i].Name == name {
			own = groups[i].Hooks
		}
	}
	eff := own.Over(op.Spec.Hooks)
	if eff == nil {
		return nil
	}
	h := nodeopsv1.Hooks{PreNode: eff.PreNode, PostNode: eff.PostNode}
	if name == plan.GroupPreflight {
		h = nodeopsv1.Hooks{}
	}
	if first {
		h.PreOperation = eff.PreOperation
	}
	if last {
		h.PostOperation = eff.PostOperation
	}
	return hookLines(&h)
}
