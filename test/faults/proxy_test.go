//go:build faults

package faults

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"sync"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeops/nodeops/internal/testutil"
)

// proxy stands between nodeops' manager and agents and the API server (nodeops-local
// --component-kubeconfig): it serves plain HTTP on loopback, which client-go accepts for an
// http:// server, and forwards with the cluster admin's client certificate, the identity nodeops-local
// gives the manager and agents anyway. For a window it answers 503 to the requests a fault matches.
type proxy struct {
	upstreamKubeconfig string
	// created is told of every NodeTask create: which listener it came through, its name, node and answer.
	created func(via, name, node string, code int)

	mu       sync.Mutex
	servers  []*http.Server
	upstream http.Handler
	faults   []*fault
}

// fault answers 503, without Retry-After (client-go would retry it unseen), to the requests whose
// method is one of methods and whose path matches path, until until.
type fault struct {
	name    string
	methods map[string]bool
	path    *regexp.Regexp
	until   time.Time
	hits    int
}

// Faults the suite injects: cordon and uncordon are node writes, drain is evictions, results are the
// agents' task status writes.
var (
	cordonWrites = fault{name: "503 on node writes (cordon, uncordon)", methods: map[string]bool{"PATCH": true, "PUT": true},
		path: regexp.MustCompile(`^/api/v1/nodes/[^/]+$`)}
	evictions = fault{name: "503 on evictions (drain)", methods: map[string]bool{"POST": true},
		path: regexp.MustCompile(`^/api/v1/namespaces/[^/]+/pods/[^/]+/eviction$`)}
	resultWrites = fault{name: "503 on task status writes (results)", methods: map[string]bool{"PATCH": true, "PUT": true},
		path: regexp.MustCompile(`^/apis/nodeops\.io/v1alpha1/nodetasks/[^/]+/status$`)}
)

func newProxy(upstreamKubeconfig string, created func(via, name, node string, code int)) *proxy {
	return &proxy{upstreamKubeconfig: upstreamKubeconfig, created: created}
}

// Listen serves the proxy on a new loopback port, its requests labelled via, and writes a kubeconfig
// naming it, with no credentials (the proxy adds them), to path.
func (p *proxy) Listen(via, path string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.serve(via, w, r) }), ReadHeaderTimeout: 30 * time.Second}
	p.mu.Lock()
	p.servers = append(p.servers, srv)
	p.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	return writeKubeconfig(path, "http://"+ln.Addr().String())
}

func writeKubeconfig(path, server string) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: fault-proxy
  cluster:
    server: %s
contexts:
- name: fault-proxy
  context:
    cluster: fault-proxy
    user: via-proxy
current-context: fault-proxy
users:
- name: via-proxy
  user: {}
`, server)
	return os.WriteFile(path, []byte(kc), 0o600)
}

func (p *proxy) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.servers {
		_ = s.Close()
	}
}

// inject starts f for d; it returns the live fault, whose hits count the requests refused.
func (p *proxy) inject(f fault, d time.Duration) *fault {
	f.until = time.Now().Add(d)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = append(p.faults, &f)
	return &f
}

func (p *proxy) hits(f *fault) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return f.hits
}

var taskCreate = regexp.MustCompile(`^/apis/nodeops\.io/v1alpha1/nodetasks$`)

func (p *proxy) serve(via string, w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	for _, f := range p.faults {
		if time.Now().Before(f.until) && f.methods[r.Method] && f.path.MatchString(r.URL.Path) {
			f.hits++
			p.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"fault proxy: %s","reason":"ServiceUnavailable","code":503}`, f.name)
			return
		}
	}
	up, err := p.upstreamLocked()
	p.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if r.Method != http.MethodPost || !taskCreate.MatchString(r.URL.Path) {
		up.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var task struct {
		Metadata struct{ Name string }
		Spec     struct{ NodeName string }
	}
	_ = json.Unmarshal(body, &task)
	sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
	up.ServeHTTP(sw, r)
	p.created(via, task.Metadata.Name, task.Spec.NodeName, sw.code)
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

// upstreamLocked builds the forwarding handler once nodeops-local has written its kubeconfig.
func (p *proxy) upstreamLocked() (http.Handler, error) {
	if p.upstream != nil {
		return p.upstream, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", p.upstreamKubeconfig)
	if err != nil {
		return nil, fmt.Errorf("fault proxy: no upstream yet: %w", err)
	}
	up, err := testutil.ForwardTo(cfg)
	if err != nil {
		return nil, fmt.Errorf("fault proxy: %w", err)
	}
	p.upstream = up
	return up, nil
}
