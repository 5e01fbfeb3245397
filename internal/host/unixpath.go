package host

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// maxUnixPath is the longest path a unix socket address holds (sun_path less its terminating NUL).
const maxUnixPath = 107

// ShortUnixPath is path as a unix socket address: path itself when it fits, else the same file
// reached through an open descriptor of its directory (/proc/self/fd/N/NAME), for host roots deep
// in a temporary directory. done closes that descriptor once the dial or bind is made.
func ShortUnixPath(path string) (addr string, done func(), err error) {
	if len(path) <= maxUnixPath {
		return path, func() {}, nil
	}
	dir, err := os.OpenFile(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return "", nil, err
	}
	addr = fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path))
	if len(addr) > maxUnixPath {
		_ = dir.Close()
		return "", nil, fmt.Errorf("socket name %s is too long for a unix socket address", filepath.Base(path))
	}
	return addr, func() { _ = dir.Close() }, nil
}
