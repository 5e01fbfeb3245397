package commands

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/nodeops/nodeops/internal/host"
)

// maxDownload bounds one download (Kubernetes binaries are about 100 MiB).
const maxDownload = 1 << 30

// Bounds on each stage of a download (every command has a timeout, rule 12): the command's timeout bounds
// the whole, these fail a stuck connection long before it, naming the stage.
const (
	dialTimeout           = 30 * time.Second
	tlsHandshakeTimeout   = 30 * time.Second
	responseHeaderTimeout = time.Minute
	// DefaultDownloadIdleTimeout fails a download whose server sends nothing for this long.
	DefaultDownloadIdleTimeout = 30 * time.Second
)

// NewHTTPClient is the agent's client for downloads: bounded connect, TLS handshake and response
// header waits (the body's idle wait is get's), proxies from the environment, and no redirect from
// https to http.
func NewHTTPClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
			ForceAttemptHTTP2:     true,
			TLSHandshakeTimeout:   tlsHandshakeTimeout,
			ResponseHeaderTimeout: responseHeaderTimeout,
			ExpectContinueTimeout: time.Second,
			IdleConnTimeout:       90 * time.Second,
			MaxIdleConns:          16,
		},
		CheckRedirect: noDowngrade(nil),
	}
}

// noDowngrade refuses a redirect from https to http (a checksum would catch a changed file, but
// a .sha256 fetched the same way would not), then asks next, or Go's default of 10 redirects.
func noDowngrade(next func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if len(via) > 0 && via[len(via)-1].URL.Scheme == "https" && req.URL.Scheme != "https" {
			return fmt.Errorf("refusing the redirect from https to %s (%s)", req.URL.Scheme, req.URL.Redacted())
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
}

// transport is what a command's spec says about how to download: whether plain http is allowed
// and which CAs to trust besides the client's.
type transport struct {
	insecureHTTP bool
	caBundle     string
}

// checkScheme refuses every URL but https, and http unless insecureHTTP allows it: admission refuses
// them already, and the agent does not rely on it (a task may predate the rule).
func (t transport) checkScheme(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("downloading %s: %w", rawURL, err)
	}
	switch {
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && t.insecureHTTP:
		return nil
	case u.Scheme == "http":
		return fmt.Errorf("refusing to download %s over plain http: use https, or set insecureHTTP: true to allow it", u.Redacted())
	default:
		return fmt.Errorf("refusing to download %s: only https (or http with insecureHTTP: true) is allowed", u.Redacted())
	}
}

