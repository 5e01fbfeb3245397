package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/testutil"
)

// The manager, as main runs it, serves its metrics only to a token allowed /metrics by the
// ClusterRole config/rbac installs, and its series follow an operation as tasks run.
func TestMetricsEndpointIsAuthenticatedAndFollowsAnOperation(t *testing.T) {
	env, ctx, kubeconfig := startAPIServer(t)
	// The manager's namespace, which every install has: its budget ledger lives there.
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeops-system"}}); err != nil {
		t.Fatal(err)
	}
	addr := freeAddress(t)
	mgrCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(mgrCtx, []string{"--kubeconfig=" + kubeconfig, "--metrics-bind-address=" + addr,
			"--health-probe-bind-address=0", "--leader-elect=false"})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	reader, stranger := serviceAccountTokens(t, ctx, env)
	url := "https://" + addr + "/metrics"
	testutil.Eventually(t, time.Minute, "the metrics endpoint refuses a scrape without a token", func() error {
		return expectStatus(url, "", http.StatusUnauthorized)
	})
	if err := expectStatus(url, stranger, http.StatusForbidden); err != nil {
		t.Errorf("a ServiceAccount not bound to nodeops-metrics-reader: %v", err)
	}

	for _, n := range []string{"metrics-a", "metrics-b"} {
		createReadyNode(t, ctx, env, n)
	}
	one := intstr.FromInt32(1)
	op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: "metrics-op"}, Spec: v1alpha1.NodeOperationSpec{
		NodeSelector:   &metav1.LabelSelector{MatchLabels: map[string]string{"nodeops.test/metrics": "true"}},
		MaxUnavailable: &one,
		Custom: &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{{Name: "all",
			Commands: []v1alpha1.Command{{Wait: &v1alpha1.WaitCommand{}}}}}},
	}}
	if err := env.Client.Create(ctx, op); err != nil {
		t.Fatal(err)
	}
	group := `{group="all",operation="metrics-op"}`
	waitForSeries(t, url, reader, "the first task is created, its node counted against the budget", map[string]float64{
		`nodeops_operations{phase="Running"}`:                 1,
		`nodeops_tasks{phase="Pending"}`:                      1,
		"nodeops_group_unavailable_nodes" + group:             1,
		"nodeops_group_max_unavailable" + group:               1,
		`nodeops_command_duration_seconds_count{kind="wait"}`: -1,
	})

	agent := testutil.FakeAgent{Client: env.Client}
	if err := agent.RunAll(ctx, objname.TaskName("metrics-op", "all", "metrics-a")); err != nil {
		t.Fatal(err)
	}
	waitForSeries(t, url, reader, "the first task succeeded and the second was created", map[string]float64{
		`nodeops_tasks{phase="Succeeded"}`:                    1,
		`nodeops_tasks{phase="Pending"}`:                      1,
		`nodeops_command_duration_seconds_count{kind="wait"}`: 1,
		"nodeops_group_unavailable_nodes" + group:             1,
	})

	second := objname.TaskName("metrics-op", "all", "metrics-b")
	if err := agent.Begin(ctx, second, 0); err != nil {
		t.Fatal(err)
	}
	if err := agent.End(ctx, second, 0, false, "exit status 1"); err != nil {
		t.Fatal(err)
	}
	got := waitForSeries(t, url, reader, "the second task failed and the operation is Blocked", map[string]float64{
		`nodeops_operations{phase="Blocked"}`:                               1,
		`nodeops_operations{phase="Running"}`:                               0,
		`nodeops_tasks{phase="Failed"}`:                                     1,
		`nodeops_commands_failed_total{kind="wait",reason="CommandFailed"}`: 1,
		"nodeops_group_unavailable_nodes" + group:                           1,
	})
	since, ok := got[`nodeops_operation_blocked_since_timestamp_seconds{operation="metrics-op"}`]
	if !ok || since < float64(time.Now().Add(-time.Hour).Unix()) || since > float64(time.Now().Add(time.Minute).Unix()) {
		t.Errorf("blocked-since of metrics-op is %v (present %v), want about now", since, ok)
	}
	build := false
	for k, v := range got {
		build = build || strings.HasPrefix(k, `nodeops_build_info{goversion="`+runtime.Version()+`",`) && v == 1
	}
	if !build {
		t.Errorf("no nodeops_build_info of this Go version among %d series", len(got))
	}
}

// serviceAccountTokens returns a token of a ServiceAccount bound to config/rbac's
// nodeops-metrics-reader and one of a ServiceAccount bound to nothing, both from the API server's
// TokenRequest API.
func serviceAccountTokens(t *testing.T, ctx context.Context, env *testutil.Env) (reader, stranger string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", "metrics-reader.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.UnmarshalStrict(data, role); err != nil {
		t.Fatal(err)
	}
	const ns = "monitoring"
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "prometheus", Namespace: ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "stranger", Namespace: ns}},
		role,
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "prometheus-nodeops-metrics"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: ns}},
		},
	}
	for _, o := range objs {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		expiry := int64(3600)
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("TokenRequest for %s: %v", sa, err)
		}
		return tr.Status.Token
	}
	return token("prometheus"), token("stranger")
}

func createReadyNode(t *testing.T, ctx context.Context, env *testutil.Env, name string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"nodeops.test/metrics": "true"}}}
	if err := testutil.CreateNode(ctx, env.Client, n, true); err != nil {
		t.Fatal(err)
	}
}

// waitForSeries scrapes until every series in want has its value (-1: is absent), and returns the
// last scrape.
func waitForSeries(t *testing.T, url, token, what string, want map[string]float64) map[string]float64 {
	t.Helper()
	var got map[string]float64
	testutil.Eventually(t, time.Minute, what, func() error {
		var err error
		if got, err = scrape(url, token); err != nil {
			return err
		}
		for k, v := range want {
			g, ok := got[k]
			switch {
			case v < 0 && ok:
				return fmt.Errorf("%s = %v, want it absent", k, g)
			case v >= 0 && !ok:
				return fmt.Errorf("no series %s", k)
			case v >= 0 && g != v:
				return fmt.Errorf("%s = %v, want %v", k, g, v)
			}
		}
		return nil
	})
	return got
}

// scrape reads the endpoint as Prometheus does, into "name{label="value",...}" -> value, labels
// sorted by name; histograms as their _count and _sum.
func scrape(url, token string) (map[string]float64, error) {
	resp, err := get(url, token)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("scrape: %s: %s", resp.Status, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse the scrape: %w", err)
	}
	out := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			labels := labelString(m.GetLabel())
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				out[name+"_count"+labels] = float64(m.GetHistogram().GetSampleCount())
				out[name+"_sum"+labels] = m.GetHistogram().GetSampleSum()
			case dto.MetricType_COUNTER:
				out[name+labels] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[name+labels] = m.GetGauge().GetValue()
			}
		}
	}
	return out, nil
}

func labelString(labels []*dto.LabelPair) string {
	if len(labels) == 0 {
		return ""
	}
	parts := make([]string, 0, len(labels))
	for _, l := range labels { // the exposition sorts them by name
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func expectStatus(url, token string, want int) error {
	resp, err := get(url, token)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("scrape answered %s, want %d", resp.Status, want)
	}
	return nil
}

func get(url, token string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// The manager's certificate is self-signed (no --metrics-cert-dir); what is tested is who may read.
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed test certificate
	return c.Do(req)
}

// freeAddress is a loopback address with a port nothing listens on now.
func freeAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}
