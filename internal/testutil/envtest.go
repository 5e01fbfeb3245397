// Package testutil starts a real kube-apiserver and etcd (controller-runtime's envtest) with
// nodeops' committed CRDs installed, for the controller tests of every package.
//
// It is for tests only: no nodeops binary links it.
package testutil

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/config"
)

// Env is a running API server with nodeops' CRDs.
type Env struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Scheme knows the Kubernetes kinds and nodeops'.
	Scheme *runtime.Scheme
	// Client talks straight to the API server, without a cache.
	Client client.WithWatch

	env *envtest.Environment
}

// NewScheme is a scheme with client-go's kinds and nodeops.io/v1alpha1.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("add client-go kinds: %w", err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("add nodeops kinds: %w", err)
	}
	return s, nil
}

// CRDs reads the committed CRDs (config/crd, embedded); only those whose file name contains
// one of only, or all when only is empty.
func CRDs(only ...string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	files, err := fs.Glob(config.CRDs, "crd/*.yaml")
	if err != nil {
		return nil, fmt.Errorf("list CRDs: %w", err)
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		if len(only) > 0 && !containsAny(f, only) {
			continue
		}
		data, err := config.CRDs.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return nil, fmt.Errorf("parse %s: %w", f, err)
		}
		out = append(out, crd)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no CRD matches %v", only)
	}
	return out, nil
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// Start starts etcd and kube-apiserver from $KUBEBUILDER_ASSETS and installs the CRDs whose
// file names contain one of crds ("nodeoperations", "nodetasks", ...), or all of them.
func Start(crds ...string) (*Env, error) {
	return StartWith(Options{CRDs: crds})
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error {
	if err := e.env.Stop(); err != nil {
		return fmt.Errorf("stop envtest: %w", err)
	}
	return nil
}

// WriteKubeconfig writes a kubeconfig for an administrator of the API server into dir and
// returns its path, for kubectl and the nodeops binaries.
func (e *Env) WriteKubeconfig(dir string) (string, error) {
	user, err := e.env.AddUser(envtest.User{Name: "nodeops-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", fmt.Errorf("add envtest user: %w", err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("render kubeconfig: %w", err)
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", fmt.Errorf("write kubeconfig: %w", err)
	}
	return path, nil
}

// AddUser is a client configuration for a user whose client certificate the API server's client CA
// issued, such as a kubelet's: system:node:NAME in group system:nodes.
func (e *Env) AddUser(name string, groups ...string) (*rest.Config, error) {
	user, err := e.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, fmt.Errorf("add envtest user %s: %w", name, err)
	}
	return user.Config(), nil
}

// Logger logs errors only, or everything when NODEOPS_TEST_VERBOSE is set.
func Logger() logr.Logger {
	verbose := os.Getenv("NODEOPS_TEST_VERBOSE") != ""
	return funcr.New(func(prefix, args string) {
		if verbose || strings.Contains(args, `"error"`) {
			fmt.Fprintln(os.Stderr, prefix, args)
		}
	}, funcr.Options{Verbosity: 1})
}

// Eventually polls f every 50ms until it returns nil, failing the test with f's last error
// once timeout has passed. It waits on conditions, never on time alone.
func Eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	EventuallyEvery(t, timeout, 50*time.Millisecond, what, func(context.Context) error { return f() })
}

// EventuallyEvery is Eventually polling every interval, with a context that ends at the deadline
// for f's calls: e2e conditions list hundreds of nodes on a loaded cluster, where a call may hang.
func EventuallyEvery(t testing.TB, timeout, interval time.Duration, what string, f func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := Poll(ctx, interval, f); err != nil {
		t.Fatalf("%s: not true after %s: %v", what, timeout, err)
	}
}

// Poll calls f every interval until it returns nil or ctx ends, and returns f's last error then
// (nil once f returned nil): Eventually for code without a testing.TB, such as TestMain.
func Poll(ctx context.Context, interval time.Duration, f func(ctx context.Context) error) error {
	var err error
	if poll(ctx, interval, func(ctx context.Context) bool {
		ferr := f(ctx)
		// A call cut short by the deadline explains less than the error before it.
		if ferr != nil && (err == nil || ctx.Err() == nil) {
			err = ferr
		}
		return ferr == nil
	}) {
		return nil
	}
	return err
}

// Consistently polls f every 50ms for d, failing the test at f's first error: what must stay true
// for a while (no task created, a node left cordoned).
func Consistently(t testing.TB, d time.Duration, what string, f func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	ConsistentlyUntil(t, ctx, what, f)
}

// ConsistentlyUntil is Consistently until ctx ends, for a condition that holds while something
// else goes on.
func ConsistentlyUntil(t testing.TB, ctx context.Context, what string, f func() error) {
	t.Helper()
	var err error
	poll(ctx, 50*time.Millisecond, func(context.Context) bool {
		err = f()
		return err != nil
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// ConsistentlyUntilObserved polls f every 50ms, failing the test at f's first error, until
// observed returns nil (the controller showed that it decided: an Event, an observed generation),
// checking f once more after that; it fails if nothing is observed within timeout. So a check that
// nothing changed cannot pass by the controller being merely slow.
func ConsistentlyUntilObserved(t testing.TB, timeout time.Duration, what string, f, observed func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var ferr, oerr error
	poll(ctx, 50*time.Millisecond, func(context.Context) bool {
		oerr = observed()
		ferr = f()
		return ferr != nil || oerr == nil
	})
	switch {
	case ferr != nil:
		t.Fatalf("%s: %v", what, ferr)
	case oerr != nil:
		t.Fatalf("%s: the decision not shown within %s: %v", what, timeout, oerr)
	}
}

// poll is the one polling loop: it calls done every interval until it returns true (reported)
// or ctx ends (false), calling it at least once.
func poll(ctx context.Context, interval time.Duration, done func(ctx context.Context) bool) bool {
	for {
		if done(ctx) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(interval):
		}
	}
}

// CRDDocuments are the committed CRDs (config/crd) as plain YAML trees, for tests that walk the
// generated schemas and rules.
func CRDDocuments() ([]any, error) {
	files, err := fs.Glob(config.CRDs, "crd/*.yaml")
	if err != nil {
		return nil, fmt.Errorf("list CRDs: %w", err)
	}
	var docs []any
	for _, name := range files {
		data, err := config.CRDs.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		var doc any
		if err := yaml.Unmarshal(data, &doc); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		docs = append(docs, doc)
	}
	return docs, nil
}
