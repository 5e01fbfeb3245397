package localcluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeUp is a stand-in nodeops-local: it prints its arguments, then fails or prints the ready line
// and runs until SIGTERM.
const fakeUp = `#!/bin/sh
echo "args $*"
echo "bin $NODEOPS_BIN"
if [ "$FAKE_UP" = fail ]; then echo boom; exit 3; fi
trap 'echo stopping; exit 0' TERM
echo "` + ReadyPrefix + `/tmp/fake/kubeconfig"
while :; do sleep 0.1; done
`

func fakeBin(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "nodeops-local"), []byte(fakeUp), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestUpProcessReadyAndStop(t *testing.T) {
	bin := fakeBin(t)
	u, err := StartUpProcess(bin, "--dir", "/tmp/fake")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kc, err := u.Ready(ctx)
	if err != nil || kc != "/tmp/fake/kubeconfig" {
		t.Fatalf("Ready = %q, %v", kc, err)
	}
	if out := u.Output(); !strings.Contains(out, "args up --dir /tmp/fake\n") || !strings.Contains(out, "bin "+bin+"\n") {
		t.Errorf("output:\n%s", out)
	}
	if err := u.Stop(10 * time.Second); err != nil {
		t.Fatalf("Stop: %v\n%s", err, u.Output())
	}
	select {
	case <-u.Exited():
	default:
		t.Fatal("Exited is not closed after Stop")
	}
	if !strings.Contains(u.Output(), "stopping\n") {
		t.Errorf("SIGTERM not seen:\n%s", u.Output())
	}
	if err := u.Stop(time.Second); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestUpProcessExitBeforeReady(t *testing.T) {
	t.Setenv("FAKE_UP", "fail")
	u, err := StartUpProcess(fakeBin(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = u.Ready(ctx)
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("Ready = %v", err)
	}
	if err := u.Stop(time.Second); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("Stop = %v, want the exit status", err)
	}
}

func TestUpProcessReadyDeadline(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "nodeops-local"), []byte("#!/bin/sh\necho waiting\nexec sleep 30\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	u, err := StartUpProcess(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = u.Stop(5 * time.Second) }()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := u.Ready(ctx); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Fatalf("Ready = %v", err)
	}
}
