// Command immutablerules writes the CEL rules that keep the immutable fields of a NodeOperation's and
// a NodeTask's spec unchanged, for the fields that hold durations anywhere inside them. A client may
// send "90s" and read back what another client wrote as "1m30s": the same duration, a different
// string, so CEL's == on the whole field would refuse an update that changes nothing. Each rule here
// compares field by field, with duration() on every metav1.Duration and == on the rest; lists are
// compared element by element in order (a group's order is its run order). Each rule tries CEL's ==
// on the whole field first: the API server checks these rules on every update, status writes
// included, and an unchanged spec, the common case by far, then costs one comparison instead of
// the walk field by field (at 1,000 nodes the walk cost the API server a quarter of its time).
//
// It writes zz_generated.immutable.go in the API package (go generate in api/v1alpha1, which make
// generate runs). Unlike hack/commandkinds it imports the API package, so it needs the package to
// compile: the generated file holds only markers on empty types, so a stale one still compiles.
package main

import (
	"bytes"
	"fmt"
	"go/format"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Output is the file written beside the API types.
const Output = "zz_generated.immutable.go"

var durationType = reflect.TypeFor[metav1.Duration]()

func main() {
	dir := "."
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	src, err := Generate()
	if err != nil {
		fmt.Fprintln(os.Stderr, "immutablerules:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(filepath.Join(dir, Output), src, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "immutablerules:", err)
		os.Exit(1)
	}
}

// Rule is one immutability rule on a spec type.
type Rule struct {
	Field, Expression, Message string
}

// Rules are the immutability rules of spec type t for its fields that hold a duration, skipping
// mutable (which change after creation and are checked by their own rules). message makes a
// field's message from its JSON name.
func Rules(t reflect.Type, mutable map[string]bool, message func(string) string) []Rule {
	var rules []Rule
	for _, f := range fields(t) {
		if mutable[f.name] || !holdsDuration(f.typ) {
			continue
		}
		a, b := "self."+f.name, "oldSelf."+f.name
		rules = append(rules, Rule{
			Field:      f.name,
			Expression: "has(" + a + ") == has(" + b + ") && (!has(" + a + ") || " + a + " == " + b + " || " + Equal(f.typ, a, b, 0) + ")",
			Message:    message(f.name),
		})
	}
	return rules
}

// Equal is a CEL expression true when a and b, present values of Go type t, are equal, comparing
// durations as durations. depth names the comprehension variables of nested lists apart.
func Equal(t reflect.Type, a, b string, depth int) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == durationType:
		return "duration(" + a + ") == duration(" + b + ")"
	case !holdsDuration(t):
		return a + " == " + b
	case t.Kind() == reflect.Slice:
		i, x := fmt.Sprintf("i%d", depth), fmt.Sprintf("x%d", depth)
		return a + ".size() == " + b + ".size() && " + a + ".all(" + i + ", " + x + ", " + Equal(t.Elem(), x, b+"["+i+"]", depth+1) + ")"
	case t.Kind() == reflect.Struct:
		var terms []string
		for _, f := range fields(t) {
			fa, fb := a+"."+f.name, b+"."+f.name
			terms = append(terms, "has("+fa+") == has("+fb+") && (!has("+fa+") || "+Equal(f.typ, fa, fb, depth)+")")
		}
		return "(" + strings.Join(terms, " && ") + ")"
	}
	panic(fmt.Sprintf("immutablerules: no comparison for %s holding a duration", t))
}

type field struct {
	name string
	typ  reflect.Type
}

// fields are t's JSON fields, those of inline embedded structs flattened into it.
func fields(t reflect.Type) []field {
	var out []field
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			out = append(out, fields(ft)...)
			continue
		}
		if !f.IsExported() || name == "" {
			continue
		}
		out = append(out, field{name: name, typ: f.Type})
	}
	return out
}

// holdsDuration says whether a value of t can hold a metav1.Duration anywhere inside it.
func holdsDuration(t reflect.Type) bool {
	return holds(t, map[reflect.Type]bool{})
}

func holds(t reflect.Type, seen map[reflect.Type]bool) bool {
	if t == durationType {
		return true
	}
	if seen[t] {
		return false
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Map:
		return holds(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if holds(t.Field(i).Type, seen) {
				return true
			}
		}
	}
	return false
}

// Generate is the Go source of the generated file.
func Generate() ([]byte, error) {
	immutable := func(name string) string { return name + " is immutable" }
	op := Rules(reflect.TypeFor[v1alpha1.NodeOperationSpec](), map[string]bool{}, immutable)
	task := Rules(reflect.TypeFor[v1alpha1.NodeTaskSpec](), map[string]bool{}, func(name string) string {
		if name == "commands" {
			return "commands are immutable"
		}
		return immutable(name)
	})
	var b bytes.Buffer
	b.WriteString(`// Code generated by hack/immutablerules from the spec types. DO NOT EDIT.

package v1alpha1

`)
	markers(&b, op)
	b.WriteString(`
// operationImmutableRules carries the rules above, that NodeOperationSpec's fields holding durations
// do not change, durations compared as durations; NodeOperationSpec embeds it.
type operationImmutableRules struct{}

`)
	markers(&b, task)
	b.WriteString(`
// taskImmutableRules carries the rules above for NodeTaskSpec, which embeds it.
type taskImmutableRules struct{}
`)
	return format.Source(b.Bytes())
}

// markers writes one marker a rule, all in one comment group apart from the type's doc comment
// (controller-gen reads that one group above the doc; gofmt would turn an empty CEL string in a doc
// comment into a typographic quote, see hack/commandkinds).
func markers(b *bytes.Buffer, rules []Rule) {
	for _, r := range rules {
		fmt.Fprintf(b, "// +kubebuilder:validation:XValidation:rule=%s,message=%s,fieldPath=%s\n",
			strconv.Quote(r.Expression), strconv.Quote(r.Message), strconv.Quote("."+r.Field))
	}
}
