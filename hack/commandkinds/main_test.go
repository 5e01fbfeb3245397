package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestGeneratedFileIsCurrent fails when Command gained or lost a kind and the rules were not generated
// again (go generate ./api/..., or make generate, which also refreshes the CRDs).
func TestGeneratedFileIsCurrent(t *testing.T) {
	dir := filepath.Join("..", "..", "api", "v1alpha1")
	kinds, err := Kinds(dir)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Generate(kinds)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, Output))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("%s is stale: run make generate and commit it", filepath.Join("api", "v1alpha1", Output))
	}
}

// A kind is a pointer field to a struct of the package, so options such as a *metav1.Duration are not.
func TestKindsAreCommandsOwnStructPointers(t *testing.T) {
	dir := t.TempDir()
	src := `package v1
import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
type Command struct {
	commandKindRule ` + "`json:\",inline\"`" + `
	Name    string           ` + "`json:\"name,omitempty\"`" + `
	Timeout *metav1.Duration ` + "`json:\"timeout,omitempty\"`" + `
	Alpha   *AlphaCommand    ` + "`json:\"alpha,omitempty\"`" + `
	Beta    *BetaCommand     ` + "`json:\"beta,omitempty\"`" + `
}
type AlphaCommand struct{}
`
	if err := os.WriteFile(filepath.Join(dir, "types.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "beta.go"), []byte("package v1\ntype BetaCommand struct{ X int }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	kinds, err := Kinds(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"alpha", "beta"}; !slices.Equal(kinds, want) {
		t.Fatalf("kinds = %v, want %v", kinds, want)
	}
	rule, message := ExactlyOneRule(kinds)
	if rule != "[has(self.alpha), has(self.beta)].filter(x, x).size() == 1" || message != "exactly one command kind must be set (alpha, beta)" {
		t.Errorf("exactly-one rule = %q, %q", rule, message)
	}
	if rule, _ := UniqueNamesRule(kinds); !strings.Contains(rule, "(has(d.name) ? d.name : has(d.alpha) ? 'alpha' : has(d.beta) ? 'beta' : '') == c.name") {
		t.Errorf("unique-names rule = %q", rule)
	}
}
