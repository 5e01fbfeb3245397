package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func typed[T any](t *testing.T, objs []*unstructured.Unstructured, kind, name string) *T {
	t.Helper()
	o := find(objs, kind, name)
	if o == nil {
		t.Fatalf("no %s %s rendered", kind, name)
	}
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out); err != nil {
		t.Fatalf("%s %s: %v", kind, name, err)
	}
	return out
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

func TestHelmLintStrict(t *testing.T) {
	t.Parallel()
	timed(t)
	mustRun(t, nil, "helm", "lint", "--strict", chartDir)
	mustRun(t, nil, "helm", "lint", "--strict", chartDir, "-f", filepath.Join(chartDir, "examples", "wasm-shims-values.yaml"))
	mustRun(t, nil, "helm", "lint", "--strict", chartDir, "--set", "agent.mode=Job", "--namespace", "nodeops-system")
}

// TestDefaults: what a person relies on after a plain helm install.
func TestDefaults(t *testing.T) {
	t.Parallel()
	timed(t)
	objs := helmTemplate(t)

	d := typed[appsv1.Deployment](t, objs, "Deployment", "nodeops-manager")
	if d.Namespace != "nodeops-system" {
		t.Errorf("manager namespace %q, want the release namespace nodeops-system", d.Namespace)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("manager replicas %v, want 2", d.Spec.Replicas)
	}
	m := container(t, d.Spec.Template.Spec, "manager")
	for _, arg := range []string{"--leader-elect=true", "--leader-election-namespace=nodeops-system", "--agent-mode=DaemonSet", "--metrics-bind-address=:8443"} {
		if !slices.Contains(m.Args, arg) {
			t.Errorf("manager args %v lack %s", m.Args, arg)
		}
	}
	if m.Image != "ghcr.io/nodeops/manager:0.1.0" {
		t.Errorf("manager image %q, want the repository at the chart's appVersion", m.Image)
	}
	if d.Spec.Template.Spec.Affinity == nil || d.Spec.Template.Spec.Affinity.PodAntiAffinity == nil {
		t.Errorf("manager replicas are not spread over nodes: %+v", d.Spec.Template.Spec.Affinity)
	}

	pdb := typed[policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget", "nodeops-manager")
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("PDB minAvailable %v, want 1", pdb.Spec.MinAvailable)
	}
	if !reflect.DeepEqual(pdb.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels) {
		t.Errorf("PDB selects %v, the Deployment %v", pdb.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels)
	}

	ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet", "nodeops-agent")
	ps := ds.Spec.Template.Spec
	if len(ps.Tolerations) != 1 || ps.Tolerations[0].Operator != corev1.TolerationOpExists || ps.Tolerations[0].Key != "" {
		t.Errorf("agent tolerations %+v, want one {operator: Exists} (it must reach control planes)", ps.Tolerations)
	}
	if ps.PriorityClassName != "system-node-critical" {
		t.Errorf("agent priorityClassName %q", ps.PriorityClassName)
	}
	if ps.ServiceAccountName != "nodeops-agent" || !ps.HostPID {
		t.Errorf("agent serviceAccount %q hostPID %v", ps.ServiceAccountName, ps.HostPID)
	}
	a := container(t, ps, "agent")
	if a.SecurityContext == nil || a.SecurityContext.Privileged == nil || !*a.SecurityContext.Privileged {
		t.Errorf("agent is not privileged")
	}
	if a.Image != "ghcr.io/nodeops/agent:0.1.0" {
		t.Errorf("agent image %q", a.Image)
	}

	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			continue
		}
		l := o.GetLabels()
		for _, k := range []string{"app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of"} {
			if l[k] == "" {
				t.Errorf("%s has no label %s", key(o), k)
			}
		}
		if l["app.kubernetes.io/name"] == "" {
			t.Errorf("%s has no label app.kubernetes.io/name", key(o))
		}
	}
	// The one Service is the manager's metrics endpoint (TestMetrics).
	for _, kind := range []string{"ServiceMonitor", "PrometheusRule", "Service", "NodeProfile"} {
		for _, o := range objs {
			if o.GetKind() == kind && key(o) != "Service/nodeops-system/nodeops-manager-metrics" {
				t.Errorf("%s rendered by default", key(o))
			}
		}
	}
}

