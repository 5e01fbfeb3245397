package hostfs_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeops/nodeops/internal/hostfs"
)

// confinedRoot is a host root beside a directory "outside" holding a secret, with the links an
// attacker (or a careless manifest) would use to reach it, and the links a Debian root really has.
func confinedRoot(t testing.TB) (root, outside string) {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{root + "/etc", root + "/usr/bin", root + "/usr/lib", root + "/var/lib", root + "/etc/alternatives", outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(outside, "secret"), "outside")
	write(t, filepath.Join(outside, "shadow"), "outside shadow")
	write(t, filepath.Join(root, "etc/shadow"), "the node's shadow")
	write(t, filepath.Join(root, "usr/bin/vim.basic"), "vim")
	for link, target := range map[string]string{
		"etc/evil":               "/etc/shadow",               // absolute: the node's own /etc/shadow
		"etc/abs-out":            outside + "/secret",         // absolute, naming the real outside file
		"etc/up":                 "../../outside/secret",      // relative, climbing out of the root
		"opt":                    outside,                     // a directory in the middle, absolute
		"var/lib/up":             "../../../outside",          // a directory in the middle, relative
		"bin":                    "usr/bin",                   // Debian's merged /usr
		"lib":                    "usr/lib",                   //
		"etc/alternatives/vi":    "/usr/bin/vim.basic",        // absolute and inside: fine
		"etc/loop-a":             "loop-b",                    // a loop
		"etc/loop-b":             "loop-a",                    //
		"etc/dangling-out":       outside + "/new",            // final, dangling, outside
		"etc/up-dangling":        "../../../../outside/new-2", //
		"usr/lib/os-release-ref": "../../etc/os-release",      // relative and inside
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(root, "etc/os-release"), "ID=debian\n")
	return root, outside
}

func write(t testing.TB, p, data string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestFSResolvesSymlinksInsideTheRoot(t *testing.T) {
	root, _ := confinedRoot(t)
	f := &hostfs.FS{Root: root}
	tests := []struct {
		in, want string // want is the host path the result names; empty: an error
	}{
		{"/etc/evil", "/etc/shadow"},
		{"/etc/abs-out", filepath.Join(filepath.Dir(root), "outside/secret")},
		{"/etc/up", "/outside/secret"},
		{"/opt/secret", filepath.Join(filepath.Dir(root), "outside/secret")},
		{"/var/lib/up/secret", "/outside/secret"},
		{"/bin/vim.basic", "/usr/bin/vim.basic"},
		{"/etc/alternatives/vi", "/usr/bin/vim.basic"},
		{"/usr/lib/os-release-ref", "/etc/os-release"},
		{"/etc/dangling-out", filepath.Join(filepath.Dir(root), "outside/new")},
		{"/etc/up-dangling", "/outside/new-2"},
		{"/etc/loop-a", ""},
		{"/etc/../../outside/secret", ""},
		{"/..", ""},
		{"etc/shadow", ""},
	}
	for _, tt := range tests {
		got, err := f.Path(tt.in)
		if tt.want == "" {
			if err == nil {
				t.Errorf("Path(%q) = %q, want an error", tt.in, got)
			}
			continue
		}
		if want := filepath.Join(root, tt.want); err != nil || got != want {
			t.Errorf("Path(%q) = %q, %v; want %q", tt.in, got, err, want)
		}
	}
}

// TestFSNeverTouchesOutside does what commands do through each escaping link and checks that the
// outside directory is as it was, while the same operations work through the root's own links.
func TestFSNeverTouchesOutside(t *testing.T) {
	root, outside := confinedRoot(t)
	f := &hostfs.FS{Root: root}
	for _, p := range []string{"/etc/abs-out", "/etc/up", "/opt/secret", "/var/lib/up/secret"} {
		if data, err := f.ReadFile(p); err == nil && string(data) == "outside" {
			t.Errorf("ReadFile(%q) read the file outside the root", p)
		}
	}
	if data, err := f.ReadFile("/etc/evil"); err != nil || string(data) != "the node's shadow" {
		t.Errorf("ReadFile(/etc/evil) = %q, %v; want the root's /etc/shadow", data, err)
	}
	writes := []string{"/etc/abs-out", "/etc/up", "/opt/secret", "/var/lib/up/secret", "/etc/dangling-out", "/etc/up-dangling", "/opt/newdir/file"}
	for _, p := range writes {
		if err := f.WriteFileAtomic(p, []byte("written"), 0o600); err != nil {
			t.Errorf("WriteFileAtomic(%q): %v", p, err)
		}
		if err := f.Chmod(p, 0o777); err != nil {
			t.Errorf("Chmod(%q): %v", p, err)
		}
		tmp, err := f.CreateTemp(p)
		if err != nil {
			t.Errorf("CreateTemp(%q): %v", p, err)
		} else {
			_, _ = tmp.Write([]byte("temp"))
			if err := tmp.Commit(0o600); err != nil {
				t.Errorf("Commit(%q): %v", p, err)
			}
		}
		if err := f.KeepPrevious(p, p+".prev"); err != nil {
			t.Errorf("KeepPrevious(%q): %v", p, err)
		}
	}
	if err := f.Rename("/etc/up", "/opt/renamed"); err != nil {
		t.Errorf("Rename: %v", err)
	}
	for _, p := range []string{"/etc/abs-out", "/opt/secret", "/var/lib/up/secret", "/opt"} {
		if err := f.Remove(p); err != nil && !strings.Contains(err.Error(), "directory not empty") {
			t.Errorf("Remove(%q): %v", p, err)
		}
	}
	if err := f.RemoveAll("/var/lib/up"); err != nil {
		t.Errorf("RemoveAll: %v", err)
	}
	entries, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "secret,shadow" {
		t.Errorf("outside the root now holds %v, want only secret and shadow", names)
	}
	for name, want := range map[string]string{"secret": "outside", "shadow": "outside shadow"} {
		fi, err := os.Stat(filepath.Join(outside, name))
		data, _ := os.ReadFile(filepath.Join(outside, name))
		if err != nil || string(data) != want || fi.Mode().Perm() != 0o644 {
			t.Errorf("outside/%s changed: %q, %v", name, data, fi.Mode())
		}
	}
	// The writes landed inside the root, where the links say when read as a chroot reads them.
	if data, err := os.ReadFile(filepath.Join(root, outside, "newdir/file")); err != nil || string(data) != "temp" {
		t.Errorf("/opt/newdir/file did not land under the root's %s: %q, %v", outside, data, err)
	}
	if data, err := os.ReadFile(filepath.Join(root, "outside/new-2")); err != nil || string(data) != "temp" {
		t.Errorf("/etc/up-dangling did not land at the root's /outside/new-2: %q, %v", data, err)
	}
}

func TestFSFollowsTheRootsOwnLinks(t *testing.T) {
	root, _ := confinedRoot(t)
	f := &hostfs.FS{Root: root}
	if err := f.WriteFileAtomic("/bin/kubeadm", []byte("new kubeadm"), 0o755); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(root, "usr/bin/kubeadm")); err != nil || string(data) != "new kubeadm" {
		t.Errorf("/bin/kubeadm did not land in /usr/bin: %q, %v", data, err)
	}
	if fi, err := os.Lstat(filepath.Join(root, "bin")); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("/bin is no longer a link: %v, %v", fi, err)
	}
	if data, err := f.ReadFile("/etc/alternatives/vi"); err != nil || string(data) != "vim" {
		t.Errorf("ReadFile through an absolute link inside the root = %q, %v", data, err)
	}
	// Writing through a final link writes its target and keeps the link.
	if err := f.WriteFileAtomic("/etc/alternatives/vi", []byte("vim 2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(root, "usr/bin/vim.basic")); string(data) != "vim 2" {
		t.Errorf("the link's target = %q, want the new content", data)
	}
	if target, err := os.Readlink(filepath.Join(root, "etc/alternatives/vi")); err != nil || target != "/usr/bin/vim.basic" {
		t.Errorf("the link = %q, %v", target, err)
	}
	// Removing a link removes the link, not what it names.
	if err := f.Remove("/etc/evil"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/evil")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the link is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/shadow")); err != nil {
		t.Errorf("removing the link removed its target: %v", err)
	}
}

