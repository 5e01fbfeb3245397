package hostfs_test

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/nodeops/nodeops/internal/hostfs"
)

// TestFSRefusesADirectorySwappedForASymlink: a host process that swaps a directory the agent has
// just resolved for a symlink to somewhere outside the root (the race resolve cannot close by
// itself) makes the write, removal, link or rename fail; nothing outside the root changes.
func TestFSRefusesADirectorySwappedForASymlink(t *testing.T) {
	for name, op := range map[string]func(f *hostfs.FS) error{
		"WriteFileAtomic in a new directory": func(f *hostfs.FS) error {
			return f.WriteFileAtomic("/data/sub/new/file", []byte("written"), 0o644)
		},
		"RemoveAll": func(f *hostfs.FS) error { return f.RemoveAll("/data/sub/tree") },
		"KeepPrevious": func(f *hostfs.FS) error {
			return f.KeepPrevious("/data/sub/f", "/data/sub/f.prev")
		},
		"Rename": func(f *hostfs.FS) error { return f.Rename("/data/sub/f", "/data/sub/new/g") },
		"Remove": func(f *hostfs.FS) error { return f.Remove("/data/sub/f") },
	} {
		t.Run(name, func(t *testing.T) {
			base, err := filepath.EvalSymlinks(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
			for _, d := range []string{root + "/data/sub/tree/leaf", outside + "/tree/leaf"} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range []string{root + "/data/sub/f", outside + "/f", outside + "/tree/leaf/x"} {
				write(t, p, "original")
			}
			before := listTree(t, outside)
			f := &hostfs.FS{Root: root}
			swapped := false
			hostfs.SetAfterResolve(f, func(string) {
				if swapped {
					return
				}
				swapped = true
				sub := filepath.Join(root, "data/sub")
				if err := os.Rename(sub, sub+".moved"); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(outside, sub); err != nil {
					t.Fatal(err)
				}
			})
			err = op(f)
			if !swapped {
				t.Fatal("the operation resolved no path")
			}
			if err == nil || !strings.Contains(err.Error(), "symbolic link") {
				t.Errorf("err = %v, want a refusal naming the symbolic link", err)
			}
			if after := listTree(t, outside); strings.Join(after, "\n") != strings.Join(before, "\n") {
				t.Errorf("outside the root changed:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// listTree lists every path under dir with its contents, sorted.
func listTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		entry := strings.TrimPrefix(p, dir)
		if fi.Mode().IsRegular() {
			data, _ := os.ReadFile(p)
			entry += "=" + string(data)
		}
		out = append(out, entry)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}
