package monitoring

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeops/nodeops/internal/testutil"
)

const (
	// Debian's package names; their binaries are usr/bin/prometheus and usr/bin/prometheus-alertmanager.
	prometheusPackage   = "prometheus"
	alertmanagerPackage = "prometheus-alertmanager"

	// readyTimeout bounds a server's start on a loaded machine; it is ready in a second or two on an idle one.
	readyTimeout = 90 * time.Second
	// startAttempts: a free port found by listening and closing can be taken before the server binds it.
	startAttempts = 3
)

// Server is one running Prometheus or Alertmanager.
type Server struct {
	// URL is its base URL, http://127.0.0.1:PORT.
	URL string
	// Dir holds its configuration, storage and log.
	Dir string
	// Name is "prometheus" or "alertmanager".
	Name string
}

// CacheDir is where the downloaded packages (debs/) and their unpacked trees (monitoring/) are kept:
// ~/.cache/nodeops, or $XDG_CACHE_HOME/nodeops.
func CacheDir() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("cache directory: %w", err)
	}
	return filepath.Join(dir, "nodeops"), nil
}

// Alertmanager starts Debian's Alertmanager with one receiver that sends nowhere, clustering off.
func Alertmanager(t testing.TB) *Server {
	t.Helper()
	root := unpacked(t, alertmanagerPackage)
	dir := t.TempDir()
	config := filepath.Join(dir, "alertmanager.yml")
	writeFile(t, config, "route:\n  receiver: blackhole\nreceivers:\n- name: blackhole\n")
	return start(t, "alertmanager", dir, func(addr string) []string {
		// A private mount namespace shows the binary its package's /usr/share (see the package doc).
		return []string{
			"unshare", "--user", "--map-root-user", "--mount",
			"sh", "-c", `mount --bind "$0" /usr/share && exec "$@"`, filepath.Join(root, "usr/share"),
			filepath.Join(root, "usr/bin/prometheus-alertmanager"),
			"--config.file=" + config,
			"--storage.path=" + filepath.Join(dir, "data"),
			"--web.listen-address=" + addr,
			"--cluster.listen-address=",
		}
	})
}

// Prometheus starts Debian's Prometheus scraping targets ("host:port", job "test") every second.
func Prometheus(t testing.TB, targets ...string) *Server {
	t.Helper()
	root := unpacked(t, prometheusPackage)
	dir := t.TempDir()
	config := filepath.Join(dir, "prometheus.yml")
	quoted := make([]string, len(targets))
	for i, target := range targets {
		quoted[i] = strconv.Quote(target)
	}
	writeFile(t, config, "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"+
		"- job_name: test\n  static_configs:\n  - targets: ["+strings.Join(quoted, ", ")+"]\n")
	return start(t, "prometheus", dir, func(addr string) []string {
		return []string{
			filepath.Join(root, "usr/bin/prometheus"),
			"--config.file=" + config,
			"--storage.tsdb.path=" + filepath.Join(dir, "data"),
			"--web.listen-address=" + addr,
		}
	})
}

// start runs the command argv builds for a free loopback address until /-/ready answers 200, and
// kills it when the test ends.
func start(t testing.TB, name, dir string, argv func(addr string) []string) *Server {
	t.Helper()
	began := time.Now()
	logPath := filepath.Join(dir, name+".log")
	var lastErr error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		addr, err := freeAddr()
		if err != nil {
			t.Fatalf("monitoring: %s: %v", name, err)
		}
		s := &Server{URL: "http://" + addr, Dir: dir, Name: name}
		exited, err := run(t, argv(addr), logPath)
		if err != nil {
			t.Fatalf("monitoring: start %s: %v", name, err)
		}
		lastErr = waitReady(s.URL, exited)
		if lastErr == nil {
			t.Logf("monitoring: %s ready at %s in %s", name, s.URL, time.Since(began).Round(10*time.Millisecond))
			return s
		}
		if !errors.Is(lastErr, errExited) {
			break
		}
	}
	log, _ := os.ReadFile(logPath)
	t.Fatalf("monitoring: %s not ready after %s: %v\n--- its log (%s), last lines:\n%s", name, time.Since(began).Round(time.Second), lastErr, logPath, tail(log, 20))
	return nil
}

var errExited = errors.New("exited before it was ready")

// run starts argv with its output appended to logPath, and kills it at the test's end; exited is
// closed when it exits.
func run(t testing.TB, argv []string, logPath string) (exited chan struct{}, err error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	exited = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return exited, nil
}

