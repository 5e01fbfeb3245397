// Package hostfs is the agent's view of the host's files: every path is a host path resolved inside a
// root (the host's / as the agent's pod mounts it), symbolic links followed as the host would and
// never out of the root. It imports nothing of nodeops or Kubernetes, so that its fuzz target
// (FuzzResolve) builds in seconds.
package hostfs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Files is the host's files as commands see them. *FS changes them; host.DryRunFiles reads through and
// reports each change instead of making it.
type Files interface {
	// Path is where host path p is under the root; it fails for paths that are not absolute or escape.
	Path(p string) (string, error)
	ReadFile(p string) ([]byte, error)
	Open(p string) (io.ReadCloser, error)
	Stat(p string) (fs.FileInfo, error)
	Exists(p string) bool
	ReadDir(p string) ([]fs.DirEntry, error)
	FreeBytes(p string) (uint64, error)

	WriteFileAtomic(p string, data []byte, mode fs.FileMode) error
	CreateTemp(p string) (TempFile, error)
	Chmod(p string, mode fs.FileMode) error
	Remove(p string) error
	RemoveAll(p string) error
	Rename(from, to string) error
	KeepPrevious(p, prev string) error
}

// TempFile is a file being written beside its destination; Commit moves it into place, Discard drops it.
type TempFile interface {
	io.Writer
	Commit(mode fs.FileMode) error
	Discard() error
}

// FS reads and writes files under a host root. Paths are host paths (absolute, as the node sees them);
// symbolic links are followed as the host would, inside the root, so nothing outside it is ever touched.
type FS struct {
	Root string

	// afterResolve, when set (by tests only), runs between resolving a path and acting on it: the
	// moment a host process could swap a checked directory for a symlink.
	afterResolve func(hostPath string)
}

// maxSymlinks bounds symlink resolution, as the kernel does.
const maxSymlinks = 40

// Path is where host path p is under the root, with every symlink in it followed inside the root,
// the last one too, so that what the returned path names is inside the root. It refuses relative
// paths and paths with ".." in them.
func (f *FS) Path(p string) (string, error) {
	return f.path(p, true)
}

// linkPath is Path for operations on a name itself (remove, rename): a final symlink is not followed,
// and as its directory is resolved inside the root, the link acted on is inside it too.
func (f *FS) linkPath(p string) (string, error) {
	return f.path(p, false)
}

func (f *FS) path(p string, followLast bool) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("host path %q is not absolute", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("host path %q escapes the host root", p)
		}
	}
	resolved, err := f.resolve(p, followLast)
	if err != nil {
		return "", err
	}
	if f.afterResolve != nil {
		f.afterResolve(resolved)
	}
	return filepath.Join(f.Root, resolved), nil
}

// resolve follows the symlinks in p one component at a time, as the kernel would inside a chroot at
// the root: an absolute target starts again at the root and ".." stops there, so no path, however its
// links point, leaves the root. The last component is followed only when followLast is set. Missing
// components are fine: a write creates them. What it cannot close is a race with a host process that
// swaps a checked directory for a symlink before the caller uses the result: reads and mode changes
// close it by having the kernel resolve again (openInRoot); directories are created, and trees removed,
// one component at a time relative to a descriptor, refusing a component that became a symlink
// (walkDir, removeAllAt), and so are the temporary files, removals, renames and links beside them.
func (f *FS) resolve(p string, followLast bool) (string, error) {
	cur := "/"
	pending := strings.Split(strings.Trim(path.Clean(p), "/"), "/")
	links := 0
	for len(pending) > 0 {
		part := pending[0]
		pending = pending[1:]
		switch part {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur) // clamps at "/"
			continue
		}
		next := path.Join(cur, part)
		if len(pending) == 0 && !followLast {
			return next, nil
		}
		fi, err := os.Lstat(filepath.Join(f.Root, next))
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		links++
		if links > maxSymlinks {
			return "", fmt.Errorf("resolving %q: too many symbolic links", p)
		}
		target, err := os.Readlink(filepath.Join(f.Root, next))
		if err != nil {
			return "", fmt.Errorf("resolving %q: %w", p, err)
		}
		if path.IsAbs(target) {
			cur = "/"
		}
		pending = append(strings.Split(target, "/"), pending...)
	}
	return cur, nil
}

// ReadFile reads host path p.
func (f *FS) ReadFile(p string) ([]byte, error) {
	real, err := f.Path(p)
	if err != nil {
		return nil, err
	}
	file, err := f.openRead(p, real)
	if err != nil {
		return nil, err
	}
	defer func() { _ = file.Close() }()
	return io.ReadAll(file)
}

