package skeleton

import (
	"sync"
	"time"
)

// StatusThrottle batches status writes that only move counts: at most one per interval per
// object, so that thousands of nodes finishing make a handful of status writes, not thousands.
// Changes a watcher must see at once (phases, condition states) are written whatever it says.
// The zero value is ready to use.
type StatusThrottle struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// Wait is how long a status write of the object key must wait: zero when it is urgent, when
// interval is not positive, or when the last write was at least interval ago.
func (t *StatusThrottle) Wait(key string, urgent bool, interval time.Duration, now time.Time) time.Duration {
	if urgent || interval <= 0 {
		return 0
	}
	t.mu.Lock()
	last, ok := t.last[key]
	t.mu.Unlock()
	if !ok {
		return 0
	}
	return max(interval-now.Sub(last), 0)
}

// Wrote records a status write of key at now.
func (t *StatusThrottle) Wrote(key string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil {
		t.last = map[string]time.Time{}
	}
	t.last[key] = now
}

// Forget drops key, an object that is gone.
func (t *StatusThrottle) Forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.last, key)
}
