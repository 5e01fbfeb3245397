package transient

import (
	"context"
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
