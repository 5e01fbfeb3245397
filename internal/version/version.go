// Package version is the one source of a nodeops binary's version and revision: `kubectl nodeops
// version`, `manager --version`, `agent --version` and the manager's and agent's build_info series
// all read Get, and `make build` and `make images` (hack/images) stamp the same values the images
// are labelled with.
//
// It holds two strings set at link time; nothing sets them at run time.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Package is this package's import path, the target of the build's -X flags.
const Package = "github.com/nodeops/nodeops/internal/version"

// Unknown is what a binary built without a stamp and without VCS information reports.
const Unknown = "unknown"

// Set only by the linker (go build -ldflags "-X github.com/nodeops/nodeops/internal/version.version=...
// -X ....revision=..."), which can set nothing but package-level strings; never written at run time.
var (
	version  string // git describe --always --dirty
	revision string // the full commit
)

// Info is one build's identity.
type Info struct {
	// Version is the stamped version, else the module version Go recorded, else Unknown.
	Version string
	// Revision is the stamped commit, else the VCS revision Go recorded, else Unknown.
	Revision string
	// Modified is Go's vcs.modified: the tree had uncommitted changes (a stamped version says so
	// itself, with git describe's -dirty).
	Modified  bool
	GoVersion string
}

// Get is this binary's Info: the linker's stamp first, then what Go recorded (go build with VCS
// information, or go install module@version).
func Get() Info {
	i := Info{Version: version, Revision: revision, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && i.Revision == "":
				i.Revision = s.Value
			case s.Key == "vcs.modified" && revision == "":
				i.Modified = s.Value == "true"
			}
		}
	}
	if i.Version == "" {
		i.Version = Unknown
	}
	if i.Revision == "" {
		i.Revision = Unknown
	}
	return i
}

// String is one line for people: "v0.1.0-3-g6351d04 (commit 6351d04abcde), go1.26.8".
func (i Info) String() string {
	s := i.Version
	if i.Revision != Unknown {
		modified := ""
		if i.Modified {
			modified = ", modified"
		}
		s += fmt.Sprintf(" (commit %s%s)", i.Revision[:min(12, len(i.Revision))], modified)
	}
	return s + ", " + i.GoVersion
}