func TestJobMode(t *testing.T) {
	t.Parallel()
	timed(t)
	objs := helmTemplate(t, "--set", "agent.mode=Job", "--set", "image.agent.tag=v9.9.9")
	if ds := find(objs, "DaemonSet", "nodeops-agent"); ds != nil {
		t.Errorf("agent.mode=Job still renders the DaemonSet")
	}
	// The agent Jobs run as nodeops-agent: its ServiceAccount and RBAC stay.
	for _, k := range [][2]string{{"ServiceAccount", "nodeops-agent"}, {"ClusterRole", "nodeops-agent"}, {"ClusterRoleBinding", "nodeops-agent"}} {
		if find(objs, k[0], k[1]) == nil {
			t.Errorf("agent.mode=Job renders no %s %s", k[0], k[1])
		}
	}
	d := typed[appsv1.Deployment](t, objs, "Deployment", "nodeops-manager")
	m := container(t, d.Spec.Template.Spec, "manager")
	for _, arg := range []string{"--agent-mode=Job", "--agent-image=ghcr.io/nodeops/agent:v9.9.9"} {
		if !slices.Contains(m.Args, arg) {
			t.Errorf("manager args %v lack %s", m.Args, arg)
		}
	}

	out, err := run(t, nil, "helm", "template", "nodeops", chartDir, "--namespace", "ops", "--set", "agent.mode=Job")
	if err == nil || !strings.Contains(out, "agent.mode=Job needs the release namespace nodeops-system") {
		t.Errorf("agent.mode=Job outside nodeops-system: err %v, output:\n%s", err, out)
	}
}

func TestDigestWinsOverTag(t *testing.T) {
	t.Parallel()
	timed(t)
	objs := helmTemplate(t, "--set", "image.manager.digest="+digest, "--set", "image.manager.tag=v1",
		"--set", "image.agent.repository=registry.invalid/agent", "--set", "image.agent.digest="+digest,
		"--set", "image.agent.pullPolicy=Always", "--set", "imagePullSecrets[0].name=pull")
	d := typed[appsv1.Deployment](t, objs, "Deployment", "nodeops-manager")
	if got, want := container(t, d.Spec.Template.Spec, "manager").Image, "ghcr.io/nodeops/manager@"+digest; got != want {
		t.Errorf("manager image %q, want %q", got, want)
	}
	ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet", "nodeops-agent")
	a := container(t, ds.Spec.Template.Spec, "agent")
	if want := "registry.invalid/agent@" + digest; a.Image != want || a.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("agent image %q %s, want %q Always", a.Image, a.ImagePullPolicy, want)
	}
	for _, ps := range []corev1.PodSpec{d.Spec.Template.Spec, ds.Spec.Template.Spec} {
		if len(ps.ImagePullSecrets) != 1 || ps.ImagePullSecrets[0].Name != "pull" {
			t.Errorf("pod imagePullSecrets %v", ps.ImagePullSecrets)
		}
	}
	// Agent Jobs get theirs from the ServiceAccount, the secret holder pods from nodeops-installer's.
	for _, name := range []string{"nodeops-agent", "nodeops-installer"} {
		sa := typed[corev1.ServiceAccount](t, objs, "ServiceAccount", name)
		if len(sa.ImagePullSecrets) != 1 || sa.ImagePullSecrets[0].Name != "pull" {
			t.Errorf("%s ServiceAccount imagePullSecrets %v", name, sa.ImagePullSecrets)
		}
	}
	// The manager builds the secret holder pods with the agent's image in DaemonSet mode too.
	for _, want := range []string{"--agent-image=registry.invalid/agent@" + digest, "--agent-image-pull-policy=Always"} {
		if args := container(t, d.Spec.Template.Spec, "manager").Args; !slices.Contains(args, want) {
			t.Errorf("manager args %v lack %s", args, want)
		}
	}

	objs = helmTemplate(t, "--set", "agent.mode=Job", "--set", "image.agent.digest="+digest)
	m := container(t, typed[appsv1.Deployment](t, objs, "Deployment", "nodeops-manager").Spec.Template.Spec, "manager")
	if want := "--agent-image=ghcr.io/nodeops/agent@" + digest; !slices.Contains(m.Args, want) {
		t.Errorf("manager args %v lack %s", m.Args, want)
	}
}

