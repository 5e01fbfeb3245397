package realnode

import (
	"context"
	"io"
	"log"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The supervisor runs a real process, restarts it when it dies, and obeys stop/start/restart.
func TestSupervisorRestartsAndObeys(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	units := []Unit{{Name: "svc", RestartDelay: 100 * time.Millisecond,
		Command: func() ([]string, []string, error) { return []string{"/bin/sleep", "300"}, nil, nil }}}
	s := NewSupervisor(units, dir, log.New(io.Discard, "", 0))
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background(), sock) }()

	pidOf := func() string {
		t.Helper()
		var reply string
		waitTrue(t, func() bool {
			r, err := Call(sock, "status", "svc", 5*time.Second)
			reply = r
			return err == nil && strings.HasPrefix(r, "active ")
		})
		return strings.Fields(reply)[1]
	}
	first := pidOf()
	if _, err := Call(sock, "restart", "svc", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	second := pidOf()
	if second == first {
		t.Fatalf("restart kept %s", first)
	}
	// A unit that dies is started again, as systemd's Restart=always does.
	s.mu.Lock()
	p := s.units["svc"].proc
	s.mu.Unlock()
	_ = p.Kill()
	waitTrue(t, func() bool { return pidOf() != second })

	if r, err := Call(sock, "stop", "svc", 30*time.Second); err != nil || r != "inactive" {
		t.Fatalf("stop: %q %v", r, err)
	}
	if _, err := Call(sock, "restart", "nope", 5*time.Second); err == nil || !strings.Contains(err.Error(), "unknown unit") {
		t.Errorf("unknown unit: %v", err)
	}
	if _, err := Call(sock, "exit", "", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("supervisor did not exit")
	}
}

func waitTrue(t *testing.T, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