// waitReady polls url/-/ready until it answers 200, the process exits (errExited) or readyTimeout passes.
func waitReady(url string, exited <-chan struct{}) error {
	deadline, cancelDeadline := context.WithTimeout(context.Background(), readyTimeout)
	defer cancelDeadline()
	ctx, cancel := context.WithCancelCause(deadline)
	defer cancel(nil)
	go func() {
		select {
		case <-exited:
			cancel(errExited)
		case <-ctx.Done():
		}
	}()
	client := &http.Client{Timeout: 2 * time.Second}
	err := testutil.Poll(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/-/ready", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s/-/ready: HTTP %d", url, resp.StatusCode)
		}
		return nil
	})
	if err != nil && errors.Is(context.Cause(ctx), errExited) {
		return fmt.Errorf("%w (last answer: %w)", errExited, err)
	}
	return err
}

// freeAddr is a loopback address no one listened on a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// unpackMu makes one test process fetch and unpack a package once; other processes are kept apart
// by unpacking into a temporary directory renamed into place.
var unpackMu sync.Mutex

// unpacked is the directory the package's .deb is unpacked in, fetching and unpacking it the first time.
func unpacked(t testing.TB, pkg string) string {
	t.Helper()
	unpackMu.Lock()
	defer unpackMu.Unlock()
	cache, err := CacheDir()
	if err != nil {
		t.Fatalf("monitoring: %v", err)
	}
	deb := fetched(t, filepath.Join(cache, "debs"), pkg)
	root := filepath.Join(cache, "monitoring", strings.TrimSuffix(filepath.Base(deb), ".deb"))
	if _, err := os.Stat(root); err == nil {
		return root
	}
	began := time.Now()
	if err := os.MkdirAll(filepath.Dir(root), 0o755); err != nil {
		t.Fatalf("monitoring: %v", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(root), ".unpack-")
	if err != nil {
		t.Fatalf("monitoring: %v", err)
	}
	defer os.RemoveAll(tmp)
	if out, err := exec.Command("dpkg-deb", "-x", deb, tmp).CombinedOutput(); err != nil {
		t.Fatalf("monitoring: dpkg-deb -x %s: %v\n%s", deb, err, out)
	}
	// Another process may have unpacked it meanwhile: its copy is as good.
	if err := os.Rename(tmp, root); err != nil {
		if _, statErr := os.Stat(root); statErr != nil {
			t.Fatalf("monitoring: %v", err)
		}
	}
	t.Logf("monitoring: unpacked %s into %s in %s", filepath.Base(deb), root, time.Since(began).Round(10*time.Millisecond))
	return root
}

// fetched is the path of pkg's .deb in debs, downloaded with apt-get download when none is there.
func fetched(t testing.TB, debs, pkg string) string {
	t.Helper()
	if deb := cachedDeb(debs, pkg); deb != "" {
		return deb
	}
	began := time.Now()
	fmt.Fprintf(os.Stderr, "monitoring: downloading Debian's %s with apt-get download into %s (once; reused by later runs)\n", pkg, debs)
	if err := os.MkdirAll(debs, 0o755); err != nil {
		t.Fatalf("monitoring: %v", err)
	}
	tmp, err := os.MkdirTemp(debs, ".download-")
	if err != nil {
		t.Fatalf("monitoring: %v", err)
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("apt-get", "download", "-q", pkg)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("monitoring: apt-get download %s failed: %v\n%s\nThe tests need Debian's %s and %s packages (downloaded, never installed): "+
			"run hack/install-deps.sh (make tools and .ci/run do), which fetches them into %s",
			pkg, err, bytes.TrimSpace(out), prometheusPackage, alertmanagerPackage, debs)
	}
	got := cachedDeb(tmp, pkg)
	if got == "" {
		t.Fatalf("monitoring: apt-get download %s left no %s_*.deb in %s", pkg, pkg, tmp)
	}
	deb := filepath.Join(debs, filepath.Base(got))
	if err := os.Rename(got, deb); err != nil {
		t.Fatalf("monitoring: %v", err)
	}
	t.Logf("monitoring: downloaded %s in %s", filepath.Base(deb), time.Since(began).Round(10*time.Millisecond))
	return deb
}

// cachedDeb is the newest-named pkg_*.deb in dir, or "".
func cachedDeb(dir, pkg string) string {
	matches, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if len(matches) == 0 {
		return ""
	}
	slices.Sort(matches)
	return matches[len(matches)-1]
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatalf("monitoring: %v", err)
	}
}

// tail is the last n lines of a log.
func tail(log []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(log), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
