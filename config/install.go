package config

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Manifests decodes the objects of the YAML files in fsys matching pattern.
func Manifests(fsys fs.FS, pattern string) ([]*unstructured.Unstructured, error) {
	files, err := fs.Glob(fsys, pattern)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", pattern, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no manifest matches %s", pattern)
	}
	var out []*unstructured.Unstructured
	for _, f := range files {
		data, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(string(data)), 4096)
		for {
			obj := map[string]any{}
			if err := d.Decode(&obj); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("decode %s: %w", f, err)
			}
			if len(obj) > 0 {
				out = append(out, &unstructured.Unstructured{Object: obj})
			}
		}
	}
	return out, nil
}

// Namespaces are the Namespaces a real install creates (config/manager): nodeops-system and
// nodeops-hooks, where hook Jobs run away from nodeops' own ServiceAccounts.
func Namespaces() ([]*unstructured.Unstructured, error) {
	objs, err := Manifests(Manager, "manager/manager.yaml")
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			out = append(out, o)
		}
	}
	return out, nil
}

// RBAC are the Namespaces, ServiceAccounts, roles and bindings of a real install's manager and
// agent (config/manager, config/rbac/role.yaml, config/agent), without their Deployment and
// DaemonSet; the Namespaces come first, as the Roles in them need them.
func RBAC() ([]*unstructured.Unstructured, error) {
	out, err := Namespaces()
	if err != nil {
		return nil, err
	}
	for _, m := range []struct {
		fsys    fs.FS
		pattern string
	}{{Manager, "manager/manager.yaml"}, {Manager, "rbac/role.yaml"}, {Agent, "agent/daemonset.yaml"}} {
		objs, err := Manifests(m.fsys, m.pattern)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			switch o.GetKind() {
			case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
				out = append(out, o)
			}
		}
	}
	return out, nil
}

// statusProbe names the NodeTask InstallAdmission makes to see nodeops-manager-nodetask-status
// enforced (only an update of a stored task reaches it): a task of no node, which no agent serves,
// deleted before InstallAdmission returns.
const statusProbe = "nodeops-admission-probe-status"

// InstallAdmission creates config/admission's policies and bindings, then waits until the API
// server enforces each: it loads them asynchronously, so a test that wrote right after creating
// them could pass unconfined. cfg reaches the API server as an administrator.
func InstallAdmission(ctx context.Context, cfg *rest.Config, c client.Client) error {
	objs, err := Manifests(Admission, "admission/*.yaml")
	if err != nil {
		return err
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			return fmt.Errorf("create %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	// Probes, each a dry run that the policy refuses once enforced: a NodeTask made by an
	// administrator; a ConfigMap written by a member of the agent group whose credentials name no node;
	// a pod and a Job in default made by the manager; a NodeTask's phase set by the manager.
	probe := rest.CopyConfig(cfg)
	probe.Impersonate = rest.ImpersonationConfig{UserName: "nodeops-admission-probe", Groups: []string{"system:masters", "nodeops.io:agents"}}
	pc, err := client.New(probe, client.Options{Scheme: c.Scheme()})
	if err != nil {
		return fmt.Errorf("probe client: %w", err)
	}
	asManager := rest.CopyConfig(cfg)
	asManager.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:nodeops-system:nodeops-manager", Groups: []string{"system:masters"}}
	mc, err := client.New(asManager, client.Options{Scheme: c.Scheme()})
	if err != nil {
		return fmt.Errorf("probe client: %w", err)
	}
	probes := map[string]func() error{
		"nodeops-manager-pods": func() error {
			// Annotated as a mirror pod (which must name a node), which the ServiceAccount admission
			// plugin leaves without a ServiceAccount to look up: the namespace may have none yet.
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nodeops-admission-probe", Namespace: "default",
				Annotations: map[string]string{"kubernetes.io/config.mirror": "nodeops-admission-probe"}},
				Spec: corev1.PodSpec{NodeName: "nodeops-admission-probe", Containers: []corev1.Container{{Name: "c", Image: "probe"}}}}
			return mc.Create(ctx, pod, client.DryRunAll)
		},
		"nodeops-manager-jobs": func() error {
			job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "nodeops-admission-probe", Namespace: "default"},
				Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
					Containers: []corev1.Container{{Name: "c", Image: "probe"}}}}}}
			return mc.Create(ctx, job, client.DryRunAll)
		},
		"nodeops-nodetask-creation": func() error {
			t := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "nodeops.io/v1alpha1", "kind": "NodeTask",
				"metadata": map[string]any{"name": "nodeops-admission-probe"},
				"spec":     map[string]any{"nodeName": "probe", "commands": []any{map[string]any{"cordon": map[string]any{}}}},
			}}
			return c.Create(ctx, t, client.DryRunAll)
		},
		"nodeops-manager-nodetask-status": func() error {
			// The manager setting the probe task's phase (a dry run). The task says approvedCommands
			// (a typed client always sends it): the CRD's rule "approvedCommands cannot decrease"
			// fails on a task without it, and the API server validates the object before admission
			// policies see it, so without it the probe would never reach the policy.
			t := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "nodeops.io/v1alpha1", "kind": "NodeTask",
				"metadata": map[string]any{"name": statusProbe},
				"spec": map[string]any{"nodeName": statusProbe, "approvedCommands": int64(0),
					"commands": []any{map[string]any{"cordon": map[string]any{}}}},
			}}
			if err := mc.Create(ctx, t); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
			return mc.Status().Patch(ctx, t, client.RawPatch(types.MergePatchType, []byte(`{"status":{"phase":"Failed"}}`)), client.DryRunAll)
		},
		"nodeops-agent-confinement": func() error {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "nodeops-admission-probe", Namespace: "default"}}
			return pc.Create(ctx, cm, client.DryRunAll)
		},
	}
	defer func() {
		t := &unstructured.Unstructured{}
		t.SetAPIVersion("nodeops.io/v1alpha1")
		t.SetKind("NodeTask")
		t.SetName(statusProbe)
		_ = c.Delete(context.WithoutCancel(ctx), t) // the status probe's task, if it was made
	}()
	for name, p := range probes {
		// last is the probe's last answer before the deadline (the one at the deadline is only
		// the deadline): what kept it from reaching the policy.
		var last error
		for {
			err := p()
			if err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+name+"'") {
				break
			}
			if ctx.Err() != nil {
				if last == nil {
					return fmt.Errorf("admission policy %s not enforced yet (no probe answered): %w", name, ctx.Err())
				}
				return fmt.Errorf("admission policy %s not enforced yet (last probe: %w): %w", name, last, ctx.Err())
			}
			last = err
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}
