package cli

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/plan"
)

var nodesOnce sync.Once

// planCluster: three control planes, three workers of which w-3 is NotReady, a v1.36.4 kubeadm-config.
func planCluster(t *testing.T) {
	nodesOnce.Do(func() {
		cp := map[string]string{plan.LabelControlPlane: ""}
		for _, n := range []string{"cp-2", "cp-1", "cp-3"} {
			createNode(t, n, cp, true)
		}
		createNode(t, "w-1", map[string]string{"pool": "blue"}, true)
		createNode(t, "w-2", map[string]string{"pool": "green"}, true)
		createNode(t, "w-3", map[string]string{"pool": "blue"}, false)
		createNode(t, "w-4", map[string]string{"pool": "blue"}, true)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kubeadm-config"},
			Data: map[string]string{"ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: v1.36.4\n"}}
		if err := k8s.Create(ctx(t), cm); err != nil {
			t.Fatal(err)
		}
	})
}

func operationCount(t *testing.T) int {
	var l nodeopsv1.NodeOperationList
	if err := k8s.List(ctx(t), &l); err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}

func TestPlanGolden(t *testing.T) {
	planCluster(t)
	tests := []struct {
		golden string
		args   []string
	}{
		{"plan-upgrade", []string{"plan", "upgrade", "v1.37.2", "--binary-source", "http://bins.local", "--insecure-http", "--max-unavailable", "2"}},
		{"plan-upgrade-refused", []string{"plan", "upgrade", "v1.38.0", "--kubeadm-only", "--selector", "pool!=green"}},
		{"plan-upgrade-packages", []string{"plan", "upgrade", "v1.37.2", "--package-source", "apt"}},
		{"plan-renew-certs", []string{"plan", "renew-certs", "--certificates", "apiserver,etcd-server", "--controlled"}},
		{"plan-file", []string{"plan", "-f", "testdata/custom.yaml"}},
		{"plan-reconfigure", []string{"plan", "-f", "testdata/reconfigure.yaml"}},
		{"plan-renew-certs-json", []string{"plan", "renew-certs", "-o", "json"}},
	}
	before := operationCount(t)
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			golden(t, tt.golden, mustRun(t, tt.args...))
		})
	}
	if after := operationCount(t); after != before {
		t.Errorf("plan created operations: %d before, %d after", before, after)
	}
}

