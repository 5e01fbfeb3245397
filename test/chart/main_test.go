package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// repoRoot is the repository, two directories up from this package.
const repoRoot = "../.."

var (
	chartDir  = filepath.Join(repoRoot, "charts", "nodeops")
	started   = time.Now()
	helmHome  string // HELM_*_HOME, so tests never read or write a person's helm configuration
	toolsHint = "run `make tools` (or hack/tools.sh helm kubernetes), or point NODEOPS_BIN at a directory holding them"
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nodeops-chart-helm-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	helmHome = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	fmt.Printf("test/chart: %s in all\n", time.Since(started).Round(time.Millisecond))
	os.Exit(code)
}

// timed logs how long the test took, and how long the package has run, when it ends.
func timed(t *testing.T) {
	t.Helper()
	start := time.Now()
	t.Cleanup(func() {
		t.Logf("%s took %s (package running for %s)", t.Name(), time.Since(start).Round(time.Millisecond),
			time.Since(started).Round(time.Millisecond))
	})
}

// tool finds a pinned binary in $NODEOPS_BIN, else in the repository's bin/.
func tool(t *testing.T, name string) string {
	t.Helper()
	dirs := []string{filepath.Join(repoRoot, "bin")}
	if d := os.Getenv("NODEOPS_BIN"); d != "" {
		dirs = append([]string{d}, dirs...)
	}
	for _, d := range dirs {
		p, err := filepath.Abs(filepath.Join(d, name))
		if err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	t.Fatalf("%s not found in %v: %s", name, dirs, toolsHint)
	return ""
}

// run runs a tool with args and stdin, returning its combined output and its error.
func run(t *testing.T, stdin io.Reader, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(tool(t, name), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(helmHome, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(helmHome, "config"),
		"HELM_DATA_HOME="+filepath.Join(helmHome, "data"),
	)
	cmd.Stdin = stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// mustRun is run that fails the test when the tool fails.
func mustRun(t *testing.T, stdin io.Reader, name string, args ...string) string {
	t.Helper()
	out, err := run(t, stdin, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// helmTemplate renders the chart as release nodeops in nodeops-system with extra helm flags.
func helmTemplate(t *testing.T, flags ...string) []*unstructured.Unstructured {
	t.Helper()
	args := append([]string{"template", "nodeops", chartDir, "--namespace", "nodeops-system", "--include-crds"}, flags...)
	out, err := run(t, nil, "helm", args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatalf("helm %s: %v", strings.Join(args, " "), err)
	}
	return objs
}

// decode splits a multi-document YAML stream into objects, skipping empty documents.
func decode(s string) ([]*unstructured.Unstructured, error) {
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(s), 4096)
	var objs []*unstructured.Unstructured
	for {
		obj := map[string]any{}
		if err := d.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("decode rendered YAML: %w", err)
		}
		if len(obj) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: obj})
	}
}

// find returns the rendered object of that kind and name, or nil.
func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// key names an object as kind/namespace/name.
func key(o *unstructured.Unstructured) string {
	return o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
}