func hasPort(c corev1.Container, name string, port int32) bool {
	for _, p := range c.Ports {
		if p.Name == name && p.ContainerPort == port {
			return true
		}
	}
	return false
}

// TestProfiles: the example values (the WebAssembly shims) become a NodeProfile, KWasm's
// autoProvision switch included, and more can be set.
func TestProfiles(t *testing.T) {
	t.Parallel()
	timed(t)
	objs := helmTemplate(t, "-f", filepath.Join(chartDir, "examples", "wasm-shims-values.yaml"),
		"--set", "profiles[1].name=other", "--set", "profiles[1].spec.trigger.annotation=example.com/other=true")
	p := find(objs, "NodeProfile", "wasm-shims")
	if p == nil {
		t.Fatalf("no NodeProfile wasm-shims")
	}
	if auto, _, _ := unstructured.NestedBool(p.Object, "spec", "autoProvision"); !auto {
		t.Errorf("wasm-shims autoProvision is not true")
	}
	install, _, _ := unstructured.NestedSlice(p.Object, "spec", "install")
	rcs, _, _ := unstructured.NestedSlice(p.Object, "spec", "runtimeClasses")
	if len(install) != 7 || len(rcs) != 3 {
		t.Errorf("wasm-shims has %d install commands and %d RuntimeClasses, want 7 and 3 as in config/samples", len(install), len(rcs))
	}
	if find(objs, "NodeProfile", "other") == nil {
		t.Errorf("no NodeProfile other")
	}

	// The example is the sample's spec with autoProvision added, not a copy left to drift.
	sample, err := os.ReadFile(filepath.Join(repoRoot, "config", "samples", "wasm-shims.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := decode(string(sample))
	if err != nil {
		t.Fatal(err)
	}
	got := p.Object["spec"].(map[string]any)
	delete(got, "autoProvision")
	if !reflect.DeepEqual(got, want[0].Object["spec"]) {
		t.Errorf("examples/wasm-shims-values.yaml's spec differs from config/samples/wasm-shims.yaml's (besides autoProvision)")
	}
}

// TestSchemaRefusesBadValues: a wrong value fails with helm's message naming it.
func TestSchemaRefusesBadValues(t *testing.T) {
	t.Parallel()
	timed(t)
	for _, c := range []struct {
		flags []string
		want  []string
	}{
		{[]string{"--set", "agent.mode=Foo"}, []string{"agent/mode", "DaemonSet", "Job"}},
		{[]string{"--set", "image.manager.pullPolicy=Sometimes"}, []string{"image/manager/pullPolicy", "IfNotPresent"}},
		{[]string{"--set-string", "manager.replicas=2"}, []string{"manager/replicas", "integer"}},
		{[]string{"--set", "image.agent.repository="}, []string{"image/agent/repository"}},
		{[]string{"--set", "image.manager.digest=latest"}, []string{"image/manager/digest"}},
		{[]string{"--set", "agent.mdoe=Job"}, []string{"mdoe"}},
		{[]string{"--set", "profiles[0].spec.autoProvision=true"}, []string{"profiles/0", "name"}},
		// The templates' own checks, for what a schema cannot say.
		{[]string{"--set", "manager.leaderElect=false"}, []string{"manager.leaderElect=false needs manager.replicas=1"}},
		{[]string{"--set", "manager.replicas=1"}, []string{"manager.podDisruptionBudget.minAvailable (1) must be below manager.replicas (1)"}},
		{[]string{"--set", "metrics.enabled=false", "--set", "metrics.serviceMonitor.enabled=true"}, []string{"need metrics.enabled=true"}},
		{[]string{"--set", "metrics.prometheusRule.blockedMinutes=0"}, []string{"metrics/prometheusRule/blockedMinutes"}},
		{[]string{"--set", "metrics.readers[0].name=prometheus"}, []string{"metrics/readers/0", "namespace"}},
	} {
		args := append([]string{"template", "nodeops", chartDir, "--namespace", "nodeops-system"}, c.flags...)
		out, err := run(t, nil, "helm", args...)
		if err == nil {
			t.Errorf("helm template %v succeeded", c.flags)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("helm template %v: message lacks %q:\n%s", c.flags, w, out)
			}
		}
	}
	// One replica without a PDB, and without leader election, is allowed.
	helmTemplate(t, "--set", "manager.replicas=1", "--set", "manager.podDisruptionBudget.enabled=false", "--set", "manager.leaderElect=false")
}

// TestChartMatchesConfig: the chart and config/ (kustomize) install the same objects, with the
// same RBAC, and the chart's CRDs are config/crd's; what differs is listed and explained.
func TestChartMatchesConfig(t *testing.T) {
	t.Parallel()
	timed(t)
	chart := helmTemplate(t)
	kust, err := decode(mustRun(t, nil, "kubectl", "kustomize", filepath.Join(repoRoot, "config", "default")))
	if err != nil {
		t.Fatal(err)
	}
	keys := func(objs []*unstructured.Unstructured, skip ...string) []string {
		var out []string
		for _, o := range objs {
			if !slices.Contains(skip, o.GetKind()) {
				out = append(out, key(o))
			}
		}
		sort.Strings(out)
		return out
	}
	// The chart leaves the release namespace to --create-namespace (it renders the hook namespace,
	// nodeops-hooks, as config/default does) and adds the manager's PDB and its metrics certificate
	// (config/default leaves the manager its self-signed one).
	release := func(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
		return slices.DeleteFunc(slices.Clone(objs), func(o *unstructured.Unstructured) bool {
			return o.GetKind() == "Namespace" && o.GetName() == "nodeops-system"
		})
	}
	if c, k := keys(chart, "PodDisruptionBudget", "Secret"), keys(release(kust)); !reflect.DeepEqual(c, k) {
		t.Errorf("the chart renders\n  %v\nconfig/default\n  %v", c, k)
	}
	for _, o := range kust {
		switch o.GetKind() {
		case "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			// The chart renders config/admission's files (copied by make generate): the same spec.
			if c := find(chart, o.GetKind(), o.GetName()); c != nil && !reflect.DeepEqual(c.Object["spec"], o.Object["spec"]) {
				t.Errorf("%s: the chart's spec differs from config/'s: run make generate", key(o))
			}
		case "ClusterRole", "Role":
			// A Role's rules have a ClusterRole's shape.
			want := typed[rbacv1.ClusterRole](t, []*unstructured.Unstructured{o}, o.GetKind(), o.GetName())
			for _, c := range chart {
				if key(c) == key(o) {
					got := typed[rbacv1.ClusterRole](t, []*unstructured.Unstructured{c}, c.GetKind(), c.GetName())
					if !reflect.DeepEqual(got.Rules, want.Rules) {
						t.Errorf("%s: the chart's rules differ from config/'s:\n%v\n%v", key(o), got.Rules, want.Rules)
					}
					if g, w := aggregation(c), aggregation(o); !reflect.DeepEqual(g, w) {
						t.Errorf("%s: the chart aggregates it into %v, config/ into %v", key(o), g, w)
					}
				}
			}
		}
	}

	files, err := filepath.Glob(filepath.Join(repoRoot, "config", "crd", "nodeops.io_*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in config/crd: %v", err)
	}
	copies, _ := filepath.Glob(filepath.Join(chartDir, "crds", "*.yaml"))
	if len(copies) != len(files) {
		t.Errorf("charts/nodeops/crds has %d files, config/crd %d: run make generate", len(copies), len(files))
	}
	for _, f := range files {
		a, _ := os.ReadFile(f)
		b, err := os.ReadFile(filepath.Join(chartDir, "crds", filepath.Base(f)))
		if err != nil || string(a) != string(b) {
			t.Errorf("charts/nodeops/crds/%s is not config/crd's: run make generate", filepath.Base(f))
		}
	}
	var crds int
	for _, o := range kust {
		if o.GetKind() == "CustomResourceDefinition" {
			crds++
		}
	}
	if crds != len(files) {
		t.Errorf("config/default renders %d CRDs, config/crd has %d: list them all in config/crd/kustomization.yaml", crds, len(files))
	}
}

// TestOtherNamespace: in DaemonSet mode the release may live elsewhere; the leader election Lease,
// its Role and every subject follow the release namespace, the kubeadm-config Role stays in
// kube-system and the hook Jobs' Role in nodeops-hooks.
func TestOtherNamespace(t *testing.T) {
	t.Parallel()
	timed(t)
	out := mustRun(t, nil, "helm", "template", "nodeops", chartDir, "--namespace", "ops")
	objs, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	ns := map[string][]string{}
	for _, o := range objs {
		if o.GetKind() == "Role" || o.GetKind() == "RoleBinding" {
			ns[o.GetKind()] = append(ns[o.GetKind()], o.GetNamespace())
		}
		if strings.HasSuffix(o.GetKind(), "Binding") {
			b := typed[rbacv1.RoleBinding](t, []*unstructured.Unstructured{o}, o.GetKind(), o.GetName())
			for _, s := range b.Subjects {
				if s.Namespace != "ops" {
					t.Errorf("%s binds %s in %q, want ops", key(o), s.Name, s.Namespace)
				}
			}
		}
	}
	for _, kind := range []string{"Role", "RoleBinding"} {
		sort.Strings(ns[kind])
		if !reflect.DeepEqual(slices.Compact(ns[kind]), []string{"kube-system", "nodeops-hooks", "ops"}) {
			t.Errorf("%ss in %v, want kube-system, nodeops-hooks and ops", kind, ns[kind])
		}
	}
	// The admission policies name the ServiceAccounts of the release namespace.
	for _, name := range []string{"nodeops-agent-confinement", "nodeops-nodetask-creation", "nodeops-manager-pods", "nodeops-manager-nodetask-status"} {
		p := find(objs, "ValidatingAdmissionPolicy", name)
		if p == nil {
			t.Errorf("no ValidatingAdmissionPolicy %s", name)
			continue
		}
		conds, _, _ := unstructured.NestedSlice(p.Object, "spec", "matchConditions")
		expr := fmt.Sprint(conds)
		if !strings.Contains(expr, "system:serviceaccount:ops:") || strings.Contains(expr, "nodeops-system") {
			t.Errorf("%s matches %s, want the ServiceAccounts of namespace ops", name, expr)
		}
	}
	m := container(t, typed[appsv1.Deployment](t, objs, "Deployment", "nodeops-manager").Spec.Template.Spec, "manager")
	if !slices.Contains(m.Args, "--leader-election-namespace=ops") {
		t.Errorf("manager args %v", m.Args)
	}
}

// aggregation is the aggregate-to-* labels of a role, which say into which of Kubernetes' roles it goes.
func aggregation(o *unstructured.Unstructured) map[string]string {
	out := map[string]string{}
	for k, v := range o.GetLabels() {
		if strings.HasPrefix(k, "rbac.authorization.k8s.io/aggregate-to-") {
			out[k] = v
		}
	}
	return out
}
