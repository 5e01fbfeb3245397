package framework

import (
	"context"
	"testing"
	"time"

	"github.com/nodeops/nodeops/internal/localcluster"
)

// PollInterval is how often Eventually and WaitFor check their condition.
const PollInterval = 500 * time.Millisecond

// Eventually polls cond until it returns (true, nil), failing t (Fatal) when timeout passes first. An error
// from cond does not stop the wait; the last one is shown on failure, so conditions can explain
// themselves by returning (false, fmt.Errorf("3 of 5 ready")).
func Eventually(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := WaitFor(ctx, PollInterval, cond); err != nil {
		t.Fatalf("waiting %s for %s: %v", timeout, what, err)
	}
}

// WaitFor polls cond every interval until it returns true, or returns an error when ctx ends,
// wrapping the last error cond returned.
func WaitFor(ctx context.Context, interval time.Duration, cond func(ctx context.Context) (bool, error)) error {
	return localcluster.WaitUntil(ctx, interval, cond)
}
