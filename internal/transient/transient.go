// Package transient tells an API server's passing failure from a refusal and waits the former out;
// the agent's node writes and the manager's drain share it.
//
// It decides and waits only: it makes no request itself.
package transient

import (
	"context"
	"errors"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/nodeops/nodeops/internal/clock"
)

// How long an API write the API server failed for a moment is tried again: waits from
// first, doubling up to maxWait, until retryFor has passed, inside the
// command's own timeout.
const (
	first    = 250 * time.Millisecond
	maxWait  = 5 * time.Second
	retryFor = 45 * time.Second
)

// Is reports whether an API error says the API server could not answer just now (503,
// 500, 504, a server-side timeout) rather than that the request was wrong: the same request may
// well succeed in a moment, as the fault suite's 503 windows show (test/faults, docs/development/evidence/faults.md).
func Is(err error) bool {
	return apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsTimeout(err) || apierrors.IsUnexpectedServerError(err)
}

// Retry runs do until it succeeds, fails with an error that is not transient,
// retryFor has passed or ctx ends; it returns do's last error. When ctx ends during an attempt
// after the API server had failed for a moment, that failure is returned with the cut-off: the
// caller's deadline is not the API server's answer, the 503 it kept giving is.
func Retry(ctx context.Context, do func() error) error {
	give := time.Now().Add(retryFor)
	wait := first
	var answered error // the last transient answer of the API server
	for {
		err := do()
		if answered != nil && CutOff(ctx, err) && !Is(err) {
			return errors.Join(answered, err)
		}
		if err == nil || !Is(err) || ctx.Err() != nil || time.Now().Add(wait).After(give) {
			return err
		}
		answered = err
		if cerr := clock.Sleep(ctx, wait); cerr != nil {
			return errors.Join(err, cerr)
		}
		wait = min(2*wait, maxWait)
	}
}

// CutOff reports whether err says a request was not answered because ctx ended, or would have
// ended before the client's rate limiter let the request go: client-go then fails at once with
// golang.org/x/time/rate's "would exceed context deadline", which wraps no sentinel, before ctx
// has actually ended. A busy client near the end of a wait sees this; it is the wait's end, not
// an answer from the API server.
func CutOff(ctx context.Context, err error) bool {
	return err != nil && (ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		strings.Contains(err.Error(), "would exceed context deadline"))
}
