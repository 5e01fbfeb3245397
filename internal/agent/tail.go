package agent

import (
	"regexp"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/nodeops/nodeops/internal/redact"
)

// TailSize is how much of a command's output status keeps.
const TailSize = 4096

// tailBuffer keeps the last TailSize bytes written to it, with secrets redacted.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	cut bool // the start of the output was dropped
	// secrets are redacted from the tail, before it is cut to TailSize (nil: URL credentials only).
	secrets *redact.Secrets
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*TailSize {
		t.buf = append([]byte{}, t.buf[len(t.buf)-TailSize:]...)
		t.cut = true
	}
	return len(p), nil
}

// ansiEscape matches terminal colour and cursor sequences (kubeadm colours its output), which
// would show as garbage in kubectl and the status.
var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

// String is the tail without terminal escape sequences or secrets, cut at a character boundary and valid UTF-8.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := ansiEscape.ReplaceAll(t.buf, nil)
	if t.cut {
		b = []byte(t.secrets.Tail(string(b)))
	} else {
		b = []byte(t.secrets.String(string(b)))
	}
	if len(b) > TailSize {
		b = b[len(b)-TailSize:]
		for len(b) > 0 && !utf8.RuneStart(b[0]) {
			b = b[1:]
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