// openRead opens host path p, resolved to real, for reading. The kernel resolves p again inside the
// root (openat2 with RESOLVE_IN_ROOT, the semantics resolve follows), so a host process that swaps a
// directory for a symlink after resolve cannot make the read leave the root. Where openat2 is missing
// or filtered, real is opened refusing at least a last component that became a symlink.
func (f *FS) openRead(p, real string) (*os.File, error) {
	fd, err := f.openInRoot(p, unix.O_RDONLY)
	switch {
	case errors.Is(err, errNoOpenat2):
		return os.OpenFile(real, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	case err != nil:
		return nil, err
	}
	return os.NewFile(uintptr(fd), real), nil
}

// errNoOpenat2: the kernel (or a seccomp filter) does not offer openat2; callers fall back to paths.
var errNoOpenat2 = errors.New("openat2 is not available")

// openInRoot opens host path p with flags, the kernel resolving every component inside the root.
func (f *FS) openInRoot(p string, flags uint64) (int, error) {
	root, err := unix.Open(f.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: f.Root, Err: err}
	}
	defer func() { _ = unix.Close(root) }()
	rel := strings.TrimLeft(p, "/")
	if rel == "" {
		rel = "."
	}
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM):
		return -1, errNoOpenat2
	case err != nil:
		return -1, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	return fd, nil
}

// hostPath is the host path of real, a path under the root that path returned.
func (f *FS) hostPath(real string) string {
	rel, err := filepath.Rel(filepath.Clean(f.Root), real)
	if err != nil {
		return "/" + real // not under the root: openat2 resolves it inside anyway
	}
	return "/" + filepath.ToSlash(rel)
}

// walkDir opens host directory dir (resolved: no symlink in it when resolve looked) one component at
// a time, each relative to the descriptor of the one before and never following a symlink, creating
// missing components when create is set. A component a host process swapped for a symlink since
// resolve is refused rather than followed, so what is created, linked, renamed or removed in the
// directory it returns is inside the root. The root itself is trusted.
func (f *FS) walkDir(dir string, create bool) (*os.File, error) {
	cur, err := unix.Open(f.Root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: f.Root, Err: err}
	}
	walked := "/"
	for _, part := range strings.Split(strings.Trim(path.Clean(dir), "/"), "/") {
		if part == "" || part == "." {
			continue
		}
		walked = path.Join(walked, part)
		if create {
			if err := unix.Mkdirat(cur, part, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				_ = unix.Close(cur)
				return nil, &fs.PathError{Op: "mkdir", Path: walked, Err: err}
			}
		}
		next, err := unix.Openat(cur, part, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		var st unix.Stat_t
		isLink := err != nil && unix.Fstatat(cur, part, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
		_ = unix.Close(cur)
		switch {
		case isLink:
			return nil, fmt.Errorf("%s became a symbolic link while in use: refusing to follow it", walked)
		case err != nil:
			return nil, &fs.PathError{Op: "open", Path: walked, Err: err}
		}
		cur = next
	}
	return os.NewFile(uintptr(cur), filepath.Join(f.Root, dir)), nil
}

// Stat stats host path p, following symlinks inside the root.
func (f *FS) Stat(p string) (fs.FileInfo, error) {
	real, err := f.Path(p)
	if err != nil {
		return nil, err
	}
	return os.Lstat(real)
}

// Open opens host path p for reading.
func (f *FS) Open(p string) (io.ReadCloser, error) {
	real, err := f.Path(p)
	if err != nil {
		return nil, err
	}
	return f.openRead(p, real)
}

// ReadDir lists host directory p.
func (f *FS) ReadDir(p string) ([]fs.DirEntry, error) {
	real, err := f.Path(p)
	if err != nil {
		return nil, err
	}
	return os.ReadDir(real)
}

// Chmod sets the mode of host path p.
func (f *FS) Chmod(p string, mode fs.FileMode) error {
	real, err := f.Path(p)
	if err != nil {
		return err
	}
	if err := chmodIn(f, p, real, mode); err != nil {
		return fmt.Errorf("setting the mode of %s: %w", p, err)
	}
	return nil
}

// chmodIn sets the mode through a descriptor the kernel opened inside the root, when it can.
func chmodIn(f *FS, p, real string, mode fs.FileMode) error {
	fd, err := f.openInRoot(p, unix.O_RDONLY|unix.O_NONBLOCK)
	switch {
	case errors.Is(err, errNoOpenat2) || errors.Is(err, unix.EACCES): // EACCES: unreadable, as an unprivileged local agent
		return os.Chmod(real, mode)
	case err != nil:
		return err
	}
	file := os.NewFile(uintptr(fd), real)
	defer func() { _ = file.Close() }()
	return file.Chmod(mode)
}

// Exists reports whether host path p exists.
func (f *FS) Exists(p string) bool {
	_, err := f.Stat(p)
	return err == nil
}

// WriteFileAtomic writes data to host path p: a temporary file beside it, fsynced, then renamed over it,
// so readers see the old file or the new one, never a part.
func (f *FS) WriteFileAtomic(p string, data []byte, mode fs.FileMode) error {
	tmp, err := f.CreateTemp(p)
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Discard()
		return fmt.Errorf("writing %s: %w", p, err)
	}
	return tmp.Commit(mode)
}

