package commands

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/cakeys"
	"github.com/nodeops/nodeops/internal/host"
)

// TestSafetyRule15_HandlersRecordNoKey runs the prepare phase's two handlers (generate on cp-1, copy
// to cp-2, agent to agent over the key server) and trust-both's (both control planes and a worker),
// and searches everything they hand the agent to record
// (result messages, published server, output) and every object in the cluster afterwards for the
// keys: none may hold one. test/confinement's TestSafetyRule15_KeysNeverReachTheAPI does the same
// against a real API server.
func TestSafetyRule15_HandlersRecordNoKey(t *testing.T) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	const op, user = "rot", "system:serviceaccount:nodeops-system:nodeops-agent"
	gen := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "gen", Labels: map[string]string{v1alpha1.LabelOperation: op, v1alpha1.LabelNode: "cp-1"}},
		Spec: v1alpha1.NodeTaskSpec{NodeName: "cp-1", Operation: op, Commands: []v1alpha1.Command{{GenerateCertificateAuthorities: &v1alpha1.GenerateCertificateAuthoritiesCommand{ServiceAccountKey: true}}}}}
	cp := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "copy", Labels: map[string]string{v1alpha1.LabelOperation: op, v1alpha1.LabelNode: "cp-2"}},
		Spec:   v1alpha1.NodeTaskSpec{NodeName: "cp-2", Operation: op, Commands: []v1alpha1.Command{{CopyCertificateAuthorities: &v1alpha1.CopyCertificateAuthoritiesCommand{ServiceAccountKey: true}}}},
		Status: v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskRunning}}
	nodes := []client.Object{gen, cp}
	for _, n := range []string{"cp-1", "cp-2"} {
		nodes = append(nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{cakeys.LabelControlPlane: ""}}})
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(nodes...).WithStatusSubresource(&v1alpha1.NodeTask{}).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if tr, ok := obj.(*authenticationv1.TokenReview); ok {
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: tr.Spec.Token == "token-cp-2",
					User: authenticationv1.UserInfo{Username: user, Extra: map[string]authenticationv1.ExtraValue{cakeys.NodeNameExtra: {"cp-2"}}}}
				return nil
			}
			return cl.Create(ctx, obj, opts...)
		},
	}).Build()

	first, second := t.TempDir(), t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &cakeys.Server{Node: "cp-1", Files: host.NewLocal(first).Files, Client: c, AgentUser: user, Advertise: l.Addr().String()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = srv.Serve(ctx, l) }()

	var recorded bytes.Buffer
	run := func(task *v1alpha1.NodeTask, root string, server CAServer, token string) {
		t.Helper()
		var out bytes.Buffer
		env := &Env{NodeName: task.Spec.NodeName, Operation: op, Host: host.NewLocal(root), Client: c, Out: &out, CAServer: server,
			ServiceAccountToken: func() (string, error) { return token, nil }}
		res, err := Run(ctx, env, &task.Spec.Commands[0])
		if err != nil {
			t.Fatalf("%s: %v", task.Name, err)
		}
		data, _ := json.Marshal(res)
		recorded.Write(data)
		recorded.Write(out.Bytes())
		// As the agent records it: the published server in the task's status.
		fresh := &v1alpha1.NodeTask{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(task), fresh); err != nil {
			t.Fatal(err)
		}
		fresh.Status.CertificateAuthorityServer = res.CAServer
		fresh.Status.Message = res.Message
		fresh.Status.Phase = v1alpha1.TaskSucceeded
		if err := c.Status().Update(ctx, fresh); err != nil {
			t.Fatal(err)
		}
	}
	run(gen, first, srv, "")
	run(cp, second, nil, "token-cp-2")
	a, _ := os.ReadFile(filepath.Join(first, v1alpha1.StagingDirectory, "ca.key"))
	b, _ := os.ReadFile(filepath.Join(second, v1alpha1.StagingDirectory, "ca.key"))
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Fatal("the second control plane did not receive the first's ca.key")
	}

	// Phase trust-both on both control planes and a worker: what they record holds no key either.
	worker := t.TempDir()
	workerCA := oldPKI(t, worker, false)
	newCA, err := os.ReadFile(filepath.Join(first, v1alpha1.StagingDirectory, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "nodeops-system", Name: "kube-root-ca.crt"},
		Data: map[string]string{"ca.crt": string(workerCA) + string(newCA)}}); err != nil {
		t.Fatal(err)
	}
	for node, root := range map[string]string{"cp-1": first, "cp-2": second, "worker-1": worker} {
		if node != "worker-1" {
			oldPKI(t, root, true)
		}
		res, out, err := trustOldAndNew(ctx, t, c, node, root, false)
		if err != nil {
			t.Fatalf("trust on %s: %v", node, err)
		}
		if !strings.Contains(res.Message, "files changed") {
			t.Fatalf("trust on %s: %s", node, res.Message)
		}
		data, _ := json.Marshal(res)
		recorded.Write(data)
		recorded.WriteString(out)
	}

	for _, kind := range []client.ObjectList{&v1alpha1.NodeTaskList{}, &corev1.EventList{}, &corev1.NodeList{}, &corev1.SecretList{}, &corev1.ConfigMapList{}} {
		if err := c.List(ctx, kind); err != nil {
			t.Fatal(err)
		}
		data, _ := json.Marshal(kind)
		recorded.Write(data)
	}
	text := strings.ReplaceAll(recorded.String(), `\n`, "\n")
	for _, rel := range []string{"ca.key", "etcd/ca.key", "front-proxy-ca.key", "sa.key", "server.key"} {
		key, err := os.ReadFile(filepath.Join(first, v1alpha1.StagingDirectory, rel))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(key)), "\n")
		for what, needle := range map[string]string{"PEM": string(key), "a body line": lines[len(lines)/2],
			"base64 of the file": base64.StdEncoding.EncodeToString(key)[:64]} {
			if strings.Contains(text, needle) {
				t.Errorf("%s (%s) is in what the agent records or the cluster holds", rel, what)
			}
		}
	}
	if strings.Contains(text, "PRIVATE KEY") {
		t.Error("a PEM private key is in what the agent records or the cluster holds")
	}
}

