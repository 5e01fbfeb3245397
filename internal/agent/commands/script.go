package commands

import (
	"context"
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/secretholder"
	"github.com/nodeops/nodeops/internal/transient"
)

// SecretNamespace holds the Secrets scripts take variables from (and their tasks' secret holder pods).
const SecretNamespace = secretholder.Namespace

// DefaultSecretMountWait bounds how long a script waits for the kubelet to mount its Secrets (the
// manager creates the holder pod when the task appears, or again on a retry; the kubelet mounts its
// volumes in seconds), within the command's own timeout.
const DefaultSecretMountWait = 2 * time.Minute

// runScript runs the script with /bin/sh inside the host root. A script cannot be dry-run, so in
// DryRun the host's runner reports it, not runs it.
func runScript(ctx context.Context, env *Env, s *v1alpha1.ScriptCommand) (Result, error) {
	vars, err := scriptVars(ctx, env, s)
	if err != nil {
		return Result{}, err
	}
	err = env.Host.Exec.Run(ctx, host.Cmd{
		Path:   "/bin/sh",
		Args:   []string{"-c", s.Inline},
		Env:    host.ScriptEnv(env.NodeName, env.Operation, env.DryRun, vars),
		Output: env.Out,
	})
	if err != nil {
		return Result{}, err
	}
	return Result{Message: "script finished"}, nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// scriptVars resolves the script's variables as a Pod's are: every key of each envFrom Secret,
// then env, which wins. Secrets are read now, when the command runs, from the volumes the node's
// kubelet mounted for the task's secret holder pod (internal/secretholder), and never stored in the
// task; every value read from one is added to env.Secrets for redaction.
func scriptVars(ctx context.Context, env *Env, s *v1alpha1.ScriptCommand) ([]v1alpha1.EnvVar, error) {
	if len(s.EnvFrom) == 0 && !hasValueFrom(s.Env) {
		return s.Env, nil
	}
	h := &heldSecrets{env: env, read: map[string]map[string][]byte{}}
	var order []string
	values := map[string]string{}
	set := func(name, value string) {
		if _, ok := values[name]; !ok {
			order = append(order, name)
		}
		values[name] = value
	}
	for _, from := range s.EnvFrom {
		data, err := h.get(ctx, from.SecretRef.Name)
		if err != nil {
			return nil, err
		}
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !envName.MatchString(k) {
				env.printf("envFrom Secret %s: key %q is not a variable name, skipped\n", from.SecretRef.Name, k)
				continue
			}
			env.Secrets.Add(string(data[k]))
			set(k, string(data[k]))
		}
	}
	for _, e := range s.Env {
		if e.ValueFrom == nil {
			set(e.Name, e.Value)
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		data, err := h.get(ctx, ref.Name)
		if err != nil {
			return nil, err
		}
		v, ok := data[ref.Key]
		if !ok {
			return nil, fmt.Errorf("env %s: Secret %s/%s has no key %q", e.Name, SecretNamespace, ref.Name, ref.Key)
		}
		env.Secrets.Add(string(v))
		set(e.Name, string(v))
	}
	vars := make([]v1alpha1.EnvVar, 0, len(order))
	for _, n := range order {
		vars = append(vars, v1alpha1.EnvVar{Name: n, Value: values[n]})
	}
	return vars, nil
}

func hasValueFrom(vars []v1alpha1.EnvVar) bool {
	for _, e := range vars {
		if e.ValueFrom != nil {
			return true
		}
	}
	return false
}

// heldSecrets reads the running task's Secrets from its holder pod's volumes on this node, each once.
type heldSecrets struct {
	env  *Env
	read map[string]map[string][]byte
}

// get is the Secret's data (key to value). The agent has no right to read a Secret from the API
// server; the kubelet of its node may, for pods bound to the node, and mounts them on the host. So
// this finds the task's holder pod by name, checks that it is bound to this node and controlled by
// this task (by UID), waits until the kubelet has mounted the Secret's volume, and reads the files
// there through the host root.
func (h *heldSecrets) get(ctx context.Context, name string) (map[string][]byte, error) {
	if data, ok := h.read[name]; ok {
		return data, nil
	}
	env := h.env
	if !secretholder.Allowed(name) {
		return nil, fmt.Errorf("refusing Secret %s/%s: scripts take env only from Secrets named %s*", SecretNamespace, name, v1alpha1.ScriptSecretPrefix)
	}
	if env.Client == nil {
		return nil, fmt.Errorf("reading Secret %s/%s: this agent has no cluster client to find its task's secret holder pod", SecretNamespace, name)
	}
	wait := env.SecretMountWait
	if wait <= 0 {
		wait = DefaultSecretMountWait
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	defer env.waiting(v1alpha1.WaitSecretMount)()
	pod := secretholder.PodName(env.Task)
	ref := SecretNamespace + "/" + pod
	noted := ""
	for {
		dir, why, err := h.mounted(wctx, pod, name)
		if err != nil {
			return nil, err
		}
		if (wctx.Err() != nil || strings.HasPrefix(why, cutOffLook)) && noted != "" {
			why = noted // the wait ended during this look: the reason is the last look's, not the cut-off read
		}
		if why == "" {
			data, err := readSecretVolume(env.Host.Files, dir)
			if err != nil {
				return nil, fmt.Errorf("reading Secret %s/%s from pod %s's volume %s: %w", SecretNamespace, name, ref, dir, err)
			}
			h.read[name] = data
			env.printf("read Secret %s/%s (%d keys) from pod %s's volume, mounted by this node's kubelet\n", SecretNamespace, name, len(data), ref)
			return data, nil
		}
		if why != noted {
			msg := fmt.Sprintf("waiting for Secret %s/%s: %s (up to %s)", SecretNamespace, name, why, wait)
			env.printf("%s\n", msg)
			if env.Note != nil {
				env.Note(msg)
			}
			noted = why
		}
		if err := clock.Sleep(wctx, env.poll()); err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("waiting for Secret %s/%s: %w", SecretNamespace, name, ctx.Err())
			}
			return nil, fmt.Errorf("no Secret %s/%s for the script after %s: %s; it is read from this task's pod %s, which the manager creates and this node's kubelet mounts it in",
				SecretNamespace, name, wait, why, ref)
		}
	}
}

