package v1alpha1

import "testing"

func TestCommandKindAndIdempotenceComeFromTheSetKind(t *testing.T) {
	tests := []struct {
		name       string
		c          Command
		kind       string
		idempotent bool
	}{
		{name: "a built-in kind", c: Command{Drain: &DrainCommand{}}, kind: "drain", idempotent: true},
		{name: "a script that says it is idempotent", c: Command{Script: &ScriptCommand{Idempotent: true}}, kind: "script", idempotent: true},
		{name: "a script that does not", c: Command{Script: &ScriptCommand{}}, kind: "script", idempotent: false},
		{name: "no kind set", c: Command{Name: "x"}, kind: "unknown", idempotent: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.c.Kind(); got != tt.kind {
				t.Errorf("Kind = %q, want %q", got, tt.kind)
			}
			if got := tt.c.Idempotent(); got != tt.idempotent {
				t.Errorf("Idempotent = %v, want %v", got, tt.idempotent)
			}
		})
	}
	if (&Command{}).Spec() != nil {
		t.Errorf("Spec of a Command with no kind is not nil")
	}
}
