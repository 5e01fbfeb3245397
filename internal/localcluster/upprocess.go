package localcluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// UpProcess is a `nodeops-local up` running as a child process, as the e2e tests and the bench drive it.
type UpProcess struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error

	ready      chan struct{}
	kubeconfig string

	mu     sync.Mutex
	output strings.Builder

	stopOnce sync.Once
	stopErr  error
}

// StartUpProcess starts `bin/nodeops-local up args...` with NODEOPS_BIN=bin; Ready waits for its ready line.
func StartUpProcess(bin string, args ...string) (*UpProcess, error) {
	cmd := exec.Command(filepath.Join(bin, "nodeops-local"), append([]string{"up"}, args...)...)
	cmd.Env = append(os.Environ(), "NODEOPS_BIN="+bin)
	// If the caller dies (a test timeout panics), nodeops-local is told to stop its children.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting nodeops-local: %w", err)
	}
	u := &UpProcess{cmd: cmd, exited: make(chan struct{}), ready: make(chan struct{})}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			u.mu.Lock()
			u.output.WriteString(line + "\n")
			first := u.kubeconfig == "" && strings.HasPrefix(line, ReadyPrefix)
			if first {
				u.kubeconfig = strings.TrimPrefix(line, ReadyPrefix)
			}
			u.mu.Unlock()
			if first {
				close(u.ready)
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		u.waitErr = cmd.Wait()
		_ = pw.Close()
		// Exited only once everything printed is in Output, so an early exit's message is never lost.
		<-read
		close(u.exited)
	}()
	return u, nil
}

// Ready waits for the ready line and returns the kubeconfig it names; it fails, with what
// nodeops-local printed, when nodeops-local exits first or ctx ends.
func (u *UpProcess) Ready(ctx context.Context) (string, error) {
	select {
	case <-u.ready:
		u.mu.Lock()
		defer u.mu.Unlock()
		return u.kubeconfig, nil
	case <-u.exited:
		return "", fmt.Errorf("nodeops-local exited before it was ready (%w):\n%s", u.waitErr, u.Output())
	case <-ctx.Done():
		return "", fmt.Errorf("nodeops-local was not ready: %w:\n%s", context.Cause(ctx), u.Output())
	}
}

// PID is nodeops-local's own process ID.
func (u *UpProcess) PID() int { return u.cmd.Process.Pid }

// Output is what nodeops-local printed so far.
func (u *UpProcess) Output() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.output.String()
}

// Exited is closed once nodeops-local has exited (for example after `nodeops-local down`).
func (u *UpProcess) Exited() <-chan struct{} { return u.exited }

// Stop sends SIGTERM to nodeops-local (it stops its children first) and waits until it exited,
// killing it after timeout. It returns nodeops-local's exit error; calling it again returns the same.
func (u *UpProcess) Stop(timeout time.Duration) error {
	u.stopOnce.Do(func() {
		select {
		case <-u.exited:
		default:
			_ = u.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-u.exited:
			case <-time.After(timeout):
				_ = u.cmd.Process.Kill()
				<-u.exited
				u.stopErr = fmt.Errorf("nodeops-local did not stop within %s after SIGTERM; killed", timeout)
				return
			}
		}
		u.stopErr = u.waitErr
	})
	return u.stopErr
}
