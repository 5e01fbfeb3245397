// Package clock holds the small time helpers that waiting code shares (the agent, its commands, the benchmark).
//
// It holds no state and imports nothing of nodeops.
package clock

import (
	"context"
	"time"
)

// Sleep waits d or until ctx ends, whichever is first; it returns ctx's error when ctx ended first.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
