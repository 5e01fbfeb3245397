package commands

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strings"
)

// maxDownload bounds one download (Kubernetes binaries are about 100 MiB).
const maxDownload = 1 << 30

func httpClient(env *Env) *http.Client {
	if env.HTTP != nil {
		return env.HTTP
	}
	return http.DefaultClient
}

func get(ctx context.Context, env *Env, url string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("downloading %s: %w", url, err)
	}
	resp, err := httpClient(env).Do(req)
	if err != nil {
		return nil, fmt.Errorf("downloading %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("downloading %s: HTTP %s", url, resp.Status)
	}
	return resp.Body, nil
}

// fetchSHA256 reads a .sha256 file: the hex digest, optionally followed by a file name.
func fetchSHA256(ctx context.Context, env *Env, url string) (string, error) {
	body, err := get(ctx, env, url)
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
func installVerified(ctx context.Context, env *Env, url, want, p string, mode fs.FileMode) error {
	body, err := get(ctx, env, url)
	if err != nil {
		return err
	}
	defer func() { _ = body.Close() }()
	h := sha256.New()
	tmp, err := env.Host.Files.CreateTemp(p)
	if err != nil {
		return err
	}
	if _, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(body, maxDownload)); err != nil {
		_ = tmp.Discard()
		return fmt.Errorf("downloading %s: %w", url, err)
	}
	if err := checkSum(url, p, want, h.Sum(nil)); err != nil {
		_ = tmp.Discard()
		return err
	}
	return tmp.Commit(mode)
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
