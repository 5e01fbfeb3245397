// Package hosttest builds small host roots for tests: a directory with busybox as /bin/sh.
//
// It is for tests only and writes only under the directory it is given.
package hosttest

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

// Busybox is the static busybox the roots are built with.
const Busybox = "/bin/busybox"

// NewRoot makes a temporary host root with /bin/busybox, /bin/sh and a few applets, /etc/os-release
// (Debian) and the given extra files (host path -> content).
func NewRoot(t testing.TB, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	mustMkdir(t, filepath.Join(root, "bin"))
	copyFile(t, Busybox, filepath.Join(root, "bin/busybox"), 0o755)
	for _, applet := range []string{"sh", "echo", "cat", "sleep", "env", "printf", "touch", "mkdir", "ls", "pwd", "sha256sum", "rm", "seq", "wc", "grep", "test", "["} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	all := map[string]string{"/etc/os-release": "ID=debian\nVERSION_ID=\"12\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"}
	for k, v := range files {
		all[k] = v
	}
	for p, content := range all {
		WriteFile(t, root, p, content, 0o644)
	}
	return root
}

// WriteFile writes a host path under root.
func WriteFile(t testing.TB, root, p, content string, mode os.FileMode) {
	t.Helper()
	real := filepath.Join(root, p)
	mustMkdir(t, filepath.Dir(real))
	if err := os.WriteFile(real, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// ReadFile reads a host path under root; "" when it does not exist.
func ReadFile(t testing.TB, root, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, p))
	if os.IsNotExist(err) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustMkdir(t testing.TB, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t testing.TB, src, dst string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
