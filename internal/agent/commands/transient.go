package commands

import (
	"context"
	"errors"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
)

// transientBackoff spaces the attempts at an API write the API server failed for a moment: about
// 40 s in all, inside the command's own timeout.
var transientBackoff = wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 9, Cap: 10 * time.Second}

// Transient reports whether an API error says the API server could not answer just now (503,
// 500, 504, a server-side timeout) rather than that the request was wrong: the same request may
// well succeed in a moment, as the fault suite's 503 windows show (test/faults, README "Safety").
func Transient(err error) bool {
	return apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsTimeout(err) || apierrors.IsUnexpectedServerError(err)
}

// retryTransient runs do until it succeeds, fails with an error that is not transient, the
// backoff is spent or ctx ends; it returns do's last error.
func retryTransient(ctx context.Context, do func() error) error {
	b := transientBackoff
	for {
		err := do()
		if err == nil || !Transient(err) || b.Steps <= 1 || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(b.Step())
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
}