func TestPlanJSONIsData(t *testing.T) {
	planCluster(t)
	var p Plan
	if err := json.Unmarshal([]byte(mustRun(t, "plan", "upgrade", "v1.37.2", "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range p.Groups {
		got = append(got, g.Name+"="+strings.Join(g.Nodes, ","))
	}
	want := "preflight=cp-1,cp-2,cp-3,w-1,w-2,w-3,w-4 control-plane-first=cp-1 control-plane-rest=cp-2,cp-3 workers=w-1,w-2,w-3,w-4"
	if strings.Join(got, " ") != want {
		t.Errorf("groups = %v, want %s", got, want)
	}
	if p.ClusterVersion != "v1.36.4" || p.VersionCheck != "allowed" {
		t.Errorf("version check = %q %q, want v1.36.4 allowed", p.ClusterVersion, p.VersionCheck)
	}
}

func TestPlanRejectsBadInput(t *testing.T) {
	planCluster(t)
	for _, args := range [][]string{
		{"plan"},
		{"plan", "upgrade", "1.37"},
		{"plan", "upgrade", "v1.37.2", "--max-unavailable", "abc%"},
		{"plan", "renew-certs", "--selector", "a in (b"},
		{"plan", "-f", "testdata/does-not-exist.yaml"},
		{"plan", "renew-certs", "--dry-run", "--controlled"},
	} {
		_, errOut, code := run(t, args...)
		if code != CodeError || !strings.HasPrefix(errOut, "error: ") {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 and an error", args, code, errOut)
		}
	}
}

// A download over plain http is shown as such: in red on a terminal, in plain words otherwise; and
// plain http is refused unless asked for, naming the flag.
func TestPlanShowsInsecureHTTP(t *testing.T) {
	planCluster(t)
	args := []string{"plan", "upgrade", "v1.37.2", "--binary-source", "http://bins.local", "--insecure-http"}
	out := mustRun(t, args...)
	if n := strings.Count(out, "INSECURE HTTP"); n != 6 {
		t.Errorf("INSECURE HTTP shown %d times, want 6 (one per binary install):\n%s", n, out)
	}
	if strings.Contains(out, "\x1b[") {
		t.Errorf("colours in output that is not a terminal:\n%q", out)
	}
	if out := mustRun(t, "plan", "upgrade", "v1.37.2", "--binary-source", "https://bins.local"); strings.Contains(out, "INSECURE") {
		t.Errorf("an https source shown as insecure:\n%s", out)
	}

	var stdout, stderr syncBuffer
	o := testOptions(&stdout, &stderr, "")
	o.Terminal = func() (bool, int, int) { return true, 120, 40 }
	if code := Run(o, args); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "\x1b[1;31mINSECURE HTTP") {
		t.Errorf("on a terminal INSECURE HTTP is not red:\n%q", stdout.String())
	}

	_, errOut, code := run(t, "plan", "upgrade", "v1.37.2", "--binary-source", "http://bins.local")
	if code != CodeError || !strings.Contains(errOut, "plain http") || !strings.Contains(errOut, "--insecure-http") {
		t.Errorf("plain http without --insecure-http: exit %d, stderr %q; want it refused naming --insecure-http", code, errOut)
	}
}

// The plan names each group's maintenance windows and soak, the group's own over the operation's.
func TestPlanShowsWindowsAndSoak(t *testing.T) {
	node := func(name string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	}
	wait := []nodeopsv1.Command{{Wait: &nodeopsv1.WaitCommand{}}}
	op := &nodeopsv1.NodeOperation{Spec: nodeopsv1.NodeOperationSpec{
		Scheduling: nodeopsv1.Scheduling{
			Windows:       []nodeopsv1.MaintenanceWindow{{Days: []nodeopsv1.Weekday{"Saturday"}, Start: "22:00", End: "04:00", TimeZone: "Europe/Berlin"}},
			PostNodeDelay: &metav1.Duration{Duration: 10 * time.Minute},
			PauseBefore:   []string{"b"},
		},
		Custom: &nodeopsv1.CustomOperation{Groups: []nodeopsv1.Group{
			{Name: "canary", NodeFilter: nodeopsv1.NodeFilterHead, Commands: wait},
			{Name: "rest", NodeFilter: nodeopsv1.NodeFilterTail, Commands: wait, Scheduling: nodeopsv1.Scheduling{
				Windows: []nodeopsv1.MaintenanceWindow{{Schedule: "0 2 * * 0", Duration: &metav1.Duration{Duration: 4 * time.Hour}}}}},
		}},
	}}
	p, err := buildPlan(op, []corev1.Node{node("a"), node("b")})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	writePlan(&out, op, p, false)
	for _, want := range []string{
		"windows: Sat 22:00-04:00 Europe/Berlin (no new node starts outside them)",
		"windows: cron '0 2 * * 0' for 4h0m0s UTC (no new node starts outside them)",
		"soak: 10m0s after each node",
		"pause before: b (a person resumes: kubectl nodeops resume)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan lacks %q:\n%s", want, out.String())
		}
	}
	if n := strings.Count(out.String(), "soak: 10m0s after each node"); n != 2 {
		t.Errorf("soak shown %d times, want once per group:\n%s", n, out.String())
	}
	// Only the group that has node b pauses before it.
	if n := strings.Count(out.String(), "pause before:"); n != 1 {
		t.Errorf("pause before shown %d times, want once (group rest only):\n%s", n, out.String())
	}
}

// The plan lists each group's gates, the group's own over the operation's, and refuses CEL that
// does not compile, naming the field, before anything is created.
func TestPlanShowsGatesAndRefusesBadCEL(t *testing.T) {
	node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	wait := []nodeopsv1.Command{{Wait: &nodeopsv1.WaitCommand{}}}
	op := &nodeopsv1.NodeOperation{Spec: nodeopsv1.NodeOperationSpec{
		Scheduling: nodeopsv1.Scheduling{Gates: []nodeopsv1.Gate{{Name: "board", Approval: &nodeopsv1.ApprovalGate{}}}},
		Custom: &nodeopsv1.CustomOperation{Groups: []nodeopsv1.Group{
			{Name: "first", Commands: wait},
			{Name: "second", Commands: wait, Scheduling: nodeopsv1.Scheduling{Gates: []nodeopsv1.Gate{{Name: "storage", Timeout: &metav1.Duration{Duration: time.Hour},
				CEL: &nodeopsv1.CELGate{APIVersion: "apps/v1", Kind: "Deployment", Namespace: "ceph", Name: "osd", Expression: "self.status.availableReplicas == self.spec.replicas"}}}}},
		}},
	}}
	p, err := buildPlan(op, []corev1.Node{node})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	writePlan(&out, op, p, false)
	for _, want := range []string{
		"gate board: approval (timeout 30m0s)",
		"gate storage: cel on apps/v1 Deployment ceph/osd: self.status.availableReplicas == self.spec.replicas (timeout 1h0m0s)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan lacks %q:\n%s", want, out.String())
		}
	}
	op.Spec.Custom.Groups[1].Gates[0].CEL.Expression = "self.status.availableReplicas =="
	if _, err := buildPlan(op, []corev1.Node{node}); err == nil || !strings.Contains(err.Error(), "spec.custom.groups[1].gates[0].cel.expression") {
		t.Errorf("bad CEL: %v, want an error naming spec.custom.groups[1].gates[0].cel.expression", err)
	}
}
