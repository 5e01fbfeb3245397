package confinement

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/cakeys"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

// The nodes of the rotation tests: two control planes in the operation, a worker in it, and a control
// plane outside it.
const (
	rotOp     = "rotate-cas"
	rotFirst  = "cp-1"
	rotSecond = "cp-2"
	rotWorker = "worker-1"
	rotOther  = "cp-outside"
)

var rotationNodesOnce sync.Once

// rotationNodes creates the rotation tests' nodes, each with an agent pod its tokens are bound to.
func rotationNodes(t *testing.T) {
	t.Helper()
	var err error
	rotationNodesOnce.Do(func() {
		ctx := context.Background()
		for n, cp := range map[string]bool{rotFirst: true, rotSecond: true, rotWorker: false, rotOther: true} {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{}}}
			if cp {
				node.Labels[plan.LabelControlPlane] = ""
			}
			if err = admin.Create(ctx, node); err != nil {
				return
			}
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "agent-" + n, Namespace: ns},
				Spec: corev1.PodSpec{NodeName: n, ServiceAccountName: agentSA,
					Containers: []corev1.Container{{Name: "agent", Image: "agent"}}},
			}
			if err = admin.Create(ctx, pod); err != nil {
				return
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// rotationTask creates, as the manager, node's task of the rotation's group with its commands.
func rotationTask(t *testing.T, group, node string, cmd v1alpha1.Command) *v1alpha1.NodeTask {
	t.Helper()
	task := &v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: objname.TaskName(rotOp, group, node),
			Labels: map[string]string{v1alpha1.LabelOperation: rotOp, v1alpha1.LabelNode: node}},
		Spec: v1alpha1.NodeTaskSpec{NodeName: node, Operation: rotOp, Group: group, Commands: []v1alpha1.Command{cmd},
			ExecutionMode: v1alpha1.ExecutionAuto},
	}
	if err := manager.Create(context.Background(), task); err != nil {
		t.Fatalf("the manager creating %s: %v", task.Name, err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), task) })
	return task
}

// runAsAgent runs the task's one command as node's agent would: on the node's host root, with the
// agent's own client and token, then records the result in the task's status with the agent's
// client, output tail and message included, as the agent writes them.
func runAsAgent(t *testing.T, task *v1alpha1.NodeTask, root string, srv commands.CAServer) error {
	t.Helper()
	tok := token(t, task.Spec.NodeName)
	c, _ := as(t, tok)
	var out bytes.Buffer
	env := &commands.Env{NodeName: task.Spec.NodeName, Operation: rotOp, Task: task.Name, Host: host.NewLocal(root),
		Client: c, Out: &out, CAServer: srv, ServiceAccountToken: func() (string, error) { return tok, nil }}
	res, runErr := commands.Run(context.Background(), env, &task.Spec.Commands[0])
	fresh := &v1alpha1.NodeTask{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(task), fresh); err != nil {
		t.Fatal(err)
	}
	now := metav1.NowMicro()
	fresh.Status.Phase = v1alpha1.TaskRunning
	fresh.Status.Commands = []v1alpha1.CommandStatus{{Name: task.Spec.Commands[0].DisplayName(), Phase: v1alpha1.CommandRunning, Attempt: 1, StartTime: &now}}
	taskpolicy.ApplyResult(&fresh.Status, &fresh.Spec, 0, taskpolicy.Outcome{Err: runErr, Message: res.Message, Tail: out.String(), CAServer: res.CAServer}, now)
	if runErr == nil {
		fresh.Status.Phase = v1alpha1.TaskSucceeded
	}
	if err := c.Status().Update(context.Background(), fresh); err != nil {
		t.Fatalf("the agent of %s recording its result: %v", task.Spec.NodeName, err)
	}
	return runErr
}

