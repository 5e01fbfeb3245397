package chart

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/controller/agentjob"
	"github.com/nodeops/nodeops/internal/secretholder"
	"github.com/nodeops/nodeops/internal/testutil"
)

// TestMetricsServiceIsTheManagers (issue 24, point 3): the metrics Service selects on a label no pod
// an agent makes may carry (admission lets an agent's pod carry exactly commands.InstallerPod's
// labels), and the ServiceMonitor verifies the manager's certificate, made by the chart for the
// Service's name, instead of skipping verification.
func TestMetricsServiceIsTheManagers(t *testing.T) {
	t.Parallel()
	timed(t)
	objs := helmTemplate(t, "--set", "metrics.serviceMonitor.enabled=true")
	svc := typed[corev1.Service](t, objs, "Service", "nodeops-manager-metrics")
	agentLabels := commands.InstallerPod("nodeops-system", "n", "t", 0, &v1alpha1.PodCommand{Image: "i"}).Labels
	if !slices.ContainsFunc(keys(svc.Spec.Selector), func(k string) bool { _, ok := agentLabels[k]; return !ok }) {
		t.Errorf("the metrics Service selects %v: every key is one an agent's pod carries (%v)", svc.Spec.Selector, agentLabels)
	}
	d := typed[appsv1.Deployment](t, objs, "Deployment", "nodeops-manager")
	for k, v := range svc.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("the metrics Service selects %s=%s, which the manager's pods lack (%v)", k, v, d.Spec.Template.Labels)
		}
	}

	sm := find(objs, "ServiceMonitor", "nodeops-manager")
	if sm == nil {
		t.Fatal("no ServiceMonitor")
	}
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	tls, _ := endpoints[0].(map[string]any)["tlsConfig"].(map[string]any)
	name, _, _ := unstructured.NestedString(tls, "ca", "secret", "name")
	key, _, _ := unstructured.NestedString(tls, "ca", "secret", "key")
	if tls["insecureSkipVerify"] == true || name != "nodeops-manager-metrics-tls" || key != "ca.crt" || tls["serverName"] != "nodeops-manager-metrics.nodeops-system.svc" {
		t.Errorf("ServiceMonitor tlsConfig %v: want the CA of Secret nodeops-manager-metrics-tls and the Service's name, no insecureSkipVerify", tls)
	}
	m := container(t, d.Spec.Template.Spec, "manager")
	if !slices.Contains(m.Args, "--metrics-cert-dir=/etc/nodeops/metrics-tls") || len(m.VolumeMounts) != 1 || m.VolumeMounts[0].MountPath != "/etc/nodeops/metrics-tls" {
		t.Errorf("manager args %v mounts %v: want its certificate from /etc/nodeops/metrics-tls", m.Args, m.VolumeMounts)
	}
	// The certificate the chart made verifies, with the CA Prometheus is given, for the name it asks.
	secret := typed[corev1.Secret](t, objs, "Secret", "nodeops-manager-metrics-tls")
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(secret.Data["ca.crt"]) {
		t.Fatalf("ca.crt of nodeops-manager-metrics-tls is no PEM certificate")
	}
	block, _ := pem.Decode(secret.Data["tls.crt"])
	if block == nil {
		t.Fatal("tls.crt of nodeops-manager-metrics-tls is no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "nodeops-manager-metrics.nodeops-system.svc"}); err != nil {
		t.Errorf("the manager's metrics certificate does not verify for its Service: %v", err)
	}

	// A self-signed certificate cannot be verified: a ServiceMonitor then needs a tlsConfig.
	out, err := run(t, nil, "helm", "template", "nodeops", chartDir, "--namespace", "nodeops-system",
		"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.tls.source=self-signed")
	if err == nil || !strings.Contains(out, "set metrics.serviceMonitor.tlsConfig") {
		t.Errorf("a ServiceMonitor of a self-signed manager rendered (%v):\n%s", err, out)
	}
	objs = helmTemplate(t, "--set", "metrics.tls.source=certManager", "--set", "metrics.tls.certManager.issuerRef.name=ca", "--set", "metrics.tls.certManager.issuerRef.kind=ClusterIssuer")
	if c := find(objs, "Certificate", "nodeops-manager-metrics"); c == nil || find(objs, "Secret", "nodeops-manager-metrics-tls") != nil {
		t.Errorf("metrics.tls.source=certManager: Certificate %v, and the chart's own Secret rendered %v", c != nil, find(objs, "Secret", "nodeops-manager-metrics-tls") != nil)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// podSecurityExceptions are nodeops' pods that do not pass the Pod Security Standards' restricted
// level, each with its reason; every other pod nodeops makes must pass it.
var podSecurityExceptions = map[string]string{
	"DaemonSet nodeops-agent":  "the agent does host work: privileged, the host's PID namespace and its / mounted (docs/design.md, \"How commands reach a host\")",
	"Job nodeops-agent-node-a": "agent.mode=Job runs the same agent as a Job per node, with the same needs",
	"Pod installer":            "a pod command's pod runs the image and settings its NodeProfile or NodeOperation asks for (KWasm's installer is privileged)",
}

// TestPodSecurityRestricted (issue 24, point 8): Kubernetes' own Pod Security admission, enforced at
// the restricted level on a namespace of a real API server, admits the pods of the chart's rendered
// manager Deployment and the secret holder pods the manager makes, and refuses only the listed
// exceptions (which the privileged level admits).
func TestPodSecurityRestricted(t *testing.T) {
	t.Parallel()
	timed(t)
	ctx := context.Background()
	env, err := testutil.Start("nodetasks")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c := env.Client
	for _, level := range []string{"restricted", "privileged"} {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "pss-" + level, Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/enforce-version": "latest"}}}
		if err := c.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	pods := map[string]corev1.PodSpec{}
	for _, flags := range [][]string{nil, {"--set", "agent.mode=Job"}} {
		for _, o := range helmTemplate(t, flags...) {
			switch o.GetKind() {
			case "Deployment":
				pods["Deployment "+o.GetName()] = typed[appsv1.Deployment](t, []*unstructured.Unstructured{o}, "Deployment", o.GetName()).Spec.Template.Spec
			case "DaemonSet":
				pods["DaemonSet "+o.GetName()] = typed[appsv1.DaemonSet](t, []*unstructured.Unstructured{o}, "DaemonSet", o.GetName()).Spec.Template.Spec
			case "Job", "CronJob", "StatefulSet", "ReplicaSet", "Pod":
				t.Errorf("the chart renders a %s %s this test does not check", o.GetKind(), o.GetName())
			}
		}
	}
	// What the manager and the agents make at run time.
	pods["Job nodeops-agent-node-a"] = agentjob.BuildJob("node-a", agentjob.Options{Image: "agent"}).Spec.Template.Spec
	task := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "t"}, Spec: v1alpha1.NodeTaskSpec{NodeName: "node-a",
		Commands: []v1alpha1.Command{{Script: &v1alpha1.ScriptCommand{Inline: "true", EnvFrom: []v1alpha1.EnvFromSource{{SecretRef: v1alpha1.SecretEnvSource{Name: "nodeops-script-a"}}}}}}}}
	pods["Pod secret holder"] = secretholder.Build(task, secretholder.Options{Image: "agent"}).Spec
	pods["Pod installer"] = commands.InstallerPod("x", "node-a", "t", 0, &v1alpha1.PodCommand{Image: "i", Privileged: true, HostPID: true, MountHostRoot: true}).Spec
	if _, ok := pods["Deployment nodeops-manager"]; !ok {
		t.Fatal("no manager Deployment rendered")
	}
	for what, spec := range pods {
		try := func(level string) error {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pss", Namespace: "pss-" + level}, Spec: spec}
			return c.Create(ctx, p, client.DryRunAll)
		}
		reason, excepted := podSecurityExceptions[what]
		err := try("restricted")
		switch {
		case err == nil && excepted:
			t.Errorf("%s passes restricted now: take it off the exceptions (%s)", what, reason)
		case err != nil && !excepted:
			t.Errorf("%s does not pass Pod Security restricted: %v", what, err)
		case err != nil && !(apierrors.IsForbidden(err) && strings.Contains(err.Error(), "violates PodSecurity")):
			t.Errorf("%s refused, but not by Pod Security: %v", what, err)
		case err != nil:
			t.Logf("%s: an exception (%s): %v", what, reason, err)
			if err := try("privileged"); err != nil {
				t.Errorf("%s under privileged: %v", what, err)
			}
		}
	}
}