// TestPrepareDryRunCopiesFromTheGeneratingNode: in a DryRun, generateCertificateAuthorities makes
// and serves nothing, so copyCertificateAuthorities lists what it would copy from the generating
// node instead of failing for want of a published server (as a whole rotation's DryRun did).
func TestPrepareDryRunCopiesFromTheGeneratingNode(t *testing.T) {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	const op = "rot"
	gen := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "gen", Labels: map[string]string{v1alpha1.LabelOperation: op, v1alpha1.LabelNode: "cp-1"}},
		Spec:   v1alpha1.NodeTaskSpec{NodeName: "cp-1", Operation: op, Commands: []v1alpha1.Command{{GenerateCertificateAuthorities: &v1alpha1.GenerateCertificateAuthoritiesCommand{}}}},
		Status: v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskSucceeded}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(gen).Build()
	root := t.TempDir()
	var out bytes.Buffer
	env := &Env{NodeName: "cp-2", Operation: op, DryRun: true, Host: host.NewLocal(root), Client: c, Out: &out}
	res, err := Run(context.Background(), env, &v1alpha1.Command{CopyCertificateAuthorities: &v1alpha1.CopyCertificateAuthoritiesCommand{}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Message, "dry run: would copy") || !strings.Contains(res.Message, "from node cp-1") ||
		!strings.Contains(out.String(), "ca.key (mode 0600) from node cp-1") {
		t.Errorf("message %q, output:\n%s", res.Message, out.String())
	}
	if _, err := os.Stat(filepath.Join(root, v1alpha1.StagingDirectory)); !os.IsNotExist(err) {
		t.Errorf("the DryRun made the staging directory: %v", err)
	}
}
