package v1alpha1

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

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
		{name: "a pod, which an installer may not be safe to run twice", c: Command{Pod: &PodCommand{Image: "busybox"}}, kind: "pod", idempotent: false},
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

// A pod command's timeout bounds its pod; the command's own default leaves a minute more to delete it.
func TestPodCommandTimeouts(t *testing.T) {
	if got := (&Command{Pod: &PodCommand{}}).EffectiveTimeout(); got != DefaultPodTimeout+time.Minute {
		t.Errorf("default EffectiveTimeout %s, want %s", got, DefaultPodTimeout+time.Minute)
	}
	p := &PodCommand{Timeout: &metav1.Duration{Duration: 30 * time.Minute}}
	if p.PodTimeout() != 30*time.Minute || (&Command{Pod: p}).EffectiveTimeout() != 31*time.Minute {
		t.Errorf("PodTimeout %s, EffectiveTimeout %s; want 30m and 31m", p.PodTimeout(), (&Command{Pod: p}).EffectiveTimeout())
	}
	want := "run pod kwasm: /bin/installer --all (privileged, host PID, host / at /host, timeout 30m0s)"
	p = &PodCommand{Image: "kwasm", Command: []string{"/bin/installer"}, Args: []string{"--all"}, Privileged: true, HostPID: true, MountHostRoot: true, Timeout: p.Timeout}
	if got := p.Description(); got != want {
		t.Errorf("Description %q, want %q", got, want)
	}
}
