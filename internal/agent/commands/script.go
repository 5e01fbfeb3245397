package commands

import (
	"context"
	"fmt"
	"regexp"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// SecretNamespace holds the Secrets scripts take variables from; the agent may get Secrets there
// and nowhere else (config/agent).
const SecretNamespace = "nodeops-system"

// LabelAgentReadable marks a Secret in SecretNamespace that scripts may read; the agent refuses
// any other, so a NodeOperation cannot read the namespace's other Secrets through it.
const LabelAgentReadable = "nodeops.io/agent-readable"

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
// then env, which wins. Secrets are read now, when the command runs, and never stored in the
// task; every value read from one is added to env.Secrets for redaction.
func scriptVars(ctx context.Context, env *Env, s *v1alpha1.ScriptCommand) ([]v1alpha1.EnvVar, error) {
	if len(s.EnvFrom) == 0 && !hasValueFrom(s.Env) {
		return s.Env, nil
	}
	read := map[string]*corev1.Secret{}
	get := func(name string) (*corev1.Secret, error) {
		if sec, ok := read[name]; ok {
			return sec, nil
		}
		sec, err := readSecret(ctx, env, name)
		if err != nil {
			return nil, err
		}
		read[name] = sec
		return sec, nil
	}
	var order []string
	values := map[string]string{}
	set := func(name, value string) {
		if _, ok := values[name]; !ok {
			order = append(order, name)
		}
		values[name] = value
	}
	for _, from := range s.EnvFrom {
		sec, err := get(from.SecretRef.Name)
		if err != nil {
			return nil, err
		}
		keys := make([]string, 0, len(sec.Data))
		for k := range sec.Data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !envName.MatchString(k) {
				env.printf("envFrom Secret %s: key %q is not a variable name, skipped\n", from.SecretRef.Name, k)
				continue
			}
			env.Secrets.Add(string(sec.Data[k]))
			set(k, string(sec.Data[k]))
		}
	}
	for _, e := range s.Env {
		if e.ValueFrom == nil {
			set(e.Name, e.Value)
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		sec, err := get(ref.Name)
		if err != nil {
			return nil, err
		}
		v, ok := sec.Data[ref.Key]
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

// readSecret gets one Secret from the API server (no cache: the agent watches no Secrets) and
// refuses one not labelled for agents.
func readSecret(ctx context.Context, env *Env, name string) (*corev1.Secret, error) {
	if env.Client == nil {
		return nil, fmt.Errorf("reading Secret %s/%s: this agent has no cluster client to read it with", SecretNamespace, name)
	}
	sec := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: SecretNamespace, Name: name}, sec); err != nil {
		return nil, fmt.Errorf("reading Secret %s/%s for the script's environment: %w", SecretNamespace, name, err)
	}
	if sec.Labels[LabelAgentReadable] != "true" {
		return nil, fmt.Errorf("refusing Secret %s/%s: it is not labelled %s=true, and scripts read only Secrets labelled for them", SecretNamespace, name, LabelAgentReadable)
	}
	return sec, nil
}
