package cmdgate_test

import (
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/cmdgate"
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/objname"
)

// An operation's check keeps the name it always had; a profile's check has a name none of the
// profile's install or uninstall tasks can have, and is a gate check by IsGateCheck.
func TestCheckNames(t *testing.T) {
	if got, want := cmdgate.Name("op", "workers", "resync", 3, "n1"), objname.TaskName("op", "workers.gate.resync.3", "n1"); got != want {
		t.Errorf("operation check name %s, want %s", got, want)
	}
	g := &v1alpha1.Gate{Name: "resync", Command: &v1alpha1.CommandGate{Script: "true"}}
	for _, profile := range []string{"p", "wasm-shims", "a-very-long-profile-name-that-is-shortened-by-its-hash"} {
		check := cmdgate.Build(cmdgate.Owner{Kind: "NodeProfile", Name: profile, UID: "u"}, "", g, "n1", "n1", 1)
		if !v1alpha1.IsGateCheck(check) {
			t.Errorf("%s: a profile's check is no gate check", profile)
		}
		if _, ok := nodeprofile.ViewTask(check); ok {
			t.Errorf("%s: a profile's check reads as one of its install or uninstall tasks", profile)
		}
		for _, a := range []nodeprofile.Action{nodeprofile.ActionInstall, nodeprofile.ActionUninstall} {
			for _, hash := range []string{"abc", "gate", "resync.1"} {
				if task := nodeprofile.TaskName(profile, a, hash, "n1"); task == check.Name {
					t.Errorf("%s: check %s has the name of the %s task at hash %s", profile, check.Name, a, hash)
				}
			}
		}
	}
}
