package commands

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host/hosttest"
)

// every command has a timeout (rule 12): a download whose server stops sending fails after the idle
// timeout, saying so, instead of holding the command until its own timeout.
func TestSafetyRule12_StalledDownloadFails(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000")
		_, _ = w.Write([]byte("the first bytes"))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	env, root, _ := localEnv(t, map[string]string{"/opt/bin/shim": "old shim"}, false)
	env.DownloadIdleTimeout = 200 * time.Millisecond
	// The test's own deadline: without the idle timeout the download would wait for it.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := Run(ctx, env, &v1alpha1.Command{InstallFile: &v1alpha1.InstallFileCommand{URL: srv.URL + "/shim", InsecureHTTP: true, SHA256: sum("x"), Path: "/opt/bin/shim"}})
	if err == nil || !strings.Contains(err.Error(), "no data for 200ms") {
		t.Fatalf("err = %v, want it to say no data for 200ms", err)
	}
	if got := hosttest.ReadFile(t, root, "/opt/bin/shim"); got != "old shim" {
		t.Errorf("the stalled download changed the file: %q", got)
	}
}

// every command has a timeout (rule 12): a download over https is never carried on over plain http by a
// redirect, whichever client the agent was given.
func TestSafetyRule12_HTTPSToHTTPRedirectIsRefused(t *testing.T) {
	plain := fileServer(t, map[string]string{"/shim": "new shim"})
	tlsSrv := httptest.NewTLSServer(http.RedirectHandler(plain.URL+"/shim", http.StatusFound))
	t.Cleanup(tlsSrv.Close)
	env, root, _ := localEnv(t, map[string]string{"/opt/bin/shim": "old shim"}, false)
	env.HTTP = tlsSrv.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := Run(ctx, env, &v1alpha1.Command{InstallFile: &v1alpha1.InstallFileCommand{URL: tlsSrv.URL + "/shim", SHA256: sum("new shim"), Path: "/opt/bin/shim"}})
	if err == nil || !strings.Contains(err.Error(), "refusing the redirect from https to http") {
		t.Fatalf("err = %v, want the redirect to http refused", err)
	}
	if got := hosttest.ReadFile(t, root, "/opt/bin/shim"); got != "old shim" {
		t.Errorf("the file was installed through the redirect: %q", got)
	}
	// https to https is followed as before.
	to := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("new shim")) }))
	t.Cleanup(to.Close)
	hop := httptest.NewTLSServer(http.RedirectHandler(to.URL+"/shim", http.StatusFound))
	t.Cleanup(hop.Close)
	env.HTTP = to.Client() // both servers share httptest's certificate
	if _, err := Run(ctx, env, &v1alpha1.Command{InstallFile: &v1alpha1.InstallFileCommand{URL: hop.URL + "/shim", SHA256: sum("new shim"), Path: "/opt/bin/shim"}}); err != nil {
		t.Fatalf("https to https: %v", err)
	}
}
