package chart

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/internal/testutil"
)

// leftovers are the kinds the chart creates besides CRDs; none may remain after helm uninstall.
var leftovers = []schema.GroupVersionKind{
	{Group: "apps", Version: "v1", Kind: "Deployment"},
	{Group: "apps", Version: "v1", Kind: "DaemonSet"},
	{Version: "v1", Kind: "ServiceAccount"},
	{Version: "v1", Kind: "Service"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRoleBinding"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "RoleBinding"},
	{Group: "policy", Version: "v1", Kind: "PodDisruptionBudget"},
	{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "ValidatingAdmissionPolicy"},
	{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "ValidatingAdmissionPolicyBinding"},
	{Group: "nodeops.io", Version: "v1alpha1", Kind: "NodeProfile"},
}

var crdNames = []string{"nodeoperations.nodeops.io", "nodeprofiles.nodeops.io", "nodetasks.nodeops.io"}

// TestInstallUpgradeUninstall installs the chart with helm on a real API server, upgrades it, uninstalls
// it, then applies config/default with kubectl. Only etcd and kube-apiserver run: objects are
// created and validated, no pod runs.
//
// testutil.Start always installs CRDs, so it is asked for one (NodeOperation): helm then creates the
// other two from the chart's crds/ (proving they install) and skips the one already there, which is
// what helm does on a cluster where the CRDs were installed before.
func TestInstallUpgradeUninstall(t *testing.T) {
	t.Parallel()
	timed(t)
	ctx := context.Background()
	env, err := testutil.Start("nodeoperations")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	kubeconfig, err := env.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := env.Client
	helm := func(args ...string) string {
		t.Helper()
		return mustRun(t, nil, "helm", append(args, "--kubeconfig", kubeconfig)...)
	}
	t.Logf("API server up after %s", time.Since(started).Round(time.Millisecond))

	out := helm("install", "nodeops", chartDir, "--namespace", "nodeops-system", "--create-namespace",
		"-f", filepath.Join(chartDir, "examples", "wasm-shims-values.yaml"))
	for _, want := range []string{"is installed in nodeops-system", "Profiles installed: wasm-shims", "--set profiles=null"} {
		if !strings.Contains(out, want) {
			t.Errorf("helm install's notes lack %q:\n%s", want, out)
		}
	}
	for _, name := range crdNames {
		if err := c.Get(ctx, client.ObjectKey{Name: name}, object("apiextensions.k8s.io", "v1", "CustomResourceDefinition")); err != nil {
			t.Errorf("CRD %s after helm install: %v", name, err)
		}
	}
	d := &appsv1.Deployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "nodeops-system", Name: "nodeops-manager"}, d); err != nil {
		t.Fatalf("manager Deployment after helm install: %v", err)
	}
	if *d.Spec.Replicas != 2 {
		t.Errorf("manager replicas %d after install, want 2", *d.Spec.Replicas)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "nodeops-system", Name: "nodeops-agent"}, &appsv1.DaemonSet{}); err != nil {
		t.Errorf("agent DaemonSet after helm install: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: "wasm-shims"}, object("nodeops.io", "v1alpha1", "NodeProfile")); err != nil {
		t.Errorf("NodeProfile wasm-shims from profiles after helm install: %v", err)
	}

	// A value change reaches the Deployment; Job mode removes the DaemonSet.
	helm("upgrade", "nodeops", chartDir, "--namespace", "nodeops-system", "--reuse-values",
		"--set", "manager.replicas=3", "--set", "agent.mode=Job", "--set", "image.agent.tag=v2")
	if err := c.Get(ctx, client.ObjectKey{Namespace: "nodeops-system", Name: "nodeops-manager"}, d); err != nil {
		t.Fatal(err)
	}
	if *d.Spec.Replicas != 3 {
		t.Errorf("manager replicas %d after helm upgrade --set manager.replicas=3", *d.Spec.Replicas)
	}
	if args := d.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--agent-mode=Job") || !slices.Contains(args, "--agent-image=ghcr.io/nodeops/agent:v2") {
		t.Errorf("manager args after upgrade to agent.mode=Job: %v", args)
	}
	err = c.Get(ctx, client.ObjectKey{Namespace: "nodeops-system", Name: "nodeops-agent"}, &appsv1.DaemonSet{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("agent DaemonSet after helm upgrade to agent.mode=Job: %v, want NotFound", err)
	}

	// The administrator's signing Secret in the hook namespace (docs/how-to/hooks.md).
	signing := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "nodeops-hooks", Name: "nodeops-hook-signing"}, Data: map[string][]byte{"events": []byte("k")}}
	if err := c.Create(ctx, signing); err != nil {
		t.Fatalf("signing Secret in nodeops-hooks after helm install: %v", err)
	}

	uninstall := func(when string) {
		t.Helper()
		helm("uninstall", "nodeops", "--namespace", "nodeops-system")
		testutil.Eventually(t, 30*time.Second, "no nodeops object left after helm uninstall"+when, func() error {
			var left []string
			for _, gvk := range leftovers {
				list := &unstructured.UnstructuredList{}
				list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
				if err := c.List(ctx, list); err != nil {
					return err
				}
				for _, o := range list.Items {
					if strings.HasPrefix(o.GetName(), "nodeops") || o.GetLabels()["app.kubernetes.io/part-of"] == "nodeops" || o.GetName() == "wasm-shims" {
						left = append(left, gvk.Kind+"/"+o.GetNamespace()+"/"+o.GetName())
					}
				}
			}
			if len(left) > 0 {
				return &leftError{left}
			}
			return nil
		})
	}
	uninstall("")
	for _, name := range crdNames {
		if err := c.Get(ctx, client.ObjectKey{Name: name}, object("apiextensions.k8s.io", "v1", "CustomResourceDefinition")); err != nil {
			t.Errorf("CRD %s after helm uninstall (helm keeps CRDs): %v", name, err)
		}
	}

	// helm keeps the hook namespace, as it keeps the CRDs: deleting it would delete the
	// administrator's Secret, and a namespace left terminating would refuse the next install.
	ns := &corev1.Namespace{}
	if err := c.Get(ctx, client.ObjectKey{Name: "nodeops-hooks"}, ns); err != nil || ns.DeletionTimestamp != nil {
		t.Errorf("namespace nodeops-hooks after helm uninstall: %v (deleting since %v), want kept", err, ns.DeletionTimestamp)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(signing), &corev1.Secret{}); err != nil {
		t.Errorf("signing Secret after helm uninstall: %v, want kept", err)
	}

	// Installing again takes the kept namespace back (helm's ownership annotations are still on it).
	helm("install", "nodeops", chartDir, "--namespace", "nodeops-system")
	if err := c.Get(ctx, client.ObjectKey{Namespace: "nodeops-hooks", Name: "nodeops-manager"}, &rbacv1.RoleBinding{}); err != nil {
		t.Errorf("the manager's RoleBinding in nodeops-hooks after installing again: %v", err)
	}
	uninstall(" again")

	// The kustomize tree applies to the same server (CRDs there, namespace too: the apply takes both).
	yaml := mustRun(t, nil, "kubectl", "kustomize", filepath.Join(repoRoot, "config", "default"))
	mustRun(t, strings.NewReader(yaml), "kubectl", "apply", "--kubeconfig", kubeconfig, "--server-side", "--field-manager", "nodeops-test", "-f", "-")
	if err := c.Get(ctx, client.ObjectKey{Namespace: "nodeops-system", Name: "nodeops-agent"}, &appsv1.DaemonSet{}); err != nil {
		t.Errorf("agent DaemonSet after applying config/default: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "nodeops-system", Name: "nodeops-manager"}, d); err != nil {
		t.Errorf("manager Deployment after applying config/default: %v", err)
	}
}

func object(group, version, kind string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(schema.GroupVersionKind{Group: group, Version: version, Kind: kind})
	return u
}

type leftError struct{ left []string }

func (e *leftError) Error() string { return "left: " + strings.Join(e.left, ", ") }
