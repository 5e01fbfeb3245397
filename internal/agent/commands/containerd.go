package commands

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/pelletier/go-toml/v2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/containerdtoml"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

const defaultContainerdConfig = "/etc/containerd/config.toml"

func runContainerdRuntime(ctx context.Context, env *Env, c *v1alpha1.ContainerdRuntimeCommand) (Result, error) {
	if !c.Remove && c.RuntimeType == "" {
		return Result{}, fmt.Errorf("containerdRuntime %s: runtimeType is required to add a handler", c.Name)
	}
	t, err := resolveContainerd(env.Host.Files, c)
	if err != nil {
		return Result{}, err
	}
	msg, err := editContainerdTarget(env, t, c)
	if err != nil {
		return Result{}, err
	}
	// Restart even when the file was already right: an interrupted earlier run may have written it
	// without restarting.
	if c.SkipRestart {
		return Result{Message: msg + "; " + t.unit + " not restarted (skipRestart)"}, nil
	}
	drain := c.Restart != nil && c.Restart.Drain
	uncordon := drain
	if drain {
		// A node this task's owner had already cordoned (a cordon command earlier in the task) is left
		// for that cordon's uncordon to restore, so the drained restart never uncordons mid-task.
		held, err := cordonedByOwner(ctx, env)
		if err != nil {
			return Result{}, fmt.Errorf("%s; before restarting %s: %w", msg, t.unit, err)
		}
		uncordon = !held
		if _, err := runCordon(ctx, env, &v1alpha1.CordonCommand{}); err != nil {
			return Result{}, fmt.Errorf("%s; before restarting %s: %w", msg, t.unit, err)
		}
		if _, err := runDrain(ctx, env, &v1alpha1.DrainCommand{}); err != nil {
			// The node stays cordoned, as after a failed drain command; a retry drains again.
			return Result{}, fmt.Errorf("%s; before restarting %s: %w", msg, t.unit, err)
		}
	}
	if err := env.Host.Services.Restart(ctx, t.unit); err != nil {
		return Result{}, fmt.Errorf("%s; restarting %s: %w", msg, t.unit, err)
	}
	msg += "; " + t.unit + " restarted"
	if drain && !uncordon {
		msg += " after a drain; the node stays cordoned for the cordon before this command"
	}
	if uncordon {
		res, err := runUncordon(ctx, env, &v1alpha1.UncordonCommand{})
		if err != nil {
			return Result{}, fmt.Errorf("%s; %w", msg, err)
		}
		msg += " after a drain; " + res.Message
	}
	return Result{Message: msg}, nil
}

// cordonedByOwner says whether the node carries this task's owner's cordon record.
func cordonedByOwner(ctx context.Context, env *Env) (bool, error) {
	node := &corev1.Node{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: env.NodeName}, node); err != nil {
		return false, fmt.Errorf("reading node %s: %w", env.NodeName, err)
	}
	rec, ok := taskpolicy.ParseCordonRecord(node)
	return ok && rec.Owner == env.owner(), nil
}

// editContainerdTarget writes the handler into (or out of) the resolved file and says what it did.
func editContainerdTarget(env *Env, t containerdTarget, c *v1alpha1.ContainerdRuntimeCommand) (string, error) {
	h := containerdtoml.RuntimeHandler{Name: c.Name, RuntimeType: c.RuntimeType, BinaryPath: c.BinaryPath, PodAnnotations: c.PodAnnotations, Options: containerdtoml.OptionValues(c.Options)}
	files := env.Host.Files
	data, err := files.ReadFile(t.path)
	exists := err == nil
	switch {
	case exists:
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("reading %s: %w", t.path, err)
	case c.Remove:
		env.printf("%s does not exist: nothing to remove\n", t.path)
		return fmt.Sprintf("%s absent, runtime %s not in it", t.path, c.Name), nil
	case t.dropIn:
		data = []byte(fmt.Sprintf("version = %d\n", t.version))
	case t.template && t.seed != "":
		// As runtime-class-manager does: a new template starts from the config the distro generated.
		if data, err = files.ReadFile(t.seed); err != nil {
			return "", fmt.Errorf("reading %s to start %s from: %w", t.seed, t.path, err)
		}
	default:
		return "", fmt.Errorf("reading %s: %w", t.path, err)
	}
	source := data
	if t.template {
		source = maskTemplate(data)
	}
	edit, err := containerdtoml.Edit(source, h, c.Remove, t.version)
	if err != nil {
		return "", fmt.Errorf("%s: %w", t.path, err)
	}
	if t.template {
		if edit.Rewritten && hasTemplateActions(data) {
			return "", fmt.Errorf("%s: the handler is written in a form only a re-encode could change, which would lose the template's {{ }} lines: edit it by hand", t.path)
		}
		edit.Data = unmaskTemplate(data, edit.Data)
	}
	verb := "added to"
	if c.Remove {
		verb = "removed from"
	}
	if !edit.Changed && exists {
		env.printf("%s already as wanted\n", t.path)
		return fmt.Sprintf("%s already as wanted", t.path), nil
	}
	if t.dropIn && c.Remove && onlyVersion(edit.Data) {
		if err := files.Remove(t.path); err != nil {
			return "", err
		}
		env.printf("runtime %s removed: drop-in %s deleted\n", c.Name, t.path)
		return fmt.Sprintf("runtime %s removed: drop-in %s deleted", c.Name, t.path), nil
	}
	mode := fs.FileMode(0o644)
	if fi, err := files.Stat(t.path); err == nil {
		mode = fi.Mode().Perm()
	} else if fi, err := files.Stat(t.seed); t.seed != "" && err == nil {
		mode = fi.Mode().Perm()
	}
	if err := files.WriteFileAtomic(t.path, edit.Data, mode); err != nil {
		return "", err
	}
	what := t.path
	switch {
	case t.dropIn:
		what = "drop-in " + t.path
	case t.template && !exists:
		what = "new template " + t.path + " (from " + t.seed + ")"
	}
	env.printf("runtime %s %s %s\n", c.Name, verb, what)
	if edit.Rewritten {
		env.printf("note: %s was re-encoded whole (its comments and layout could not be kept)\n", t.path)
	}
	return fmt.Sprintf("runtime %s %s %s", c.Name, verb, what), nil
}

// onlyVersion says whether a drop-in holds nothing but its version and empty tables.
func onlyVersion(data []byte) bool {
	doc := map[string]any{}
	if toml.Unmarshal(data, &doc) != nil {
		return false
	}
	delete(doc, "version")
	m, _ := containerdtoml.Pruned(doc).(map[string]any)
	return len(m) == 0
}
