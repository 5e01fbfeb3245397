package framework

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"testing"
)

// FileSHA256 is the hex sha256 of a file, as a binary source's .sha256 files carry it; it fails t
// when the file cannot be read.
func FileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
