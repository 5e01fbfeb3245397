package host

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
)

// Files is the host's files as commands see them. *FS changes them; DryRunFiles reads through and
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
}

// maxSymlinks bounds symlink resolution, as the kernel does.
const maxSymlinks = 40

// Path is where host path p is under the root. It refuses relative paths and paths that would leave
// the root through "..".
func (f *FS) Path(p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("host path %q is not absolute", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("host path %q escapes the host root", p)
		}
	}
	resolved, err := f.resolve(p)
	if err != nil {
		return "", err
	}
	return filepath.Join(f.Root, resolved), nil
}

// resolve follows symlinks in p's directories (not in its last element) with / meaning the root.
func (f *FS) resolve(p string) (string, error) {
	dir, base := path.Split(path.Clean(p))
	cur := "/"
	pending := strings.Split(strings.Trim(dir, "/"), "/")
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
		fi, err := os.Lstat(filepath.Join(f.Root, next))
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			// Missing directories are fine: a write creates them.
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
	if base == "" {
		return cur, nil
	}
	return path.Join(cur, base), nil
}

// ReadFile reads host path p.
func (f *FS) ReadFile(p string) ([]byte, error) {
	real, err := f.Path(p)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(real)
}

// Stat stats host path p, following a final symlink only when it stays in the root.
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
	return os.Open(real)
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
	if err := os.Chmod(real, mode); err != nil {
		return fmt.Errorf("setting the mode of %s: %w", p, err)
	}
	return nil
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

// tempFile is FS's TempFile: a real file beside the destination.
type tempFile struct {
	*os.File
	dest string
}

// CreateTemp opens a temporary file in the directory of host path p, creating the directory.
func (f *FS) CreateTemp(p string) (TempFile, error) {
	real, err := f.Path(p)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(real), 0o755); err != nil {
		return nil, fmt.Errorf("creating the directory of %s: %w", p, err)
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := filepath.Join(filepath.Dir(real), "."+filepath.Base(real)+".nodeops-tmp-"+hex.EncodeToString(rnd[:]))
	file, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating a temporary file for %s: %w", p, err)
	}
	return &tempFile{File: file, dest: real}, nil
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
		err = os.Rename(t.Name(), t.dest)
	}
	if err != nil {
		_ = os.Remove(t.Name())
		return fmt.Errorf("moving %s into place: %w", t.dest, err)
	}
	if d, derr := os.Open(filepath.Dir(t.dest)); derr == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// Discard closes and removes the temporary file.
func (t *tempFile) Discard() error {
	_ = t.Close()
	if err := os.Remove(t.Name()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", t.Name(), err)
	}
	return nil
}

// Remove removes host path p; a missing file is not an error.
func (f *FS) Remove(p string) error {
	real, err := f.Path(p)
	if err != nil {
		return err
	}
	if err := os.Remove(real); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", p, err)
	}
	return nil
}

// RemoveAll removes host path p and everything under it; a missing path is not an error.
func (f *FS) RemoveAll(p string) error {
	real, err := f.Path(p)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(real); err != nil {
		return fmt.Errorf("removing %s: %w", p, err)
	}
	return nil
}

// Rename renames host path from to host path to.
func (f *FS) Rename(from, to string) error {
	rf, err := f.Path(from)
	if err != nil {
		return err
	}
	rt, err := f.Path(to)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(rt), 0o755); err != nil {
		return fmt.Errorf("creating the directory of %s: %w", to, err)
	}
	if err := os.Rename(rf, rt); err != nil {
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
	dst, err := f.Path(prev)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("keeping %s: %w", p, err)
	}
	tmp := dst + ".nodeops-tmp"
	_ = os.Remove(tmp)
	if err := os.Link(src, tmp); err != nil {
		if err := copyFile(src, tmp, fi.Mode().Perm()); err != nil {
			return fmt.Errorf("keeping %s as %s: %w", p, prev, err)
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("keeping %s as %s: %w", p, prev, err)
	}
	return nil
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
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
