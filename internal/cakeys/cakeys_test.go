package cakeys

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

const agentUser = "system:serviceaccount:nodeops-system:nodeops-agent"

func newRoot(t *testing.T) (string, host.Files) {
	t.Helper()
	root := t.TempDir()
	return root, host.NewLocal(root).Files
}

// The new authorities are staged beside /etc/kubernetes/pki: keys 0600, directories 0700, each key
// matching its certificate; a re-run keeps them; another operation's are never overwritten.
func TestGenerateStagesKeysOnlyForRoot(t *testing.T) {
	root, files := newRoot(t)
	g, err := Generate(files, "rot-1", nil, true, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(g.Made, ",") != "cluster,etcd,front-proxy,service-account" || len(g.Kept) != 0 {
		t.Fatalf("made %v kept %v", g.Made, g.Kept)
	}
	dir := filepath.Join(root, v1alpha1.StagingDirectory)
	for _, rel := range []string{"ca.key", "etcd/ca.key", "front-proxy-ca.key", "sa.key", "rotation"} {
		fi, err := os.Stat(filepath.Join(dir, rel))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %04o, want 0600", rel, fi.Mode().Perm())
		}
	}
	for _, d := range []string{dir, filepath.Join(dir, "etcd")} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("%s mode %04o, want 0700", d, fi.Mode().Perm())
		}
	}
	for _, l := range g.Lines {
		if strings.Contains(l, "PRIVATE KEY") {
			t.Fatalf("a line holds a key: %s", l)
		}
		// No old authority to follow: kubeadm's default kind.
		if !strings.Contains(l, "key RSA-2048 ") {
			t.Errorf("not an RSA-2048 key: %s", l)
		}
	}
	before, _ := os.ReadFile(filepath.Join(dir, "ca.key"))
	g, err = Generate(files, "rot-1", nil, true, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "ca.key"))
	if len(g.Made) != 0 || !bytes.Equal(before, after) {
		t.Fatalf("a re-run made %v again", g.Made)
	}
	if _, err := Generate(files, "rot-2", nil, false, time.Now()); err == nil || !strings.Contains(err.Error(), `"rot-1"`) {
		t.Fatalf("another operation's staging directory: %v", err)
	}
	// A pair left half-written (the agent killed between key and certificate) is made again.
	if err := os.Remove(filepath.Join(dir, "etcd/ca.crt")); err != nil {
		t.Fatal(err)
	}
	if g, err = Generate(files, "rot-1", nil, true, time.Now()); err != nil || strings.Join(g.Made, ",") != "etcd" {
		t.Fatalf("after losing etcd/ca.crt: made %v, %v", g.Made, err)
	}
}

// Write takes nothing that does not match: a key of another certificate is refused before any file is written.
func TestWriteRefusesAMismatchedPair(t *testing.T) {
	_, src := newRoot(t)
	if _, err := Generate(src, "rot-1", []string{"cluster", "etcd"}, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	files, err := Read(src, "rot-1", []string{"cluster", "etcd"}, false)
	if err != nil {
		t.Fatal(err)
	}
	for i := range files {
		if files[i].Path == "ca.key" {
			for _, f := range files {
				if f.Path == "etcd/ca.key" {
					files[i].Data = f.Data
				}
			}
		}
	}
	root, dst := newRoot(t)
	if _, err := Write(dst, "rot-1", []string{"cluster", "etcd"}, false, files); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("a swapped key: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, v1alpha1.StagingDirectory)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused copy wrote the staging directory: %v", err)
	}
}

// cluster is a fake API server's view: nodes, the operation's tasks, and TokenReview answers by token.
type cluster struct {
	nodes  map[string]bool // name -> control plane
	tasks  []v1alpha1.NodeTask
	tokens map[string]authenticationv1.UserInfo
}

func (c cluster) client(t *testing.T) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	for n, cp := range c.nodes {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{}}}
		if cp {
			node.Labels[LabelControlPlane] = ""
		}
		objs = append(objs, node)
	}
	for i := range c.tasks {
		objs = append(objs, c.tasks[i].DeepCopy())
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			tr, ok := obj.(*authenticationv1.TokenReview)
			if !ok {
				return cl.Create(ctx, obj, opts...)
			}
			u, ok := c.tokens[tr.Spec.Token]
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: ok, User: u}
			return nil
		},
	}).Build()
}

func copyTask(op, node string, phase v1alpha1.TaskPhase) v1alpha1.NodeTask {
	return v1alpha1.NodeTask{
		ObjectMeta: metav1.ObjectMeta{Name: op + "-copy-" + node, Labels: map[string]string{v1alpha1.LabelOperation: op, v1alpha1.LabelNode: node}},
		Spec: v1alpha1.NodeTaskSpec{NodeName: node, Operation: op, Group: "ca-prepare-copy",
			Commands: []v1alpha1.Command{{CopyCertificateAuthorities: &v1alpha1.CopyCertificateAuthoritiesCommand{}}}},
		Status: v1alpha1.NodeTaskStatus{Phase: phase},
	}
}

func agentOn(node string) authenticationv1.UserInfo {
	return authenticationv1.UserInfo{Username: agentUser, Extra: map[string]authenticationv1.ExtraValue{NodeNameExtra: {node}}}
}

