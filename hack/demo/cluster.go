package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// readyPrefix is the line nodeops-local prints once every node is Ready.
const readyPrefix = "ready: kubeconfig="

// cluster is a running `nodeops-local up`.
type cluster struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startCluster starts nodeops-local in its own session, its output in logFile. Unless keep, it is
// also told to stop should the demo die without stopping it.
func startCluster(bin, dir, logFile string, keep bool, args ...string) (*cluster, error) {
	f, err := os.Create(logFile)
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", logFile, err)
	}
	defer f.Close()
	cmd := exec.Command(filepath.Join(bin, "nodeops-local"), append([]string{"up", "--dir", dir}, args...)...)
	cmd.Env = append(os.Environ(), "NODEOPS_BIN="+bin)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own session: a Ctrl-C reaches the demo, which then stops it in order (or, with --keep, leaves it).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if !keep {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting nodeops-local: %w", err)
	}
	c := &cluster{cmd: cmd, log: logFile, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// waitReady follows nodeops-local's log, copying its progress lines to out, until the ready line.
func (c *cluster) waitReady(ctx context.Context, out io.Writer) (kubeconfig string, err error) {
	f, err := os.Open(c.log)
	if err != nil {
		return "", fmt.Errorf("opening %s: %w", c.log, err)
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var partial string
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	exited := false
	for {
		for {
			s, err := r.ReadString('\n')
			partial += s
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return "", fmt.Errorf("reading %s: %w", c.log, err)
			}
			line := strings.TrimRight(partial, "\n")
			partial = ""
			fmt.Fprintf(out, "  %s\n", line)
			if kc, ok := strings.CutPrefix(line, readyPrefix); ok {
				return kc, nil
			}
		}
		if exited {
			return "", fmt.Errorf("nodeops-local exited before it was ready: %w; its log is %s", c.exitErr(), c.log)
		}
		select {
		case <-c.done:
			exited = true // read what it wrote last, then report
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for nodeops-local to be ready: %w", context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM, which makes nodeops-local stop all its children, and waits; after timeout it kills it.
func (c *cluster) stop(timeout time.Duration) error {
	select {
	case <-c.done:
		return nil // nothing left to stop: its children stop with it
	default:
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("signalling nodeops-local: %w", err)
	}
	select {
	case <-c.done:
		if c.err != nil {
			return fmt.Errorf("nodeops-local stopped with %w; its log is %s", c.err, c.log)
		}
		return nil
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("nodeops-local did not stop within %s after SIGTERM; killed", timeout)
	}
}

// exitErr is how nodeops-local ended, once it did; never nil.
func (c *cluster) exitErr() error {
	if c.err == nil {
		return errors.New("exit status 0")
	}
	return c.err
}
