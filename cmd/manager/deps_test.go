package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The manager decides and the agent acts: the manager binary must not carry the agent's commands,
// its host layer or their systemd and D-Bus clients (docs/architecture.md).
func TestManagerDoesNotLinkTheAgent(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{
		"github.com/nodeops/nodeops/internal/agent",
		"github.com/nodeops/nodeops/internal/host",
		"github.com/coreos/go-systemd",
		"github.com/godbus/dbus",
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 {
		t.Fatalf("go list -deps listed %d packages; expected the manager's whole dependency tree", len(deps))
	}
	for _, d := range deps {
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("the manager links %s", d)
			}
		}
	}
}