// caServer starts node's certificate authority server on its host root, as the agent's own client.
func caServer(t *testing.T, node, root string) *cakeys.Server {
	t.Helper()
	c, _ := as(t, token(t, node))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &cakeys.Server{Node: node, Files: host.NewLocal(root).Files, Client: c, AgentUser: agent.AgentUser(ns), Advertise: l.Addr().String(),
		Log: func(m string) { t.Log(m) }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv
}

// keyNeedles are what of each staged private key would show a leak: the PEM text, a line of its
// body (the key's DER in base64, as PEM and JSON []byte both carry it) and the whole file in base64.
func keyNeedles(t *testing.T, root string) map[string]string {
	t.Helper()
	needles := map[string]string{}
	for _, rel := range []string{"ca.key", "etcd/ca.key", "front-proxy-ca.key", "sa.key", "server.key"} {
		data, err := os.ReadFile(filepath.Join(root, v1alpha1.StagingDirectory, rel))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) < 4 {
			t.Fatalf("%s is no PEM key", rel)
		}
		needles[rel+" (PEM)"] = string(data)
		needles[rel+" (a body line)"] = lines[len(lines)/2]
		needles[rel+" (base64 of the file)"] = base64.StdEncoding.EncodeToString(data)[:64]
	}
	needles["a PEM private key header"] = "PRIVATE KEY-----"
	return needles
}

// apiLeaks reads back every object of every listable resource (events, NodeTasks, ConfigMaps, Secrets,
// Leases, ...) and names each that holds a needle.
func apiLeaks(t *testing.T, needles map[string]string) []string {
	t.Helper()
	disc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	lists, err := disc.ServerPreferredResources()
	if err != nil {
		t.Fatal(err)
	}
	var leaks []string
	read := 0
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !contains(r.Verbs, "list") {
				continue
			}
			items, err := dyn.Resource(gv.WithResource(r.Name)).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatalf("listing %s: %v", r.Name, err)
			}
			for _, it := range items.Items {
				read++
				data, err := json.Marshal(it.Object)
				if err != nil {
					t.Fatal(err)
				}
				// JSON escapes a PEM's newlines; compare with them restored.
				text := strings.ReplaceAll(string(data), `\n`, "\n")
				for what, n := range needles {
					if strings.Contains(text, n) {
						leaks = append(leaks, r.Name+" "+it.GetNamespace()+"/"+it.GetName()+" holds "+what)
					}
				}
			}
		}
	}
	if read < 10 {
		t.Fatalf("read back only %d objects", read)
	}
	return leaks
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestSafetyRule15_KeysNeverReachTheAPI runs a rotation's prepare phase as its agents do (the new
// authorities generated on one control plane, copied to another agent to agent, each agent recording
// its result as it would) against the real API server with the committed RBAC and admission policies,
// then reads back every object of every resource and searches each for the keys: none may hold one
// (private keys never travel through the API, rule 15).
func TestSafetyRule15_KeysNeverReachTheAPI(t *testing.T) {
	rotationNodes(t)
	first, second := t.TempDir(), t.TempDir()
	gen := rotationTask(t, plan.GroupCAPrepareGenerate, rotFirst, v1alpha1.Command{GenerateCertificateAuthorities: &v1alpha1.GenerateCertificateAuthoritiesCommand{ServiceAccountKey: true}})
	cp := rotationTask(t, plan.GroupCAPrepareCopy, rotSecond, v1alpha1.Command{CopyCertificateAuthorities: &v1alpha1.CopyCertificateAuthoritiesCommand{ServiceAccountKey: true}})

	srv := caServer(t, rotFirst, first)
	if err := runAsAgent(t, gen, first, srv); err != nil {
		t.Fatalf("generate: %v", err)
	}
	if got := get(t, gen.Name).Status.CertificateAuthorityServer; got == nil || len(got.CertificateSHA256) != 64 {
		t.Fatalf("the generating task published no server: %+v", got)
	}
	if err := runAsAgent(t, cp, second, nil); err != nil {
		t.Fatalf("copy: %v", err)
	}
	// The second control plane holds the same keys, 0600.
	for _, rel := range []string{"ca.key", "etcd/ca.key", "front-proxy-ca.key", "sa.key", "ca.crt", "sa.pub"} {
		a, err := os.ReadFile(filepath.Join(first, v1alpha1.StagingDirectory, rel))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(second, v1alpha1.StagingDirectory, rel))
		if err != nil {
			t.Fatalf("the copy has no %s: %v", rel, err)
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("%s differs between the control planes", rel)
		}
		if fi, _ := os.Stat(filepath.Join(second, v1alpha1.StagingDirectory, rel)); strings.HasSuffix(rel, ".key") && fi.Mode().Perm() != 0o600 {
			t.Fatalf("the copied %s has mode %04o", rel, fi.Mode().Perm())
		}
	}
	if _, err := os.Stat(filepath.Join(second, v1alpha1.StagingDirectory, "server.key")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the server's own key was copied: %v", err)
	}

	needles := keyNeedles(t, first)
	if leaks := apiLeaks(t, needles); len(leaks) > 0 {
		t.Fatalf("a private key reached the API:\n%s", strings.Join(leaks, "\n"))
	}
	// The search finds a key where one is: an Event carrying one is named.
	key, err := os.ReadFile(filepath.Join(first, v1alpha1.StagingDirectory, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "planted-leak", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{Kind: "NodeTask", Name: gen.Name, Namespace: ns}, Reason: "Leak", Message: string(key)}
	if err := admin.Create(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Delete(context.Background(), ev) }()
	if leaks := apiLeaks(t, needles); len(leaks) == 0 || !strings.Contains(strings.Join(leaks, "\n"), "planted-leak holds ca.key") {
		t.Fatalf("the search missed a key planted in an Event: %v", leaks)
	}
}

