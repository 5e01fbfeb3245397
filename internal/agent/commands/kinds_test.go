package commands_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/testutil"
)

// The messages of the CEL rules that name every kind (hack/commandkinds generates both), which is how
// the CRDs' rules are found: exactly one kind on Command, and unique names on each list of commands.
const (
	celMessagePrefix    = "exactly one command kind must be set"
	uniqueMessagePrefix = "command names must be unique"
)

// TestEveryCommandKindIsComplete walks Command: each kind must define itself on its type (name,
// idempotence, description, default timeout, and its effects: whether it disrupts its node, downloads
// over plain http, drains, reads Secrets), have a handler, and a place in the CEL rules of every CRD
// that embeds Command.
func TestEveryCommandKindIsComplete(t *testing.T) {
	// Command appears in every CRD (tasks, operations' groups, profiles), all from the one marker.
	rules := slices.Compact(slices.Sorted(slices.Values(commandRules(t, celMessagePrefix))))
	switch {
	case len(rules) == 0:
		t.Fatalf("no rule with message %q in config.CRDs", celMessagePrefix)
	case len(rules) > 1:
		t.Errorf("the CRDs' rules on Command differ (run make generate):\n%s", strings.Join(rules, "\n\n"))
	}
	for _, ruleAndMessage := range rules {
		rule, message, _ := strings.Cut(ruleAndMessage, "\n")
		for _, problem := range checkKinds(reflect.TypeFor[v1alpha1.Command](), commands.Handlers(), rule) {
			t.Error(problem)
		}
		words := strings.FieldsFunc(message, func(r rune) bool { return strings.ContainsRune(" ,()", r) })
		for _, f := range kindFields(reflect.TypeFor[v1alpha1.Command]()) {
			if !slices.Contains(words, jsonName(f)) {
				t.Errorf("kind %q: the CEL rule's message %q does not list it", jsonName(f), message)
			}
		}
	}
	// Every list of commands (a group's, a task's, a profile's install and uninstall) takes a nameless
	// command's name from its kind, so each kind, and only a kind, has its case in that rule.
	unique := slices.Compact(slices.Sorted(slices.Values(commandRules(t, uniqueMessagePrefix))))
	if len(unique) != 1 {
		t.Fatalf("want one rule with message %q in config.CRDs (run make generate), got %d:\n%s", uniqueMessagePrefix, len(unique), strings.Join(unique, "\n\n"))
	}
	rule, _, _ := strings.Cut(unique[0], "\n")
	kinds := map[string]bool{}
	for _, f := range kindFields(reflect.TypeFor[v1alpha1.Command]()) {
		kinds[jsonName(f)] = true
		if c := fmt.Sprintf("has(d.%s) ? '%s'", jsonName(f), jsonName(f)); !strings.Contains(rule, c) {
			t.Errorf("kind %q: the unique-names rule has no %q, so a nameless command of it is not checked", jsonName(f), c)
		}
	}
	for _, part := range strings.Split(rule, "has(d.")[2:] { // the first is has(d.name)
		if name, _, _ := strings.Cut(part, ")"); !kinds[name] {
			t.Errorf("the unique-names rule names has(d.%s), which is no kind of command", name)
		}
	}
	// Spec, Kind and Idempotent find each kind through the fields, without a case of their own.
	for _, f := range kindFields(reflect.TypeFor[v1alpha1.Command]()) {
		var c v1alpha1.Command
		reflect.ValueOf(&c).Elem().FieldByIndex(f.Index).Set(reflect.New(f.Type.Elem()))
		if got, want := c.Kind(), jsonName(f); got != want {
			t.Errorf("Command with %s set has Kind %q, want %q", f.Name, got, want)
		}
	}
}

