package commands

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host/hosttest"
)

// countingServer serves files from a map and counts the requests for each path.
type countingServer struct {
	*httptest.Server
	mu   sync.Mutex
	gets map[string]int
}

func newCountingServer(t *testing.T, files map[string]string) *countingServer {
	t.Helper()
	s := &countingServer{gets: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.gets[r.URL.Path]++
		s.mu.Unlock()
		body, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *countingServer) count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets[path]
}

// usrBin lists /usr/bin under root, temporary files included.
func usrBin(t *testing.T, root string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, "usr/bin"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

var upgradeBinaries = map[string]string{
	"/v1.37.2/bin/linux/amd64/kubelet":        "kubelet v1.37.2",
	"/v1.37.2/bin/linux/amd64/kubelet.sha256": sum("kubelet v1.37.2"),
	"/v1.37.2/bin/linux/amd64/kubectl":        "kubectl v1.37.2",
	"/v1.37.2/bin/linux/amd64/kubectl.sha256": sum("kubectl v1.37.2"),
}

// TestInstallBinariesTakesWhatWasDownloadedAhead: the binaries downloaded while the command before
// ran are installed without a second download, exactly as a download of their own would be (the
// previous binaries kept, nothing else left in /usr/bin).
func TestInstallBinariesTakesWhatWasDownloadedAhead(t *testing.T) {
	srv := newCountingServer(t, upgradeBinaries)
	env, root, out := localEnv(t, map[string]string{"/usr/bin/kubelet": "kubelet v1.36.0", "/usr/bin/kubectl": "kubectl v1.36.0"}, false)
	b := &v1alpha1.InstallBinariesCommand{Components: []string{"kubelet", "kubectl"}, Version: "v1.37.2",
		Source: v1alpha1.BinarySource{BaseURL: srv.URL, InsecureHTTP: true}}
	env.CommandIndex = 3
	env.Prefetch = StartPrefetch(context.Background(), env, 3, b)
	defer env.Prefetch.Discard()
	if _, err := Run(context.Background(), env, &v1alpha1.Command{InstallBinaries: b}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kubelet", "kubectl"} {
		if n := srv.count("/v1.37.2/bin/linux/amd64/" + name); n != 1 {
			t.Errorf("%s was downloaded %d times, want once", name, n)
		}
		if got := hosttest.ReadFile(t, root, "/usr/bin/"+name); got != name+" v1.37.2" {
			t.Errorf("/usr/bin/%s = %q", name, got)
		}
		if got := hosttest.ReadFile(t, root, "/usr/bin/"+name+PrevSuffix); got != name+" v1.36.0" {
			t.Errorf("kept %s = %q", name, got)
		}
	}
	if !strings.Contains(out.String(), "while the command before ran") {
		t.Errorf("the output does not say the binaries came from the download ahead:\n%s", out)
	}
	want := []string{"kubectl", "kubectl" + PrevSuffix, "kubelet", "kubelet" + PrevSuffix}
	if got := usrBin(t, root); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("/usr/bin holds %v, want %v", got, want)
	}
}

// TestPrefetchNeverInstallsWhatItWasNotAskedFor: a download ahead for another command, or one whose
// digest is no longer the one the install is asked for, is not used and leaves nothing behind; one
// no install took is removed by Discard; a DryRun downloads nothing ahead.
func TestPrefetchNeverInstallsWhatItWasNotAskedFor(t *testing.T) {
	srv := newCountingServer(t, upgradeBinaries)
	b := &v1alpha1.InstallBinariesCommand{Components: []string{"kubelet"}, Version: "v1.37.2",
		Source: v1alpha1.BinarySource{BaseURL: srv.URL, InsecureHTTP: true}}
	old := map[string]string{"/usr/bin/kubelet": "kubelet v1.36.0"}

	t.Run("another digest pinned", func(t *testing.T) {
		env, root, _ := localEnv(t, old, false)
		env.Prefetch = StartPrefetch(context.Background(), env, 0, b)
		defer env.Prefetch.Discard()
		pinned := b.DeepCopy()
		pinned.Source.SHA256 = &v1alpha1.BinaryDigests{Kubelet: sum("kubelet v1.37.3")}
		if _, err := Run(context.Background(), env, &v1alpha1.Command{InstallBinaries: pinned}); err == nil || !strings.Contains(err.Error(), "sha256") {
			t.Fatalf("install with a digest the server's file does not have: %v, want a sha256 mismatch", err)
		}
		if got := hosttest.ReadFile(t, root, "/usr/bin/kubelet"); got != "kubelet v1.36.0" {
			t.Errorf("kubelet = %q: the download ahead was installed under another digest", got)
		}
		env.Prefetch.Discard()
		if got := usrBin(t, root); strings.Join(got, " ") != "kubelet" {
			t.Errorf("/usr/bin holds %v after the install failed, want only kubelet", got)
		}
	})
	t.Run("another command", func(t *testing.T) {
		env, root, _ := localEnv(t, old, false)
		before := srv.count("/v1.37.2/bin/linux/amd64/kubelet")
		env.Prefetch = StartPrefetch(context.Background(), env, 5, b)
		<-env.Prefetch.done // its download ended before the install runs, as beside a kubeadm upgrade
		env.CommandIndex = 4
		if _, err := Run(context.Background(), env, &v1alpha1.Command{InstallBinaries: b}); err != nil {
			t.Fatal(err)
		}
		if n := srv.count("/v1.37.2/bin/linux/amd64/kubelet") - before; n != 2 {
			t.Errorf("kubelet downloaded %d times, want twice (ahead for command 5, and by command 4 itself)", n)
		}
		env.Prefetch.Discard()
		if got := usrBin(t, root); strings.Join(got, " ") != "kubelet kubelet"+PrevSuffix {
			t.Errorf("/usr/bin holds %v, want kubelet and the kept one only", got)
		}
	})
	t.Run("not taken", func(t *testing.T) {
		env, root, _ := localEnv(t, old, false)
		p := StartPrefetch(context.Background(), env, 1, b)
		p.Discard()
		if got := usrBin(t, root); strings.Join(got, " ") != "kubelet" {
			t.Errorf("/usr/bin holds %v after Discard, want only kubelet", got)
		}
	})
	t.Run("dry run", func(t *testing.T) {
		env, _, _ := localEnv(t, old, true)
		if p := StartPrefetch(context.Background(), env, 1, b); p != nil {
			p.Discard()
			t.Error("a DryRun downloads ahead")
		}
	})
}
