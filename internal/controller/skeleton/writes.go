package skeleton

import (
	"errors"
	"sync"
)

// Writes runs independent API writes (task creates, node patches, deletes) concurrently, at most
// limit at once, and joins their errors. Create it with NewWrites; Go and Wait from one goroutine.
type Writes struct {
	sem  chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

// NewWrites returns a Writes running at most limit writes at once (at least one).
func NewWrites(limit int) *Writes { return &Writes{sem: make(chan struct{}, max(limit, 1))} }

// Go runs f once a slot is free.
func (w *Writes) Go(f func() error) {
	w.sem <- struct{}{}
	w.wg.Go(func() {
		defer func() { <-w.sem }()
		if err := f(); err != nil {
			w.mu.Lock()
			w.errs = append(w.errs, err)
			w.mu.Unlock()
		}
	})
}

// Wait waits for every write and returns their errors joined.
func (w *Writes) Wait() error {
	w.wg.Wait()
	return errors.Join(w.errs...)
}
