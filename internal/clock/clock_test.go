package clock

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Errorf("Sleep = %v, want nil", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep on a cancelled context = %v, want context.Canceled", err)
	}
	if time.Since(start) > time.Second {
		t.Errorf("Sleep on a cancelled context waited %s", time.Since(start))
	}
}

// A loop that sleeps between tries stops once its context ended, even when its interval has passed
// too (a short poll on a loaded machine): a select between two ready cases picks either, and the
// drain, whose timeout had cancelled its context, once evicted its pods again.
func TestSleepOnAnEndedContextNeverReturnsNil(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 1000 {
		if err := Sleep(ctx, 0); !errors.Is(err, context.Canceled) {
			t.Fatalf("try %d: Sleep(0) on a cancelled context = %v, want context.Canceled", i, err)
		}
	}
}

func TestFunc(t *testing.T) {
	held := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := Func(func() time.Time { return held }).Now(); !got.Equal(held) {
		t.Errorf("a held clock reads %v, want %v", got, held)
	}
	before := time.Now()
	if got := Func(nil).Now(); got.Before(before) {
		t.Errorf("the nil clock reads %v, before the machine's %v", got, before)
	}
}