// TestCheckKindsFindsEachMissingPiece runs the check on a Command with kinds made incomplete on purpose.
func TestCheckKindsFindsEachMissingPiece(t *testing.T) {
	handlers := map[string]commands.Handler{"complete": noop, "misnamed": noop, "stale": noop}
	rule := "[has(self.complete), has(self.misnamed), has(self.removed)].filter(x, x).size() == 1"
	got := checkKinds(reflect.TypeFor[fakeCommand](), handlers, rule)
	want := []string{
		`kind "bare" (commands_test.fakeBare): no KindName method`,
		`kind "bare" (commands_test.fakeBare): no IsIdempotent method`,
		`kind "bare" (commands_test.fakeBare): no Description method`,
		`kind "bare" (commands_test.fakeBare): no DefaultTimeout method`,
		`kind "bare" (commands_test.fakeBare): no Effects method`,
		`kind "bare" (commands_test.fakeBare): does not implement v1alpha1.CommandKind, so Command.Spec cannot see it`,
		`kind "bare": no handler in the agent's table`,
		`kind "bare": the CEL rule on Command does not name has(self.bare)`,
		`kind "misnamed" (commands_test.fakeMisnamed): KindName is "other", want its JSON field name "misnamed"`,
		`kind "misnamed" (commands_test.fakeMisnamed): empty Description, so the CLI has no text for it`,
		`kind "misnamed" (commands_test.fakeMisnamed): Effects().Disruption is "": say whether the kind is Disruptive, NonDisruptive or Restoring`,
		`kind "misnamed" (commands_test.fakeMisnamed): DefaultTimeout is not a positive time.Duration, so a command of this kind without a timeout could run forever`,
		`the agent's table has a handler for "stale", which is no kind of command`,
		`the CEL rule on Command names has(self.removed), which is no kind of command`,
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// checkKinds lists what the command kinds of commandType lack. Its kinds are its pointer fields to
// types of its own package (Timeout, a *metav1.Duration, is an option, not a kind).
func checkKinds(commandType reflect.Type, handlers map[string]commands.Handler, celRule string) []string {
	var problems []string
	kindIface := reflect.TypeFor[v1alpha1.CommandKind]()
	kinds := map[string]bool{}
	for _, f := range kindFields(commandType) {
		name, typ := jsonName(f), reflect.PointerTo(f.Type.Elem())
		kinds[name] = true
		where := fmt.Sprintf("kind %q (%s)", name, f.Type.Elem())
		zero := reflect.New(f.Type.Elem())
		for _, m := range []string{"KindName", "IsIdempotent", "Description", "DefaultTimeout", "Effects"} {
			if _, ok := typ.MethodByName(m); !ok {
				problems = append(problems, fmt.Sprintf("%s: no %s method", where, m))
			}
		}
		if !typ.Implements(kindIface) {
			problems = append(problems, where+": does not implement v1alpha1.CommandKind, so Command.Spec cannot see it")
		} else {
			k := zero.Interface().(v1alpha1.CommandKind)
			if k.KindName() != name {
				problems = append(problems, fmt.Sprintf("%s: KindName is %q, want its JSON field name %q", where, k.KindName(), name))
			}
			if k.Description() == "" {
				problems = append(problems, where+": empty Description, so the CLI has no text for it")
			}
			// The zero value says nothing: a kind must choose, so onlyRestores never guesses for it.
			if d := k.Effects().Disruption; !slices.Contains([]v1alpha1.Disruption{v1alpha1.Disruptive, v1alpha1.NonDisruptive, v1alpha1.Restoring}, d) {
				problems = append(problems, fmt.Sprintf("%s: Effects().Disruption is %q: say whether the kind is Disruptive, NonDisruptive or Restoring", where, d))
			}
		}
		// every command has a timeout (rule 12), its kind's when it sets none.
		if m, ok := typ.MethodByName("DefaultTimeout"); ok {
			if d, ok := m.Func.Call([]reflect.Value{zero})[0].Interface().(time.Duration); !ok || d <= 0 {
				problems = append(problems, where+": DefaultTimeout is not a positive time.Duration, so a command of this kind without a timeout could run forever")
			}
		}
		if _, ok := handlers[name]; !ok {
			problems = append(problems, fmt.Sprintf("kind %q: no handler in the agent's table", name))
		}
		if !strings.Contains(celRule, "has(self."+name+")") {
			problems = append(problems, fmt.Sprintf("kind %q: the CEL rule on Command does not name has(self.%s)", name, name))
		}
	}
	for name := range handlers {
		if !kinds[name] {
			problems = append(problems, fmt.Sprintf("the agent's table has a handler for %q, which is no kind of command", name))
		}
	}
	for _, part := range strings.Split(celRule, "has(self.")[1:] {
		if name, _, _ := strings.Cut(part, ")"); !kinds[name] {
			problems = append(problems, fmt.Sprintf("the CEL rule on Command names has(self.%s), which is no kind of command", name))
		}
	}
	return problems
}

func kindFields(commandType reflect.Type) []reflect.StructField {
	var out []reflect.StructField
	for i := range commandType.NumField() {
		f := commandType.Field(i)
		if f.Type.Kind() == reflect.Pointer && f.Type.Elem().PkgPath() == commandType.PkgPath() {
			out = append(out, f)
		}
	}
	return out
}

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}

// commandRules are the rules in the generated CRDs whose message starts with prefix, one per place
// they appear, each as its rule, a newline, and its message.
func commandRules(t *testing.T, prefix string) []string {
	t.Helper()
	docs, err := testutil.CRDDocuments()
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	for _, doc := range docs {
		rules = append(rules, findRules(doc, prefix)...)
	}
	return rules
}

func findRules(node any, prefix string) []string {
	var rules []string
	switch n := node.(type) {
	case map[string]any:
		if vs, ok := n["x-kubernetes-validations"].([]any); ok {
			for _, v := range vs {
				if v, ok := v.(map[string]any); ok {
					if msg, _ := v["message"].(string); strings.HasPrefix(msg, prefix) {
						rule, _ := v["rule"].(string)
						rules = append(rules, rule+"\n"+msg)
					}
				}
			}
		}
		for _, v := range n {
			rules = append(rules, findRules(v, prefix)...)
		}
	case []any:
		for _, v := range n {
			rules = append(rules, findRules(v, prefix)...)
		}
	}
	return rules
}

func noop(context.Context, *commands.Env, v1alpha1.CommandKind) (commands.Result, error) {
	return commands.Result{}, nil
}

// fakeCommand is a Command with one complete kind and two incomplete ones.
type fakeCommand struct {
	Name     string           `json:"name,omitempty"`
	Timeout  *metav1.Duration `json:"timeout,omitempty"`
	Complete *fakeComplete    `json:"complete,omitempty"`
	Bare     *fakeBare        `json:"bare,omitempty"`
	Misnamed *fakeMisnamed    `json:"misnamed,omitempty"`
}

type fakeComplete struct{}

func (*fakeComplete) KindName() string    { return "complete" }
func (*fakeComplete) IsIdempotent() bool  { return true }
func (*fakeComplete) Description() string { return "does it all" }

func (*fakeComplete) DefaultTimeout() time.Duration { return time.Minute }
func (*fakeComplete) Effects() v1alpha1.CommandEffects {
	return v1alpha1.CommandEffects{Disruption: v1alpha1.NonDisruptive}
}

type fakeBare struct{}

type fakeMisnamed struct{}

func (*fakeMisnamed) KindName() string    { return "other" }
func (*fakeMisnamed) IsIdempotent() bool  { return false }
func (*fakeMisnamed) Description() string { return "" }

func (*fakeMisnamed) DefaultTimeout() time.Duration    { return 0 }
func (*fakeMisnamed) Effects() v1alpha1.CommandEffects { return v1alpha1.CommandEffects{} }
