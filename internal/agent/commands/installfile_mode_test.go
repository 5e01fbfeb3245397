package commands

import (
	"io/fs"
	"testing"
)

func TestParseModeKeepsSpecialBits(t *testing.T) {
	for in, want := range map[string]fs.FileMode{
		"":      0o644,
		"0755":  0o755,
		"644":   0o644,
		"4755":  0o755 | fs.ModeSetuid,
		"02755": 0o755 | fs.ModeSetgid,
		"1777":  0o777 | fs.ModeSticky,
	} {
		if got, err := parseMode(in, 0o644); err != nil || got != want {
			t.Errorf("parseMode(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"0855", "77777", "rwx"} {
		if _, err := parseMode(bad, 0o644); err == nil {
			t.Errorf("parseMode(%q) succeeded", bad)
		}
	}
}
