// Package examples applies every YAML example the docs show to a real API server with nodeops' CRDs
// and admission policies, as a server-side dry run with strict field validation: an example with a
// field the API does not know, or a value it refuses, fails here before a reader copies it.
package examples

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/internal/testutil"
)

var env *testutil.Env

func TestMain(m *testing.M) {
	var err error
	env, err = testutil.StartWith(testutil.Options{Admission: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// exampleDirs hold the YAML the docs show or link to: the docs' own examples, the samples, and the
// operations the demo applies.
var exampleDirs = []string{"docs/examples", "config/samples", "hack/demo"}

// TestExamplesAreAccepted dry-runs every object of every example file.
func TestExamplesAreAccepted(t *testing.T) {
	root := filepath.Join("..", "..")
	var files []string
	for _, d := range exampleDirs {
		m, err := filepath.Glob(filepath.Join(root, d, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	sort.Strings(files)
	kinds := map[string]bool{}
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		t.Run(rel, func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decode(data)
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) == 0 {
				t.Fatal("no object in the file")
			}
			for _, o := range objs {
				if err := dryRun(context.Background(), o); err != nil {
					t.Errorf("%s %s is refused: %v", o.GetKind(), o.GetName(), err)
				}
				kinds[o.GetKind()+" "+feature(o)] = true
			}
		})
	}
	// The docs need at least these; a removed example must be replaced, not silently lost.
	for _, want := range []string{"NodeOperation custom", "NodeOperation upgrade", "NodeOperation renewCertificates",
		"NodeProfile containerdRuntime", "ClusterTarget autoRenew"} {
		if !kinds[want] {
			t.Errorf("no example of %s among %v", want, kinds)
		}
	}
}

// An example the API would refuse fails the check: an unknown field (strict field validation), a
// value a rule refuses (CEL), and a key written twice.
func TestRefusedExamplesFail(t *testing.T) {
	for name, tc := range map[string]struct{ doc, want string }{
		"unknown field": {`apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata: {name: refused-unknown}
spec:
  upgrade: {kubernetesVersion: v1.37.2, upgradeKubeletAndKubectl: false, maxUnavailable: 1}
`, `unknown field "spec.upgrade.maxUnavailable"`},
		"value a rule refuses": {`apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata: {name: refused-rule}
spec:
  renewCertificates: {}
  maxUnavailable: 0%
`, "must be an integer >= 1 or a percentage"},
		"key written twice": {`apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata: {name: refused-twice}
spec:
  renewCertificates: {}
  paused: true
  paused: false
`, `"paused" already set`},
	} {
		t.Run(name, func(t *testing.T) {
			objs, err := decode([]byte(tc.doc))
			if err == nil {
				err = dryRun(context.Background(), objs[0])
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// decode reads every document of a YAML file, refusing a key written twice (the API would see only
// one of them).
func decode(data []byte) ([]*unstructured.Unstructured, error) {
	r := utilyaml.NewYAMLReader(bufioReader(data))
	var out []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, err
		}
		if s := strings.TrimSpace(string(js)); s == "null" || s == "" {
			continue // a document of comments only
		}
		o := &unstructured.Unstructured{}
		if err := o.UnmarshalJSON(js); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
}

// dryRun creates o as `kubectl apply --dry-run=server --validate=strict` would: nothing is stored,
// but every schema check, CEL rule and admission policy runs.
func dryRun(ctx context.Context, o *unstructured.Unstructured) error {
	return env.Client.Create(ctx, o.DeepCopy(), client.DryRunAll, client.FieldValidation("Strict"))
}

// feature is what an example shows: the operation kind of a NodeOperation, whether a NodeProfile
// configures containerd, whether a ClusterTarget renews certificates on its own.
func feature(o *unstructured.Unstructured) string {
	spec, _, _ := unstructured.NestedMap(o.Object, "spec")
	switch o.GetKind() {
	case "NodeOperation":
		for _, k := range []string{"upgrade", "renewCertificates", "custom"} {
			if _, ok := spec[k]; ok {
				return k
			}
		}
	case "NodeProfile":
		install, _, _ := unstructured.NestedSlice(o.Object, "spec", "install")
		for _, c := range install {
			if m, ok := c.(map[string]any); ok && m["containerdRuntime"] != nil {
				return "containerdRuntime"
			}
		}
	case "ClusterTarget":
		if auto, _, _ := unstructured.NestedBool(o.Object, "spec", "certificates", "autoRenew"); auto {
			return "autoRenew"
		}
	}
	return ""
}

func bufioReader(data []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(data)) }
