// Package clock holds the small time helpers that waiting code shares (the agent, its commands, the benchmark)
// and the clock the controllers take (Func), so that a test can hold time.
//
// It holds no state and imports nothing of nodeops.
package clock

import (
	"context"
	"time"
)

// Sleep waits d or until ctx ends, whichever is first; it returns ctx's error when ctx ended first,
// at once when it had ended before the call (where a select would pick either ready case).
func Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Func is an injected clock; the nil Func reads the machine's. A controller takes one so that a
// test can move time itself (the status throttle's windows, TTLs, certificate expiry).
type Func func() time.Time

// Now is f's time, or the machine's when f is nil.
func (f Func) Now() time.Time {
	if f == nil {
		return time.Now()
	}
	return f()
}
