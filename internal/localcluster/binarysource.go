package localcluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// BinarySourceURLFile holds the base URL of the binary source, for NodeOperation spec.upgrade.binarySource.baseURL.
const BinarySourceURLFile = "binary-source-url"

// servedBinaries are the components an upgrade installs on nodes.
var servedBinaries = []string{"kubeadm", "kubelet", "kubectl"}

// binarySource serves bin/{kubeadm,kubelet,kubectl} the way dl.k8s.io lays out a release:
// {base}/{version}/bin/linux/amd64/{name} and {name}.sha256 (the hex digest alone).
type binarySource struct {
	bin     string
	version string

	mu      sync.Mutex
	digests map[string]digest
}

type digest struct {
	size    int64
	modTime time.Time
	hex     string
}

// kubeadmVersion asks bin/kubeadm which release the binaries are.
func kubeadmVersion(ctx context.Context, bin string) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "kubeadm"), "version", "-o", "short").Output()
	if err != nil {
		return "", fmt.Errorf("kubeadm version: %w", err)
	}
	v := strings.TrimSpace(string(out))
	if !strings.HasPrefix(v, "v") {
		return "", fmt.Errorf("kubeadm version printed %q", v)
	}
	return v, nil
}

// ServeHTTP serves a binary or its digest; anything else is 404.
func (b *binarySource) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, "/"+b.version+"/bin/linux/amd64/")
	base, isDigest := strings.CutSuffix(name, ".sha256")
	if !ok || !served(base) {
		http.NotFound(w, r)
		return
	}
	path := filepath.Join(b.bin, base)
	if !isDigest {
		w.Header().Set("Content-Type", "application/octet-stream")
		http.ServeFile(w, r, path)
		return
	}
	sum, err := b.digest(path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, sum)
}

func served(name string) bool {
	for _, s := range servedBinaries {
		if s == name {
			return true
		}
	}
	return false
}

// digest returns the sha256 of path, computed once per version of the file.
func (b *binarySource) digest(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if d, ok := b.digests[path]; ok && d.size == st.Size() && d.modTime.Equal(st.ModTime()) {
		return d.hex, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hashing %s: %w", path, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if b.digests == nil {
		b.digests = map[string]digest{}
	}
	b.digests[path] = digest{size: st.Size(), modTime: st.ModTime(), hex: sum}
	return sum, nil
}

// serveBinaries starts the binary source on a free loopback port until ctx ends and writes its
// base URL to DIR/binary-source-url.
func serveBinaries(ctx context.Context, bin, dir string) (string, error) {
	version, err := kubeadmVersion(ctx, bin)
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("binary source: %w", err)
	}
	srv := &http.Server{Handler: &binarySource{bin: bin, version: version}, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(os.Stderr, "nodeops-local: binary source stopped: %v\n", err)
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	url := "http://" + ln.Addr().String()
	if err := writeFileAtomic(filepath.Join(dir, BinarySourceURLFile), []byte(url+"\n"), 0o644); err != nil {
		return "", err
	}
	return url, nil
}
