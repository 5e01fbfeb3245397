package hostfs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeops/nodeops/internal/hostfs"
)

// A temporary file an earlier download left beside its destination (the agent was killed while
// writing it) is removed by the next write of that destination; others' files are left alone.
func TestCreateTempRemovesTheTempFilesACrashLeft(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "opt/bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, ".shim.nodeops-tmp-0123456789ab")
	other := filepath.Join(dir, ".other.nodeops-tmp-0123456789ab")
	for _, p := range []string{stale, other} {
		write(t, p, strings.Repeat("x", 1024))
	}
	files := &hostfs.FS{Root: root}
	tmp, err := files.CreateTemp("/opt/bin/shim")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmp.Write([]byte("new shim")); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Commit(0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the crashed download's temporary file is still there (%v)", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another destination's temporary file was removed: %v", err)
	}
}

// Removing host path "/" is refused: it would act on the directory that holds the host root.
func TestRemoveRefusesTheRoot(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "host")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	files := &hostfs.FS{Root: root}
	for _, p := range []string{"/", "//", "/."} {
		if err := files.Remove(p); err == nil {
			t.Errorf("Remove(%q) succeeded", p)
		}
		if _, err := os.Stat(root); err != nil {
			t.Fatalf("Remove(%q) removed the host root: %v", p, err)
		}
	}
}
