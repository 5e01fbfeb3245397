package agent

import (
	"strings"
	"testing"

	"github.com/nodeops/nodeops/internal/redact"
)

func TestTailBuffer(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		want   string
	}{
		{"short output kept whole", []string{"hello\n", "world\n"}, "hello\nworld\n"},
		{"colour codes removed", []string{"\x1b[0;32m[upgrade] done\x1b[0m\n"}, "[upgrade] done\n"},
		{"long output keeps the end", []string{strings.Repeat("a", TailSize), "end"}, strings.Repeat("a", TailSize-3) + "end"},
		{"cut on a character boundary", []string{"é" + strings.Repeat("b", TailSize-1)}, strings.Repeat("b", TailSize-1)},
	}
	for _, tt := range tests {
		var b tailBuffer
		for _, w := range tt.writes {
			_, _ = b.Write([]byte(w))
		}
		if got := b.String(); got != tt.want {
			t.Errorf("%s: got %q (%d bytes), want %d bytes", tt.name, got[:min(len(got), 40)], len(got), len(tt.want))
		}
	}
}

// A secret is redacted wherever it lands in the output, also when the start of the output is
// dropped through the middle of it.
func TestTailBufferRedactsSecrets(t *testing.T) {
	secret := "s3cret-" + strings.Repeat("x", 90)
	for cut := 1; cut < len(secret); cut += 7 {
		secrets := &redact.Secrets{}
		secrets.Add(secret)
		tb := &tailBuffer{secrets: secrets}
		// Fill so that the buffer keeps only its last TailSize bytes, which start cut bytes into the secret.
		_, _ = tb.Write([]byte(strings.Repeat("a", TailSize+1-cut)))
		_, _ = tb.Write([]byte(secret))
		_, _ = tb.Write([]byte(strings.Repeat("b", TailSize-len(secret)+cut)))
		_, _ = tb.Write([]byte(" then " + secret + " and https://u:pw@h/x"))
		got := tb.String()
		if strings.Contains(got, secret[len(secret)-10:]) || strings.Contains(got, "u:pw@") {
			t.Fatalf("cut %d: tail shows the secret:\n%q", cut, got[:80]+" ... "+got[len(got)-80:])
		}
		if !strings.HasSuffix(got, " then [redacted] and https://[redacted]@h/x") {
			t.Fatalf("cut %d: tail ends %q", cut, got[len(got)-60:])
		}
	}
}
