package testutil

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"

	"k8s.io/client-go/rest"
)

// ForwardTo is a reverse proxy to cfg's API server that sends every request with cfg's credentials:
// the forwarding half of a fault proxy, which answers some requests itself and passes the rest here.
// Its clients talk plain HTTP to it on loopback, which client-go accepts for an http:// server.
func ForwardTo(cfg *rest.Config) (http.Handler, error) {
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("transport to %s: %w", cfg.Host, err)
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("API server address %q: %w", cfg.Host, err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = rt
	// Watches stream: pass every chunk on at once.
	rp.FlushInterval = -1
	// While kube-apiserver is down every request fails: answer 502 without a log line each.
	rp.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
		http.Error(w, "fault proxy: "+err.Error(), http.StatusBadGateway)
	}
	return rp, nil
}
