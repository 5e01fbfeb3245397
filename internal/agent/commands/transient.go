package commands

import (
	"context"
	"errors"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/nodeops/nodeops/internal/clock"
)

// How long an API write the API server failed for a moment is tried again: waits from
// transientFirst, doubling up to transientMaxWait, until transientFor has passed, inside the
// command's own timeout.
const (
	transientFirst   = 250 * time.Millisecond
	transientMaxWait = 5 * time.Second
	transientFor     = 45 * time.Second
)

// Transient reports whether an API error says the API server could not answer just now (503,
// 500, 504, a server-side timeout) rather than that the request was wrong: the same request may
// well succeed in a moment, as the fault suite's 503 windows show (test/faults, README "Safety").
func Transient(err error) bool {
	return apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsTimeout(err) || apierrors.IsUnexpectedServerError(err)
}

// retryTransient runs do until it succeeds, fails with an error that is not transient,
// transientFor has passed or ctx ends; it returns do's last error.
func retryTransient(ctx context.Context, do func() error) error {
	give := time.Now().Add(transientFor)
	wait := transientFirst
	for {
		err := do()
		if err == nil || !Transient(err) || ctx.Err() != nil || time.Now().Add(wait).After(give) {
			return err
		}
		if cerr := clock.Sleep(ctx, wait); cerr != nil {
			return errors.Join(err, cerr)
		}
		wait = min(2*wait, transientMaxWait)
	}
}
