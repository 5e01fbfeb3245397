package statuswrite

import (
	"sync"
	"time"
)

// Throttle batches status writes that only move counts: at most one per interval per
// object, so that thousands of nodes finishing make a handful of status writes, not thousands.
// Changes a watcher must see at once (phases, condition states) are written whatever it says.
// The zero value is ready to use; a nil Throttle holds nothing back.
type Throttle struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// Wait is how long a status write of the object key must wait: zero when it is urgent, when
// interval is not positive, or when the last write was at least interval ago.
func (t *Throttle) Wait(key string, urgent bool, interval time.Duration, now time.Time) time.Duration {
	if t == nil || urgent || interval <= 0 {
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
func (t *Throttle) Wrote(key string, now time.Time) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil {
		t.last = map[string]time.Time{}
	}
	t.last[key] = now
}

// Forget drops key, an object that is gone.
func (t *Throttle) Forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.last, key)
}