// TestSafetyRule15_WorkerAndOutsiderAreRefusedTheKeys: the generating agent answers only a control
// plane's agent with an unfinished copy task of the same operation. A worker's agent (with a copy task
// in the operation), a control plane's agent outside the operation and the generating node itself are
// refused, and nothing is written on their nodes.
func TestSafetyRule15_WorkerAndOutsiderAreRefusedTheKeys(t *testing.T) {
	rotationNodes(t)
	first := t.TempDir()
	gen := rotationTask(t, plan.GroupCAPrepareGenerate, rotFirst, v1alpha1.Command{GenerateCertificateAuthorities: &v1alpha1.GenerateCertificateAuthoritiesCommand{}})
	srv := caServer(t, rotFirst, first)
	if err := runAsAgent(t, gen, first, srv); err != nil {
		t.Fatalf("generate: %v", err)
	}
	copyCmd := v1alpha1.Command{CopyCertificateAuthorities: &v1alpha1.CopyCertificateAuthoritiesCommand{}}
	for _, tt := range []struct {
		node string
		task bool // a copy task of the operation on the node
		why  string
	}{
		{rotWorker, true, "node worker-1 is no control plane"},
		{rotOther, false, "node cp-outside has no unfinished copyCertificateAuthorities task of operation " + rotOp},
	} {
		t.Run(tt.node, func(t *testing.T) {
			root := t.TempDir()
			var task *v1alpha1.NodeTask
			if tt.task {
				task = rotationTask(t, plan.GroupCAPrepareCopy, tt.node, copyCmd)
			} else {
				// Outside the operation: a copy task of another operation.
				task = &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: "other-op-" + tt.node}, Spec: v1alpha1.NodeTaskSpec{
					NodeName: tt.node, Operation: rotOp, Commands: []v1alpha1.Command{copyCmd}}}
			}
			tok := token(t, tt.node)
			c, _ := as(t, tok)
			env := &commands.Env{NodeName: tt.node, Operation: rotOp, Host: host.NewLocal(root), Client: c,
				ServiceAccountToken: func() (string, error) { return tok, nil }}
			_, err := commands.Run(context.Background(), env, &task.Spec.Commands[0])
			var refused *cakeys.RefusedError
			if !errors.As(err, &refused) || refused.Code != 403 || !strings.Contains(refused.Message, tt.why) {
				t.Fatalf("want 403 %q, got %v", tt.why, err)
			}
			if _, err := os.Stat(filepath.Join(root, v1alpha1.StagingDirectory)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a refused agent's node has a staging directory: %v", err)
			}
		})
	}
	// The generating node's own agent is no receiver either.
	pub, err := srv.Publish()
	if err != nil {
		t.Fatal(err)
	}
	var refused *cakeys.RefusedError
	if _, err := cakeys.Fetch(context.Background(), pub, rotOp, nil, false, token(t, rotFirst)); !errors.As(err, &refused) || refused.Code != 403 {
		t.Fatalf("the generating node's own agent: %v", err)
	}
	// A token bound to no pod is refused too.
	if _, err := cakeys.Fetch(context.Background(), pub, rotOp, nil, false, token(t, "")); !errors.As(err, &refused) || refused.Code != 403 {
		t.Fatalf("a token bound to no pod: %v", err)
	}
}
