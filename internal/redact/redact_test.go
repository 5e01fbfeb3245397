package redact

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	s := &Secrets{}
	s.Add("hunter2", "hunter2-long-form", "", "-----BEGIN KEY-----\nAAAA1111\n-----END KEY-----")
	tests := []struct{ in, want string }{
		{"password is hunter2.", "password is [redacted]."},
		{"token hunter2-long-form here", "token [redacted] here"},
		{"twice: hunter2 hunter2", "twice: [redacted] [redacted]"},
		{"a line of the key: AAAA1111", "a line of the key: [redacted]"},
		{"fetching https://admin:s3cret@mirror.local/x failed", "fetching https://[redacted]@mirror.local/x failed"},
		{"git clone https://ghp_token@github.example/r.git", "git clone https://[redacted]@github.example/r.git"},
		{"mail a@b.example, https://mirror.local/a@b", "mail a@b.example, https://mirror.local/a@b"},
		{"nothing secret", "nothing secret"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := s.String(tt.in); got != tt.want {
			t.Errorf("String(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	var none *Secrets
	if got := none.String("http://u:p@h/ and hunter2"); got != "http://[redacted]@h/ and hunter2" {
		t.Errorf("nil Secrets: %q", got)
	}
	if got := (&Secrets{}).String("ftp://u:p@h/"); got != "ftp://[redacted]@h/" {
		t.Errorf("zero Secrets: %q", got)
	}
}

func TestTailMasksASecretCutInTwo(t *testing.T) {
	s := &Secrets{}
	s.Add("correct-horse-battery")
	if got := s.Tail("battery staple, then correct-horse-battery"); got != "[redacted] staple, then [redacted]" {
		t.Errorf("Tail = %q", got)
	}
	if got := s.Tail("no secret here"); got != "no secret here" {
		t.Errorf("Tail = %q", got)
	}
}

func TestErrorKeepsItsCause(t *testing.T) {
	s := &Secrets{}
	s.Add("hunter2")
	cause := &exec.ExitError{}
	err := s.Error(fmt.Errorf("script printed hunter2: %w", cause))
	if strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), Mask) {
		t.Errorf("Error() = %q", err)
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Errorf("the redacted error no longer unwraps to its cause")
	}
	if s.Error(nil) != nil {
		t.Error("Error(nil) is not nil")
	}
}