// tempFile is FS's TempFile: a real file beside the destination, created, renamed and removed
// relative to the directory walkDir opened, so a directory swapped for a symlink meanwhile cannot
// send the write elsewhere.
type tempFile struct {
	*os.File
	dest string
	dir  *os.File
	name string // the temporary file's and the destination's names in dir
	base string
}

// CreateTemp opens a temporary file in the directory of host path p, creating the directory.
func (f *FS) CreateTemp(p string) (TempFile, error) {
	real, err := f.Path(p)
	if err != nil {
		return nil, err
	}
	dir, err := f.walkDir(path.Dir(f.hostPath(real)), true)
	if err != nil {
		return nil, fmt.Errorf("creating the directory of %s: %w", p, err)
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	base := filepath.Base(real)
	prefix := "." + base + tempInfix
	removeStaleTemps(dir, prefix)
	name := prefix + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		_ = dir.Close()
		return nil, fmt.Errorf("creating a temporary file for %s: %w", p, err)
	}
	file := os.NewFile(uintptr(fd), filepath.Join(filepath.Dir(real), name))
	return &tempFile{File: file, dest: real, dir: dir, name: name, base: base}, nil
}

// tempInfix marks the temporary files CreateTemp makes: ".<name>" + tempInfix + 12 hex digits.
const tempInfix = ".nodeops-tmp-"

// removeStaleTemps removes the temporary files of one destination that an earlier write left
// (the agent was killed while downloading): one task runs on a node at a time (rule 1) and its
// commands one after another, so none of them is being written now (the agent's downloads ahead,
// commands.Prefetch, run only beside a kubeadm upgrade, which writes none of their destinations,
// and hand their files to the install that follows). Best effort: a file that cannot be removed
// is left, as before.
func removeStaleTemps(dir *os.File, prefix string) {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return
	}
	for _, n := range names {
		if strings.HasPrefix(n, prefix) && len(n) == len(prefix)+12 {
			_ = unix.Unlinkat(int(dir.Fd()), n, 0)
		}
	}
}

// Commit syncs the file, sets its mode and renames it over the destination.
func (t *tempFile) Commit(mode fs.FileMode) error {
	err := t.Sync()
	if err == nil {
		err = t.Chmod(mode)
	}
	if cerr := t.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(int(t.dir.Fd()), t.name, int(t.dir.Fd()), t.base)
	}
	if err != nil {
		_ = t.remove()
		return fmt.Errorf("moving %s into place: %w", t.dest, err)
	}
	_ = t.dir.Sync()
	return t.dir.Close()
}

func (t *tempFile) remove() error {
	err := unix.Unlinkat(int(t.dir.Fd()), t.name, 0)
	_ = t.dir.Close()
	return err
}

// Discard closes and removes the temporary file.
func (t *tempFile) Discard() error {
	_ = t.Close()
	if err := t.remove(); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", t.Name(), err)
	}
	return nil
}

// Remove removes host path p; a missing file is not an error.
func (f *FS) Remove(p string) error {
	real, err := f.linkPath(p)
	if err != nil {
		return err
	}
	if path.Clean(f.hostPath(real)) == "/" {
		// Its name is the root's own, in the directory that holds the root.
		return fmt.Errorf("removing %s: refusing to remove the host's root", p)
	}
	err = f.inDir(real, false, func(dir int, base string) error {
		err := unix.Unlinkat(dir, base, 0)
		if errors.Is(err, unix.EISDIR) {
			err = unix.Unlinkat(dir, base, unix.AT_REMOVEDIR)
		}
		return err
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", p, err)
	}
	return nil
}

// inDir runs do with the descriptor of the directory holding real (a path under the root that path
// returned, opened by walkDir) and real's name in it.
func (f *FS) inDir(real string, create bool, do func(dir int, base string) error) error {
	dir, err := f.walkDir(path.Dir(f.hostPath(real)), create)
	if err != nil {
		return err
	}
	defer func() { _ = dir.Close() }()
	return do(int(dir.Fd()), filepath.Base(real))
}

// RemoveAll removes host path p and everything under it; a missing path is not an error.
func (f *FS) RemoveAll(p string) error {
	real, err := f.linkPath(p)
	if err != nil {
		return err
	}
	err = f.inDir(real, false, removeAllAt)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", p, err)
	}
	return nil
}

