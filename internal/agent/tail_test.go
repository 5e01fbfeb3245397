package agent

import (
	"strings"
	"testing"
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
