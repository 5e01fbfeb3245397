// Package debroot gives tests a real Debian root filesystem made by Debian's mmdebstrap (variant apt,
// so apt, dpkg and apt-mark are there, plus the packages asked for), built once per package list and
// suite, cached as a tarball under ~/.cache/nodeops/debroot/, and unpacked afresh for every test.
//
// It is for tests only: no nodeops binary links it.
package debroot

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Shared is the package list every test of the repository asks Root for (dnf and rpm for
// installPackages' RedHat-family tests, zypper for its SUSE-family test, openrc for the init
// systems' tests): one root, built once per machine, instead of one per test package.
var Shared = []string{"dnf", "openrc", "rpm", "zypper"}

// Root returns a fresh directory holding a Debian root with the packages in include installed
// (besides apt's own), removed when the test ends. The first call for a package list builds the
// root with mmdebstrap from the suite the machine itself runs (minutes, printed); later calls unpack
// the cached tarball (seconds). A machine without mmdebstrap fails the test: hack/install-deps.sh installs it.
func Root(t testing.TB, include ...string) string {
	t.Helper()
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Fatalf("debroot: mmdebstrap is not installed (Debian's mmdebstrap package): run hack/install-deps.sh")
	}
	tarball, err := cached(t, include)
	if err != nil {
		t.Fatalf("debroot: %v", err)
	}
	root := t.TempDir()
	start := time.Now()
	if out, err := exec.Command("tar", "-C", root, "--numeric-owner", "-xpf", tarball).CombinedOutput(); err != nil {
		t.Fatalf("debroot: unpacking %s: %v\n%s", tarball, err, out)
	}
	t.Logf("debroot: unpacked %s into %s in %s", filepath.Base(tarball), root, time.Since(start).Round(time.Millisecond))
	return root
}

// Suite is the Debian suite roots are made from: the machine's own (VERSION_CODENAME in
// /etc/os-release), so mmdebstrap's default mirror serves it; bookworm when there is none.
func Suite() string {
	b, _ := os.ReadFile("/etc/os-release")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VERSION_CODENAME="); ok && strings.Trim(v, `"`) != "" {
			return strings.Trim(v, `"`)
		}
	}
	return "bookworm"
}

// cached returns the tarball of the root for include, building it under a lock when it is missing
// (test packages run in parallel, and two may want the same root).
func cached(t testing.TB, include []string) (string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(home, ".cache", "nodeops", "debroot")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	pkgs := slices.Sorted(slices.Values(include))
	pkgs = slices.Compact(pkgs)
	suite := Suite()
	key := sha256.Sum256([]byte("mmdebstrap --variant=apt " + suite + " " + strings.Join(pkgs, ",")))
	name := fmt.Sprintf("%s-%s-%s.tar", suite, strings.Join(append([]string{"apt"}, pkgs...), "+"), hex.EncodeToString(key[:6]))
	if len(name) > 200 {
		name = fmt.Sprintf("%s-%s.tar", suite, hex.EncodeToString(key[:12]))
	}
	tarball := filepath.Join(dir, name)
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer func() { _ = lock.Close() }()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil { //nolint:gosec // a file descriptor fits an int
		return "", fmt.Errorf("locking %s: %w", dir, err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }() //nolint:gosec // as above
	if _, err := os.Stat(tarball); err == nil {
		return tarball, nil
	}
	args := []string{"--variant=apt", "--quiet"}
	if len(pkgs) > 0 {
		args = append(args, "--include="+strings.Join(pkgs, ","))
	}
	tmp := strings.TrimSuffix(tarball, ".tar") + ".part.tar" // mmdebstrap picks its output format by the extension
	args = append(args, suite, tmp)
	t.Logf("debroot: building a %s root with %s (minutes; cached as %s): mmdebstrap %s", suite, strings.Join(append([]string{"apt"}, pkgs...), ", "), tarball, strings.Join(args, " "))
	start := time.Now()
	var out bytes.Buffer
	cmd := exec.Command("mmdebstrap", args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("mmdebstrap %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	if err := os.Rename(tmp, tarball); err != nil {
		return "", err
	}
	t.Logf("debroot: built %s in %s", filepath.Base(tarball), time.Since(start).Round(time.Second))
	return tarball, nil
}
