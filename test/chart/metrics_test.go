package chart

import (
	"regexp"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodeops/nodeops/internal/metrics"
)

// TestMetrics: by default the manager serves its authenticated endpoint behind a Service; a
// ServiceMonitor scrapes it over HTTPS with Prometheus' token, and readers are bound to the role.
func TestMetrics(t *testing.T) {
	t.Parallel()
	timed(t)
	objs := helmTemplate(t)
	m := container(t, typed[appsv1.Deployment](t, objs, "Deployment", "nodeops-manager").Spec.Template.Spec, "manager")
	svc := typed[corev1.Service](t, objs, "Service", "nodeops-manager-metrics")
	if !slices.Contains(m.Args, "--metrics-bind-address=:8443") || !hasPort(m, "metrics", 8443) ||
		len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 8443 || svc.Spec.Ports[0].TargetPort.StrVal != "metrics" {
		t.Errorf("metrics: manager args %v, ports %+v, Service ports %+v; want :8443 served and exposed", m.Args, m.Ports, svc.Spec.Ports)
	}
	reader := typed[rbacv1.ClusterRole](t, objs, "ClusterRole", "nodeops-metrics-reader")
	if len(reader.Rules) != 1 || !slices.Equal(reader.Rules[0].NonResourceURLs, []string{"/metrics"}) || !slices.Equal(reader.Rules[0].Verbs, []string{"get"}) {
		t.Errorf("nodeops-metrics-reader rules %+v, want get /metrics", reader.Rules)
	}
	for _, k := range [][2]string{{"ServiceMonitor", "nodeops-manager"}, {"PrometheusRule", "nodeops-manager"}, {"ClusterRoleBinding", "nodeops-metrics-reader"}} {
		if find(objs, k[0], k[1]) != nil {
			t.Errorf("the defaults render %s %s", k[0], k[1])
		}
	}

	objs = helmTemplate(t, "--set", "metrics.enabled=false")
	m = container(t, typed[appsv1.Deployment](t, objs, "Deployment", "nodeops-manager").Spec.Template.Spec, "manager")
	if !slices.Contains(m.Args, "--metrics-bind-address=0") || find(objs, "Service", "nodeops-manager-metrics") != nil {
		t.Errorf("metrics.enabled=false: manager args %v, metrics Service rendered %v", m.Args, find(objs, "Service", "nodeops-manager-metrics") != nil)
	}

	objs = helmTemplate(t, "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.labels.release=prom",
		"--set", "metrics.readers[0].name=prometheus-k8s", "--set", "metrics.readers[0].namespace=monitoring")
	sm := find(objs, "ServiceMonitor", "nodeops-manager")
	if sm == nil {
		t.Fatal("no ServiceMonitor")
	}
	if sm.GetLabels()["release"] != "prom" {
		t.Errorf("ServiceMonitor labels %v lack release=prom", sm.GetLabels())
	}
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(endpoints) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v", endpoints)
	}
	ep := endpoints[0].(map[string]any)
	if ep["scheme"] != "https" || ep["port"] != "metrics" || ep["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
		t.Errorf("ServiceMonitor endpoint %v: want https on port metrics with the ServiceAccount token", ep)
	}
	b := typed[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding", "nodeops-metrics-reader")
	if b.RoleRef.Name != "nodeops-metrics-reader" || len(b.Subjects) != 1 || b.Subjects[0].Name != "prometheus-k8s" || b.Subjects[0].Namespace != "monitoring" {
		t.Errorf("reader binding %+v", b)
	}
}

// TestPrometheusRule: the alerts the issue asks for are there, with their thresholds, and every
// series an expression names is one the manager serves: its own (internal/metrics, as the
// collector describes them), controller-runtime's, or Prometheus' up.
func TestPrometheusRule(t *testing.T) {
	t.Parallel()
	timed(t)
	objs := helmTemplate(t, "--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.prometheusRule.certificateExpiryDays=14")
	rule := find(objs, "PrometheusRule", "nodeops-manager")
	if rule == nil {
		t.Fatal("no PrometheusRule")
	}
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	exprs := map[string]string{}
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			r := r.(map[string]any)
			exprs[r["alert"].(string)] = r["expr"].(string)
		}
	}
	for alert, want := range map[string]string{
		"NodeOpsOperationBlocked":        `time() - max by (operation) (nodeops_operation_blocked_since_timestamp_seconds{job="nodeops-manager-metrics", namespace="nodeops-system"}) > 1800`,
		"NodeOpsCertificateExpiringSoon": `min by (node, certificate) (nodeops_certificate_expiry_timestamp_seconds{job="nodeops-manager-metrics", namespace="nodeops-system"}) - time() < 1209600`,
	} {
		if exprs[alert] != want {
			t.Errorf("alert %s: expr %q, want %q", alert, exprs[alert], want)
		}
	}

	served := servedSeries()
	selector := regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{`)
	for alert, expr := range exprs {
		names := selector.FindAllStringSubmatch(expr, -1)
		if len(names) == 0 {
			t.Errorf("alert %s: no series selector found in %q", alert, expr)
		}
		for _, n := range names {
			if !served[n[1]] {
				t.Errorf("alert %s refers to %s, which nothing serves", alert, n[1])
			}
		}
	}
}

// servedSeries are the series names the manager's endpoint exposes or Prometheus adds.
func servedSeries() map[string]bool {
	out := map[string]bool{
		"up": true, // Prometheus' own, per target
		// controller-runtime's, registered on the same registry by every controller.
		"controller_runtime_reconcile_errors_total": true,
	}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	ch := make(chan *prometheus.Desc, 32)
	metrics.NewManager(nil).Describe(ch)
	close(ch)
	for d := range ch {
		name := fqName.FindStringSubmatch(d.String())[1]
		out[name] = true
		if name == metrics.CommandDuration {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[name+s] = true
			}
		}
	}
	return out
}