// Only the agent of another control plane with an unfinished copy task of the same operation is
// answered; every other asker is refused with its reason.
func TestAuthorize(t *testing.T) {
	c := cluster{
		nodes: map[string]bool{"cp-1": true, "cp-2": true, "cp-3": true, "cp-4": true, "worker-1": false},
		tasks: []v1alpha1.NodeTask{copyTask("rot", "cp-2", v1alpha1.TaskRunning), copyTask("rot", "worker-1", v1alpha1.TaskRunning),
			copyTask("rot", "cp-4", v1alpha1.TaskSucceeded), copyTask("other", "cp-3", v1alpha1.TaskRunning)},
		tokens: map[string]authenticationv1.UserInfo{
			"cp-2": agentOn("cp-2"), "cp-1": agentOn("cp-1"), "cp-3": agentOn("cp-3"), "cp-4": agentOn("cp-4"), "worker-1": agentOn("worker-1"),
			"unbound":  {Username: agentUser},
			"someone":  {Username: "alice", Extra: map[string]authenticationv1.ExtraValue{NodeNameExtra: {"cp-2"}}},
			"two-node": {Username: agentUser, Extra: map[string]authenticationv1.ExtraValue{NodeNameExtra: {"cp-2", "cp-3"}}},
		},
	}
	s := &Server{Node: "cp-1", Client: c.client(t), AgentUser: agentUser}
	for _, tt := range []struct {
		token string
		code  int
		why   string
	}{
		{"cp-2", 0, ""},
		{"worker-1", http.StatusForbidden, "no control plane"},
		{"cp-3", http.StatusForbidden, "no unfinished copyCertificateAuthorities task of operation rot"},
		{"cp-4", http.StatusForbidden, "no unfinished"},
		{"cp-1", http.StatusForbidden, "the node serving"},
		{"unbound", http.StatusForbidden, "bound to no pod"},
		{"someone", http.StatusForbidden, "not nodeops' agent"},
		{"two-node", http.StatusForbidden, "bound to no pod"},
		{"forged", http.StatusUnauthorized, "does not authenticate"},
	} {
		_, code, err := s.Authorize(context.Background(), tt.token, "rot")
		if code != tt.code || (err == nil) != (tt.why == "") || (err != nil && !strings.Contains(err.Error(), tt.why)) {
			t.Errorf("token %s: code %d, %v; want %d %q", tt.token, code, err, tt.code, tt.why)
		}
	}
}

// Agent to agent: the receiver gets exactly the staged files; a receiver pinned to another
// fingerprint never sends its token (the handshake fails first), and a refused one gets nothing.
func TestFetchPinsTheServer(t *testing.T) {
	_, src := newRoot(t)
	if _, err := Generate(src, "rot", nil, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	c := cluster{nodes: map[string]bool{"cp-1": true, "cp-2": true, "worker-1": false},
		tasks:  []v1alpha1.NodeTask{copyTask("rot", "cp-2", v1alpha1.TaskRunning), copyTask("rot", "worker-1", v1alpha1.TaskRunning)},
		tokens: map[string]authenticationv1.UserInfo{"cp-2": agentOn("cp-2"), "worker-1": agentOn("worker-1")}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Node: "cp-1", Files: src, Client: c.client(t), AgentUser: agentUser, Advertise: l.Addr().String()}
	pub, err := s.Publish()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Serve(ctx, l) }()

	files, err := Fetch(ctx, pub, "rot", nil, true, "cp-2")
	if err != nil {
		t.Fatal(err)
	}
	want, err := Read(src, "rot", nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(want) || len(files) != 8 {
		t.Fatalf("got %d files, want %d", len(files), len(want))
	}
	for i := range want {
		if files[i].Path != want[i].Path || !bytes.Equal(files[i].Data, want[i].Data) {
			t.Fatalf("file %s differs", want[i].Path)
		}
		if strings.HasPrefix(files[i].Path, "server.") {
			t.Fatalf("the server's own key was served: %s", files[i].Path)
		}
	}
	var refused *RefusedError
	if _, err := Fetch(ctx, pub, "rot", nil, true, "worker-1"); !errors.As(err, &refused) || refused.Code != http.StatusForbidden {
		t.Fatalf("the worker's agent: %v", err)
	}
	wrong := pub
	wrong.CertificateSHA256 = strings.Repeat("0", 64)
	if _, err := Fetch(ctx, wrong, "rot", nil, true, "cp-2"); err == nil || !strings.Contains(err.Error(), "not the one its task published") {
		t.Fatalf("another fingerprint: %v", err)
	}
}

// The new authorities and service-account key are of the kind kubeadm made the ones they replace in
// (its encryptionAlgorithm): a cluster kubeadm set up with ECDSA-P256 gets ECDSA-P256 authorities,
// not RSA ones, and the description names the kind. (A node without old ones gets RSA-2048,
// kubeadm's default: TestGenerateStagesKeysOnlyForRoot.)
func TestNewAuthoritiesAreOfTheKindTheyReplace(t *testing.T) {
	root := t.TempDir()
	realControlPlane(t, root, "cp-1", fastKeys)
	files := host.NewLocal(root).Files
	g, err := Generate(files, trustOp, nil, true, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	want, _ := Pairs(nil, true)
	for _, p := range want {
		old, err := parseAnyKey(readFile(t, root, pki(p.Key)))
		if err != nil {
			t.Fatal(err)
		}
		if got := keyKind(old.Public()); got != fastKeys {
			t.Fatalf("kubeadm made %s as %s, want %s: the fixture does not test what it says", p.Key, got, fastKeys)
		}
		fresh, err := parseAnyKey(readFile(t, root, staged(p.Key)))
		if err != nil {
			t.Fatal(err)
		}
		if got := keyKind(fresh.Public()); got != fastKeys {
			t.Errorf("the new %s is %s, want %s like the one it replaces", p.Name, got, fastKeys)
		}
		if err := checkPair(files, p); err != nil {
			t.Errorf("the new %s: %v", p.Name, err)
		}
	}
	if len(g.Lines) != len(want) {
		t.Fatalf("lines %v", g.Lines)
	}
	for _, l := range g.Lines {
		if !strings.Contains(l, fastKeys) {
			t.Errorf("the description does not name the key's kind: %s", l)
		}
	}
}
