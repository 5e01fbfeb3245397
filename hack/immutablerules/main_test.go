package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// The API server checks these rules on every update of a NodeTask or a NodeOperation, status
// writes included, and on an unchanged spec (nearly every update) a rule that walks the field
// field by field cost the API server a quarter of its CPU at 1,000 nodes (bench/results-k1000-ab.md).
// So each rule compares the whole field with == first and walks it only when that fails.
func TestEachRuleComparesTheWholeFieldFirst(t *testing.T) {
	for _, spec := range []reflect.Type{reflect.TypeFor[v1alpha1.NodeTaskSpec](), reflect.TypeFor[v1alpha1.NodeOperationSpec]()} {
		rules := Rules(spec, map[string]bool{}, func(n string) string { return n })
		if len(rules) == 0 {
			t.Fatalf("%s: no rules generated", spec.Name())
		}
		for _, r := range rules {
			a, b := "self."+r.Field, "oldSelf."+r.Field
			want := "has(" + a + ") == has(" + b + ") && (!has(" + a + ") || " + a + " == " + b + " || "
			if !strings.HasPrefix(r.Expression, want) {
				t.Errorf("%s.%s: rule does not begin with the whole field's comparison %q:\n%s", spec.Name(), r.Field, want, r.Expression)
			}
		}
	}
}