// removeAllAt removes name in directory dir and, when it is a directory, everything under it, each
// level opened relative to the one above without following symlinks: a symlink is removed, never
// what it points to.
func removeAllAt(dir int, name string) error {
	err := unix.Unlinkat(dir, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return err
	}
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	child := os.NewFile(uintptr(fd), name)
	entries, err := child.ReadDir(-1)
	for _, e := range entries {
		if err == nil {
			err = removeAllAt(fd, e.Name())
		}
	}
	_ = child.Close()
	if err != nil {
		return err
	}
	return unix.Unlinkat(dir, name, unix.AT_REMOVEDIR)
}

// Rename renames host path from to host path to.
func (f *FS) Rename(from, to string) error {
	rf, err := f.linkPath(from)
	if err != nil {
		return err
	}
	rt, err := f.linkPath(to)
	if err != nil {
		return err
	}
	err = f.inDir(rf, false, func(fromDir int, fromBase string) error {
		return f.inDir(rt, true, func(toDir int, toBase string) error {
			return unix.Renameat(fromDir, fromBase, toDir, toBase)
		})
	})
	if err != nil {
		return fmt.Errorf("renaming %s to %s: %w", from, to, err)
	}
	return nil
}

// KeepPrevious makes prev a copy of p (a hard link when possible), replacing prev atomically.
// It does nothing when p does not exist.
func (f *FS) KeepPrevious(p, prev string) error {
	src, err := f.Path(p)
	if err != nil {
		return err
	}
	dst, err := f.linkPath(prev)
	if err != nil {
		return err
	}
	srcDir, err := f.walkDir(path.Dir(f.hostPath(src)), false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no p, nothing to keep
	}
	if err != nil {
		return fmt.Errorf("keeping %s: %w", p, err)
	}
	defer func() { _ = srcDir.Close() }()
	srcBase := filepath.Base(src)
	var st unix.Stat_t
	switch err := unix.Fstatat(int(srcDir.Fd()), srcBase, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case errors.Is(err, unix.ENOENT):
		return nil
	case err != nil:
		return fmt.Errorf("keeping %s: %w", p, err)
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return fmt.Errorf("keeping %s: it became a symbolic link while in use: refusing to follow it", p)
	}
	err = f.inDir(dst, false, func(dstDir int, dstBase string) error {
		tmp := dstBase + ".nodeops-tmp"
		_ = unix.Unlinkat(dstDir, tmp, 0)
		if err := unix.Linkat(int(srcDir.Fd()), srcBase, dstDir, tmp, 0); err != nil {
			if err := copyAt(int(srcDir.Fd()), srcBase, dstDir, tmp, fs.FileMode(st.Mode&0o777)); err != nil {
				return err
			}
		}
		if err := unix.Renameat(dstDir, tmp, dstDir, dstBase); err != nil {
			_ = unix.Unlinkat(dstDir, tmp, 0)
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("keeping %s as %s: %w", p, prev, err)
	}
	return nil
}

// copyAt copies file srcBase in srcDir to a new file dstBase in dstDir, following no symlink.
func copyAt(srcDir int, srcBase string, dstDir int, dstBase string, mode fs.FileMode) error {
	in, err := unix.Openat(srcDir, srcBase, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	src := os.NewFile(uintptr(in), srcBase)
	defer func() { _ = src.Close() }()
	out, err := unix.Openat(dstDir, dstBase, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(mode))
	if err != nil {
		return err
	}
	dst := os.NewFile(uintptr(out), dstBase)
	if _, err := io.Copy(dst, src); err != nil {
		_ = dst.Close()
		return err
	}
	return dst.Close()
}

// FreeBytes is the space available to unprivileged users on the filesystem holding host path p.
func (f *FS) FreeBytes(p string) (uint64, error) {
	real, err := f.Path(p)
	if err != nil {
		return 0, err
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(real, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", p, err)
	}
	return st.Bavail * uint64(st.Bsize), nil //nolint:gosec // block size is positive
}