func httpClient(env *Env, t transport) (*http.Client, error) {
	var c http.Client
	if env.HTTP != nil {
		c = *env.HTTP
	} else {
		c = *NewHTTPClient() // the agent passes its own; this serves tests and tools
	}
	// Whichever client the agent was given, https is never carried on over http.
	c.CheckRedirect = noDowngrade(c.CheckRedirect)
	if t.caBundle == "" {
		return &c, nil
	}
	rt := c.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	base, ok := rt.(*http.Transport)
	if !ok {
		return nil, fmt.Errorf("caBundle: the agent's HTTP transport is a %T, which takes no CAs", rt)
	}
	tr := base.Clone()
	if tr.TLSClientConfig == nil {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	pool := tr.TLSClientConfig.RootCAs
	if pool != nil {
		pool = pool.Clone()
	} else if pool, _ = x509.SystemCertPool(); pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM([]byte(t.caBundle)) {
		return nil, errors.New("caBundle holds no PEM certificate that parses")
	}
	tr.TLSClientConfig.RootCAs = pool
	c.Transport = tr
	return &c, nil
}

// errIdle is the cause of a download's cancellation by its idle timer.
type errIdle struct{ after time.Duration }

func (e errIdle) Error() string { return fmt.Sprintf("no data for %s", e.after) }

func get(ctx context.Context, env *Env, url string, t transport) (io.ReadCloser, error) {
	if err := t.checkScheme(url); err != nil {
		return nil, err
	}
	hc, err := httpClient(env, t)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel(nil)
		return nil, fmt.Errorf("downloading %s: %w", url, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		cancel(nil)
		return nil, fmt.Errorf("downloading %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		cancel(nil)
		return nil, fmt.Errorf("downloading %s: HTTP %s", url, resp.Status)
	}
	idle := env.DownloadIdleTimeout
	if idle <= 0 {
		idle = DefaultDownloadIdleTimeout
	}
	b := &idleBody{body: resp.Body, ctx: ctx, cancel: cancel, idle: idle, length: resp.ContentLength}
	b.timer = time.AfterFunc(idle, func() { cancel(errIdle{idle}) })
	return b, nil
}

// idleBody is a response body that cancels its request when no byte arrives for idle; its reads then
// fail with errIdle.
type idleBody struct {
	body   io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	idle   time.Duration
	timer  *time.Timer
	// length is the size the server announced, -1 when it did not.
	length int64
}

func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if n > 0 {
		b.timer.Reset(b.idle)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		var idle errIdle
		if errors.As(context.Cause(b.ctx), &idle) {
			return n, idle
		}
	}
	return n, err // io.EOF must stay io.EOF; the caller names the URL
}

func (b *idleBody) Close() error {
	b.timer.Stop()
	err := b.body.Close()
	b.cancel(nil)
	return err
}

// fetchSHA256 reads a .sha256 file: the hex digest, optionally followed by a file name.
func fetchSHA256(ctx context.Context, env *Env, url string, t transport) (string, error) {
	body, err := get(ctx, env, url, t)
	if err != nil {
		return "", err
	}
	defer func() { _ = body.Close() }()
	b, err := io.ReadAll(io.LimitReader(body, 4096))
	if err != nil {
		return "", fmt.Errorf("downloading %s: %w", url, err)
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 || len(fields[0]) != 64 {
		return "", fmt.Errorf("%s holds no sha256 digest", url)
	}
	return strings.ToLower(fields[0]), nil
}

// installVerified downloads url and, only when its sha256 is want, moves it into place at host path p
// atomically. On a mismatch the temporary file is dropped and p is left as it was. In DryRun the
// download is verified all the same and the host's files keep none of it.
func installVerified(ctx context.Context, env *Env, url, want, p string, mode fs.FileMode, t transport) error {
	tmp, _, err := downloadVerified(ctx, env, url, want, p, t)
	if err != nil {
		return err
	}
	return tmp.Commit(mode)
}

// downloadVerified downloads url into a temporary file beside host path p and returns it, with its
// size, only when its sha256 is want; the caller commits or discards it.
func downloadVerified(ctx context.Context, env *Env, url, want, p string, t transport) (host.TempFile, int64, error) {
	body, err := get(ctx, env, url, t)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = body.Close() }()
	if err := checkFreeSpace(env, url, p, body); err != nil {
		return nil, 0, err
	}
	h := sha256.New()
	tmp, err := env.Host.Files.CreateTemp(p)
	if err != nil {
		return nil, 0, err
	}
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(body, maxDownload))
	if err != nil {
		_ = tmp.Discard()
		return nil, 0, fmt.Errorf("downloading %s: %w", url, err)
	}
	if err := checkSum(url, p, want, h.Sum(nil)); err != nil {
		_ = tmp.Discard()
		return nil, 0, err
	}
	return tmp, n, nil
}

// freeSpaceReserve is left free beside a download: a node whose disk fills stops its kubelet
// and containerd from writing.
const freeSpaceReserve = 64 << 20

// checkFreeSpace refuses a download whose announced size, with the reserve, does not fit the
// filesystem of host path p, before a byte is written. A download of unknown size is bounded by
// maxDownload and fails on a full disk with its temporary file removed.
func checkFreeSpace(env *Env, url, p string, body io.ReadCloser) error {
	b, ok := body.(*idleBody)
	if !ok || b.length < 0 {
		return nil
	}
	if b.length > maxDownload {
		return fmt.Errorf("downloading %s: %d bytes, more than the %d a download may have", url, b.length, maxDownload)
	}
	dir := path.Dir(p)
	for !env.Host.Files.Exists(dir) && dir != "/" {
		dir = path.Dir(dir) // CreateTemp makes the missing directories
	}
	free, err := env.Host.Files.FreeBytes(dir)
	if err != nil {
		return fmt.Errorf("downloading %s: reading the free space of %s: %w", url, dir, err)
	}
	if need := uint64(b.length) + freeSpaceReserve; free < need {
		return fmt.Errorf("downloading %s: %d bytes, and %s has %d bytes free, less than that plus a reserve of %d MiB; %s left unchanged",
			url, b.length, dir, free, freeSpaceReserve>>20, p)
	}
	return nil
}

func checkSum(url, p, want string, got []byte) error {
	if g := hex.EncodeToString(got); g != strings.ToLower(want) {
		return fmt.Errorf("sha256 of %s is %s, want %s: %s left unchanged", url, g, want, p)
	}
	return nil
}

// fileSHA256 is the digest of host path p, "" when it cannot be read.
func fileSHA256(env *Env, p string) string {
	f, err := env.Host.Files.Open(p)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}