// cutOffLook begins the reason mounted gives when the wait ended (or its client's rate limiter saw
// it would end) before the pod could be read: not an answer, so the last look's reason stands.
const cutOffLook = "could not read pod "

// mounted is the host directory of the Secret's volume in the task's holder pod once the kubelet
// has mounted it; otherwise why it is not there yet. A pod that can never be the task's (another
// node's) is an error; one another task controls is waited out (an earlier task of the same name
// whose pod the manager replaces), never read.
func (h *heldSecrets) mounted(ctx context.Context, pod, secret string) (dir, why string, err error) {
	env := h.env
	ref := SecretNamespace + "/" + pod
	p := &corev1.Pod{}
	err = transient.Retry(ctx, func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: SecretNamespace, Name: pod}, p) })
	switch {
	case apierrors.IsNotFound(err):
		return "", "pod " + ref + " does not exist yet (the manager creates it for the task)", nil
	case transient.CutOff(ctx, err):
		return "", cutOffLook + ref + " before the wait ended: " + err.Error(), nil
	case err != nil:
		return "", "", fmt.Errorf("reading the task's secret holder pod %s: %w", ref, err)
	case p.Spec.NodeName != env.NodeName:
		return "", "", fmt.Errorf("refusing pod %s: it is bound to node %q, not this node %s, so its Secrets are not mounted here for this task", ref, p.Spec.NodeName, env.NodeName)
	case !secretholder.OwnedBy(p, env.TaskUID):
		owner := "no NodeTask"
		if c := metav1.GetControllerOf(p); c != nil {
			owner = fmt.Sprintf("%s %s (uid %s)", c.Kind, c.Name, c.UID)
		}
		return "", fmt.Sprintf("pod %s is controlled by %s, not by this task (uid %s): its volumes are not read", ref, owner, env.TaskUID), nil
	case p.DeletionTimestamp != nil:
		return "", "pod " + ref + " is being deleted (the manager creates it again)", nil
	}
	vol := secretholder.VolumeOf(p, secret)
	if vol == "" {
		return "", "", fmt.Errorf("pod %s has no volume of Secret %s/%s", ref, SecretNamespace, secret)
	}
	root := env.KubeletRootDir
	if root == "" {
		root = secretholder.DefaultKubeletRootDir
	}
	dir = secretholder.VolumeDir(root, p.UID, vol)
	if !env.Host.Files.Exists(path.Join(dir, secretholder.DataLink)) {
		return "", fmt.Sprintf("the kubelet has not mounted it in pod %s (%s) at %s yet", ref, orPending(p.Status.Phase), dir), nil
	}
	return dir, "", nil
}

// readSecretVolume reads a kubelet secret volume at host path dir: its ..data link names the
// directory of the current files, one per key (the kubelet's atomic writer; the key links beside it
// point into ..data). Only what stays inside dir is read: ..data must resolve to a directory of dir
// itself, so no link in the volume can make the agent hand a script any other file of the host.
func readSecretVolume(files host.Files, dir string) (map[string][]byte, error) {
	realDir, err := files.Path(dir)
	if err != nil {
		return nil, err
	}
	data := path.Join(dir, secretholder.DataLink)
	realData, err := files.Path(data)
	if err != nil {
		return nil, err
	}
	if filepath.Dir(realData) != realDir || !strings.HasPrefix(filepath.Base(realData), "..") {
		return nil, fmt.Errorf("%s does not lead to a directory of the volume's own", data)
	}
	entries, err := files.ReadDir(data)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue // a Secret's keys are files; nothing else is a key
		}
		v, err := files.ReadFile(path.Join(data, e.Name()))
		if err != nil {
			return nil, err
		}
		out[e.Name()] = v
	}
	return out, nil
}
