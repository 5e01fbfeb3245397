package host_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeops/nodeops/internal/host"
)

// A socket under a host root deep in a temporary directory, past the 107 bytes a unix socket
// address holds, is still served and reached (the local nodes' runtime socket in tests' roots).
func TestLongSocketPathIsServedAndReached(t *testing.T) {
	root := filepath.Join(t.TempDir(), strings.Repeat("deep/", 20))
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := host.ServeLocalRuntimeSocket(root)
	if err != nil {
		t.Fatalf("serving %d-byte socket path: %v", len(root+host.LocalRuntimeSocket), err)
	}
	defer l.Close()
	addr, done, err := host.ShortUnixPath(filepath.Join(root, host.LocalRuntimeSocket))
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	c, err := net.Dial("unix", addr)
	if err != nil {
		t.Fatalf("dialing %s: %v", addr, err)
	}
	_ = c.Close()
}
