package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// What config/samples/wasm-shims.yaml leaves for the user to fill in.
const (
	sampleFile    = "config/samples/wasm-shims.yaml"
	sampleBaseURL = "https://shims.example/v0.x/"
	shimURLPath   = "/v0.x/"
)

// sampleURLLine is a url line of the sample with its indentation, ${1}.
var sampleURLLine = regexp.MustCompile(`(?m)^([ \t]*)url: ` + regexp.QuoteMeta(sampleBaseURL))

// sampleShim is one shim file of the sample and the placeholder standing for its sha256.
type sampleShim struct {
	name        string
	placeholder string
}

func sampleShims() []sampleShim {
	return []sampleShim{
		{"containerd-shim-wasmedge-v1", strings.Repeat("0", 63) + "1"},
		{"containerd-shim-wasmtime-v1", strings.Repeat("0", 63) + "2"},
		{"containerd-shim-spin-v2", strings.Repeat("0", 63) + "3"},
	}
}

// placeholderShim is the content of a generated shim: a script that says what it is.
func placeholderShim(name string, made time.Time) []byte {
	return fmt.Appendf(nil, "#!/bin/sh\n# %s: a placeholder made by make demo at %s, not a real containerd shim.\n"+
		"echo '%s: placeholder from make demo, not a real shim' >&2\nexit 1\n", name, made.UTC().Format(time.RFC3339), name)
}

// writeShims writes a placeholder for each shim into dir and returns name -> sha256.
func writeShims(dir string, made time.Time) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("making %s: %w", dir, err)
	}
	digests := map[string]string{}
	for _, s := range sampleShims() {
		data := placeholderShim(s.name, made)
		if err := os.WriteFile(filepath.Join(dir, s.name), data, 0o644); err != nil {
			return nil, fmt.Errorf("writing shim: %w", err)
		}
		sum := sha256.Sum256(data)
		digests[s.name] = hex.EncodeToString(sum[:])
	}
	return digests, nil
}

// serveShims serves dir under /v0.x/ on a free loopback port; the URL ends with a slash.
func serveShims(dir string) (baseURL string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("listening for the shim server: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle(shimURLPath, http.StripPrefix(shimURLPath, http.FileServer(http.Dir(dir))))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(os.Stderr, "shim server: %v\n", err)
		}
	}()
	return "http://" + ln.Addr().String() + shimURLPath, func() { _ = srv.Close() }, nil
}

// substituteSample puts the base URL and the real digests in place of the sample's placeholders,
// and fails when one of them is missing from the sample (it changed) or is left over.
func substituteSample(sample, baseURL string, digests map[string]string) (string, error) {
	if !strings.Contains(sample, sampleBaseURL) {
		return "", fmt.Errorf("%s no longer uses the placeholder URL %s", sampleFile, sampleBaseURL)
	}
	// The demo serves plain http on loopback, which admission allows only when asked for.
	insecure := ""
	if strings.HasPrefix(baseURL, "http://") {
		insecure = "${1}insecureHTTP: true\n"
	}
	out := sampleURLLine.ReplaceAllString(sample, insecure+"${1}url: "+baseURL)
	out = strings.ReplaceAll(out, sampleBaseURL, baseURL) // its comments
	for _, s := range sampleShims() {
		sum, ok := digests[s.name]
		if !ok {
			return "", fmt.Errorf("no sha256 for %s", s.name)
		}
		if !strings.Contains(out, s.placeholder) {
			return "", fmt.Errorf("%s no longer has the placeholder sha256 of %s", sampleFile, s.name)
		}
		out = strings.ReplaceAll(out, s.placeholder, sum)
	}
	return out, nil
}
