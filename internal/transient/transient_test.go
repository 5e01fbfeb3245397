package transient

import (
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// A client's rate limiter refuses a request at once when its wait would pass the context's
// deadline, before the context has ended and without wrapping context.DeadlineExceeded: that is
// the end of the caller's wait, not an answer. An answer from the API server is not.
func TestCutOffKnowsTheRateLimitersRefusal(t *testing.T) {
	lim := rate.NewLimiter(rate.Every(time.Hour), 1)
	lim.Allow() // the one token is spent: the next waits an hour
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := lim.Wait(ctx)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("the limiter's refusal: %v with the context %v; want a refusal before the context ends", err, ctx.Err())
	}
	if !CutOff(ctx, err) {
		t.Errorf("CutOff(%q) = false, want true", err)
	}
	notFound := apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "p")
	if CutOff(ctx, notFound) {
		t.Errorf("CutOff(%q) = true for an answer from the API server, want false", notFound)
	}
	if CutOff(ctx, nil) {
		t.Error("CutOff(nil) = true, want false")
	}
	done, stop := context.WithCancel(context.Background())
	stop()
	if !CutOff(done, notFound) {
		t.Error("CutOff after the context ended = false, want true")
	}
}

// When the caller's deadline cuts an attempt short after the API server answered 503, the error
// names the 503: the deadline is not the API server's answer (TestNodeWritesWaitOutAMomentOf503s
// saw "context deadline exceeded" from the node read under load instead).
func TestRetryCutShortNamesTheLastTransientAnswer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	unavailable := apierrors.NewServiceUnavailable("the server is currently unable to handle the request")
	calls := 0
	err := Retry(ctx, func() error {
		calls++
		if calls == 1 {
			return unavailable
		}
		<-ctx.Done() // the next read outlives the deadline, as a slow GET does under load
		return ctx.Err()
	})
	if calls != 2 {
		t.Fatalf("Retry called do %d times, want 2", calls)
	}
	if !apierrors.IsServiceUnavailable(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Retry = %v, want the 503 and the deadline", err)
	}

	// A refusal that is not transient is returned as it is, whatever came before.
	notFound := apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "n")
	calls = 0
	err = Retry(context.Background(), func() error {
		calls++
		if calls == 1 {
			return unavailable
		}
		return notFound
	})
	if !apierrors.IsNotFound(err) || apierrors.IsServiceUnavailable(err) {
		t.Errorf("Retry = %v, want the NotFound alone", err)
	}
}
