// Package debroot gives tests a real Debian root: mmdebstrap builds it once from Debian's packages
// (the host's apt sources), it is cached as a tarball under ~/.cache/nodeops/debroot/ keyed by the
// package list, and each test unpacks a fresh copy of it.
package debroot

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Suite is the Debian release the roots are made of.
const Suite = "bookworm"

// building serialises builds in this process: two tests asking for one root build it once.
var building sync.Mutex

// Root returns a fresh Debian root (minbase plus include) in a temporary directory of t, removed
// when t ends. The first call for a package list builds it with mmdebstrap, which takes minutes
// and needs root; the test fails, never skips, when it cannot.
func Root(t testing.TB, include ...string) string {
	t.Helper()
	tarball := cached(t, include)
	dir := t.TempDir()
	start := time.Now()
	if out, err := exec.Command("tar", "-C", dir, "-xf", tarball).CombinedOutput(); err != nil {
		t.Fatalf("unpacking %s: %v: %s", tarball, err, out)
	}
	t.Logf("debroot: unpacked %s into %s in %s", filepath.Base(tarball), dir, time.Since(start).Round(time.Millisecond))
	return dir
}

// cached returns the tarball of the root with include, building it when it is not cached.
func cached(t testing.TB, include []string) string {
	t.Helper()
	pkgs := slices.Clone(include)
	slices.Sort(pkgs)
	pkgs = slices.Compact(pkgs)
	sum := sha256.Sum256([]byte(Suite + " minbase " + strings.Join(pkgs, ",")))
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatalf("debroot: %v", err)
	}
	dir := filepath.Join(home, ".cache", "nodeops", "debroot")
	tarball := filepath.Join(dir, Suite+"-"+hex.EncodeToString(sum[:8])+".tar")
	building.Lock()
	defer building.Unlock()
	if _, err := os.Stat(tarball); err == nil {
		return tarball
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("debroot: %v", err)
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Fatalf("debroot: mmdebstrap is missing (hack/install-deps.sh installs it): %v", err)
	}
	args := []string{"--variant=minbase"}
	if len(pkgs) > 0 {
		args = append(args, "--include="+strings.Join(pkgs, ","))
	}
	tmp := tarball + ".part"
	args = append(args, Suite, tmp)
	t.Logf("debroot: building a Debian %s root with %v (minutes, once; cached at %s)", Suite, pkgs, tarball)
	start := time.Now()
	cmd := exec.Command("mmdebstrap", args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr // progress, as it goes
	if err := cmd.Run(); err != nil {
		_ = os.Remove(tmp)
		t.Fatalf("debroot: mmdebstrap %s: %v", strings.Join(args, " "), err)
	}
	if err := os.Rename(tmp, tarball); err != nil {
		t.Fatalf("debroot: %v", err)
	}
	t.Logf("debroot: built in %s", time.Since(start).Round(time.Second))
	return tarball
}
