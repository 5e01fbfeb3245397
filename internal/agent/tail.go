package agent

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// TailSize is how much of a command's output status keeps.
const TailSize = 4096

// tailBuffer keeps the last TailSize bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*TailSize {
		t.buf = append([]byte{}, t.buf[len(t.buf)-TailSize:]...)
	}
	return len(p), nil
}

// String is the tail, cut at a character boundary and valid UTF-8.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	if len(b) > TailSize {
		b = b[len(b)-TailSize:]
		for len(b) > 0 && !utf8.RuneStart(b[0]) {
			b = b[1:]
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
