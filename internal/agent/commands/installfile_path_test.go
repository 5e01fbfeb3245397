package commands

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// installFile names a file: "/" and paths whose last element is empty or "." are refused before
// anything is removed or written, whatever admission let through (a task may predate its rule).
func TestInstallFileRefusesPathsThatNameNoFile(t *testing.T) {
	for _, p := range []string{"/", "/opt/empty/", "/opt/empty/.", "//"} {
		for _, remove := range []bool{true, false} {
			env, root, _ := localEnv(t, map[string]string{"/opt/keep": "kept"}, false)
			if err := os.MkdirAll(filepath.Join(root, "opt/empty"), 0o755); err != nil {
				t.Fatal(err)
			}
			_, err := Run(context.Background(), env, &v1alpha1.Command{InstallFile: &v1alpha1.InstallFileCommand{
				URL: "https://127.0.0.1:1/x", SHA256: sum("x"), Path: p, Remove: remove}})
			if err == nil || !strings.Contains(err.Error(), "must name a file") {
				t.Errorf("installFile {path: %q, remove: %v}: err = %v, want it refused as naming no file", p, remove, err)
			}
			if _, err := os.Stat(filepath.Join(root, "opt/empty")); err != nil {
				t.Errorf("installFile {path: %q, remove: %v} removed a directory: %v", p, remove, err)
			}
		}
	}
}

// lowSpace is a host's files whose filesystem has little room left.
type lowSpace struct {
	host.Files
	free uint64
}

func (l lowSpace) FreeBytes(string) (uint64, error) { return l.free, nil }

// A download whose announced size does not fit the free space fails before writing, saying so, and
// leaves neither a temporary file nor a changed destination.
func TestDownloadChecksFreeSpaceFirst(t *testing.T) {
	body := strings.Repeat("x", 4096)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	env, root, _ := localEnv(t, map[string]string{"/opt/bin/shim": "old shim"}, false)
	env.Host.Files = lowSpace{Files: env.Host.Files, free: 1024}
	_, err := Run(context.Background(), env, &v1alpha1.Command{InstallFile: &v1alpha1.InstallFileCommand{
		URL: srv.URL + "/shim", InsecureHTTP: true, SHA256: sum(body), Path: "/opt/bin/shim"}})
	if err == nil || !strings.Contains(err.Error(), "free") {
		t.Fatalf("err = %v, want the download refused for lack of free space", err)
	}
	entries, err := os.ReadDir(filepath.Join(root, "opt/bin"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("opt/bin holds %d entries after the refused download, want the old shim alone", len(entries))
	}
	if got, _ := os.ReadFile(filepath.Join(root, "opt/bin/shim")); string(got) != "old shim" {
		t.Errorf("the destination changed: %q", got)
	}
}