// FuzzResolve: whatever the path asked for and wherever a link in the root points, FS.Path either
// refuses or names something inside the root, and the kernel, following the result, stays inside too.
func FuzzResolve(f *testing.F) {
	for _, seed := range [][2]string{
		{"/etc/evil", "/etc/shadow"},
		{"/l/secret", "../../outside"},
		{"/l", "../../../../outside/secret"},
		{"/l/x/y", "/opt"},
		{"/var/lib/up/secret", "l"},
		{"/bin/../l", "."},
		{"//l/./a", "/l/a"},
		{"/l", "/"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, p, target string) {
		root, _ := confinedRoot(t)
		if err := os.Symlink(target, filepath.Join(root, "l")); err != nil {
			t.Skip(err)
		}
		fsys := &hostfs.FS{Root: root}
		got, err := fsys.Path(p)
		if err != nil {
			return
		}
		inside := func(q string) bool { return q == root || strings.HasPrefix(q, root+"/") }
		if !inside(got) {
			t.Fatalf("Path(%q) with /l -> %q = %q, outside %s", p, target, got, root)
		}
		if real, err := filepath.EvalSymlinks(got); err == nil && !inside(real) {
			t.Fatalf("Path(%q) with /l -> %q = %q, which the kernel resolves to %q, outside the root", p, target, got, real)
		}
		// ReadFile has the kernel resolve p again (openat2, RESOLVE_IN_ROOT): it must find the same file.
		want, wantErr := os.ReadFile(got)
		data, err := fsys.ReadFile(p)
		if (wantErr == nil) != (err == nil) || !bytes.Equal(data, want) {
			t.Fatalf("ReadFile(%q) with /l -> %q = %q, %v; the file at %q holds %q, %v", p, target, data, err, got, want, wantErr)
		}
	})
}

// TestFSWritesWithARelativeRoot: the directory descriptors writes use are found from a root given
// relative and unclean, as --host-root may be.
func TestFSWritesWithARelativeRoot(t *testing.T) {
	root, _ := confinedRoot(t)
	t.Chdir(filepath.Dir(root))
	f := &hostfs.FS{Root: "./root/"}
	if err := f.WriteFileAtomic("/bin/tool", []byte("tool"), 0o755); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(root, "usr/bin/tool")); err != nil || string(data) != "tool" {
		t.Errorf("/bin/tool = %q, %v", data, err)
	}
	if err := f.Remove("/bin/tool"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/bin/tool")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Remove left /usr/bin/tool: %v", err)
	}
	if err := f.Remove("/etc"); err == nil {
		t.Errorf("Remove of a full directory succeeded")
	}
}
