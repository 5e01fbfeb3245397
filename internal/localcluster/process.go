package localcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nodeops/nodeops/internal/clock"
)

// ProcessesFile lists, one "name pid" a line, the child processes of a running nodeops-local;
// it is rewritten whenever a child starts, so tests can find (and kill) them by PID.
const ProcessesFile = "processes"

// supervisor runs the child processes, each in its own process group with its output in
// DIR/logs/<name>.log. Once keepAlive is set (after start-up), a child that exits is started again
// after a back-off, as a kubelet restarts a crashed static pod. Before that, a child that exits soon
// after it started (a bad flag, a port taken) is reported on failed at once; one that crashed as a Go
// program does (a panic or a fatal error in its log) or had run for startUpRetryAfter is started
// again once, because a component can crash on a start-up race of its own (kwok v0.8.0 has panicked
// in its pod controller while the cluster came up), and a second exit is reported.
type supervisor struct {
	dir    string
	logf   func(format string, args ...any)
	failed chan error
	// startUpRetryAfter: how long a child must have run for its exit during start-up to earn it one
	// more start.
	startUpRetryAfter time.Duration

	mu        sync.Mutex
	procs     []*child
	keepAlive bool
	stopping  bool
}

type child struct {
	name string
	path string
	args []string
	// env is added to nodeops-local's environment.
	env []string
	// once children (runOnce) are never started again.
	once bool

	// guarded by supervisor.mu
	cmd  *exec.Cmd
	done chan struct{}
	// restartNow: the next exit was asked for (restart), start it again at once.
	restartNow bool
	// startedAgain: it already had its one more start during start-up.
	startedAgain bool
}

func newSupervisor(dir string, logf func(string, ...any)) *supervisor {
	return &supervisor{dir: dir, logf: logf, failed: make(chan error, 1), startUpRetryAfter: 3 * time.Second}
}

// start launches bin with args as child name and supervises it until stopAll.
func (s *supervisor) start(name, bin string, args ...string) error {
	c := &child{name: name, path: bin, args: args}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return errors.New("stopping")
	}
	if err := s.launchLocked(c); err != nil {
		return err
	}
	s.procs = append(s.procs, c)
	return s.writePIDsLocked()
}

// runOnce launches bin with args and env as child name and returns it: it is not started again
// when it exits (its exit ends it, as a container's ends a pod that does not restart), and stopAll
// stops it while it runs. done is closed once it exited; cmd.ProcessState then holds its exit code.
func (s *supervisor) runOnce(name, bin string, args, env []string) (cmd *exec.Cmd, done <-chan struct{}, err error) {
	c := &child{name: name, path: bin, args: args, env: env, once: true}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return nil, nil, errors.New("stopping")
	}
	if err := s.launchLocked(c); err != nil {
		return nil, nil, err
	}
	s.procs = append(s.procs, c)
	return c.cmd, c.done, s.writePIDsLocked()
}

func (s *supervisor) launchLocked(c *child) error {
	if err := os.MkdirAll(filepath.Join(s.dir, "logs"), 0o755); err != nil {
		return fmt.Errorf("creating log directory: %w", err)
	}
	logPath := filepath.Join(s.dir, "logs", c.name+".log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening %s: %w", logPath, err)
	}
	fmt.Fprintf(log, "%s%s %s at %s\n", startLine, c.path, strings.Join(c.args, " "), time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.path, c.args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Dir = s.dir
	if c.env != nil {
		cmd.Env = append(os.Environ(), c.env...)
	}
	// Own process group: a terminal's Ctrl-C reaches only nodeops-local, which stops children in order;
	// Pdeathsig: if nodeops-local itself is killed, the children do not outlive it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("starting %s (%s): %w", c.name, c.path, err)
	}
	c.cmd, c.done = cmd, make(chan struct{})
	started := time.Now()
	go func(cmd *exec.Cmd, done chan struct{}) {
		err := cmd.Wait()
		fmt.Fprintf(log, "=== nodeops-local: %s exited: %v\n", c.name, err)
		_ = log.Close()
		close(done)
		s.exited(c, cmd, err, time.Since(started))
	}(cmd, c.done)
	return nil
}

func (s *supervisor) exited(c *child, cmd *exec.Cmd, err error, ran time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping || c.cmd != cmd {
		return
	}
	if c.once {
		s.procs = slices.DeleteFunc(s.procs, func(p *child) bool { return p == c })
		if err := s.writePIDsLocked(); err != nil {
			s.logf("%v", err)
		}
		return
	}
	if !s.keepAlive {
		logPath := filepath.Join(s.dir, "logs", c.name+".log")
		words, crashed := lastWords(logPath)
		if (crashed || ran >= s.startUpRetryAfter) && !c.startedAgain {
			c.startedAgain = true
			s.logf("%s exited during start-up after %.1fs (%v); starting it again once. What it said:\n%s",
				c.name, ran.Seconds(), err, words)
			lerr := s.launchLocked(c)
			if lerr == nil {
				if err := s.writePIDsLocked(); err != nil {
					s.logf("%v", err)
				}
				return
			}
			words += fmt.Sprintf("\n(and starting it again failed: %v)", lerr)
		}
		select {
		case s.failed <- fmt.Errorf("%s exited during start-up (%w); from %s:\n%s", c.name, err, logPath, words):
		default:
		}
		return
	}
	backoff := time.Second
	if ran < 10*time.Second {
		backoff = 5 * time.Second
	}
	if c.restartNow {
		c.restartNow, backoff = false, 0
	}
	s.logf("%s exited (%v); starting it again in %s", c.name, err, backoff)
	go func() {
		time.Sleep(backoff)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.stopping || c.cmd != cmd {
			return
		}
		if err := s.launchLocked(c); err != nil {
			s.logf("restarting %s: %v", c.name, err)
			return
		}
		if err := s.writePIDsLocked(); err != nil {
			s.logf("%v", err)
		}
	}()
}

// restart stops child name (SIGTERM to its process group) and starts it again as soon as it exited,
// without the back-off of a crash, as a kubelet restarts a static pod whose files changed.
func (s *supervisor) restart(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.procs {
		if c.name == name && c.cmd != nil && c.cmd.Process != nil {
			c.restartNow = true
			_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
		}
	}
}

// setKeepAlive switches from "an exit is a start-up failure" to "an exit is restarted".
func (s *supervisor) setKeepAlive() {
	s.mu.Lock()
	s.keepAlive = true
	s.mu.Unlock()
}

// stopAll stops the children in the reverse order of their start: SIGTERM to each process group,
// SIGKILL to the groups still alive after grace.
func (s *supervisor) stopAll(grace time.Duration) {
	type running struct {
		name string
		pgid int
		done chan struct{}
	}
	s.mu.Lock()
	s.stopping = true
	var procs []running
	for _, c := range s.procs {
		procs = append(procs, running{c.name, c.cmd.Process.Pid, c.done})
	}
	s.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		p := procs[i]
		_ = syscall.Kill(-p.pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			s.logf("%s did not stop within %s; killing it", p.name, grace)
			_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
			<-p.done
		}
		// A child's own children may outlive it in its group; kill them and wait until they are
		// gone, so nothing we started is still alive when stopAll returns.
		_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
		waitGroupGone(p.pgid, grace)
	}
}

// waitGroupGone waits, up to timeout, until no live process is left in process group pgid.
func waitGroupGone(pgid int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if members, err := ProcessGroupMembers([]int{pgid}); err != nil || len(members) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *supervisor) writePIDsLocked() error {
	var b bytes.Buffer
	for _, c := range s.procs {
		fmt.Fprintf(&b, "%s %d\n", c.name, c.cmd.Process.Pid)
	}
	return writeFileAtomic(filepath.Join(s.dir, ProcessesFile), b.Bytes(), 0o644)
}

// ReadProcesses returns the name -> PID table a running (or stopped) nodeops-local wrote in dir.
func ReadProcesses(dir string) (map[string]int, error) {
	data, err := os.ReadFile(filepath.Join(dir, ProcessesFile))
	if err != nil {
		return nil, fmt.Errorf("reading process table: %w", err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var name string
		var pid int
		if _, err := fmt.Sscanf(line, "%s %d", &name, &pid); err == nil {
			out[name] = pid
		}
	}
	return out, nil
}

// ProcessGroupMembers returns the PIDs of live processes whose process group is one of pgids,
// read from /proc; zombies are not counted as alive.
func ProcessGroupMembers(pgids []int) ([]int, error) {
	want := map[int]bool{}
	for _, p := range pgids {
		want[p] = true
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing /proc: %w", err)
	}
	var found []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the parenthesised command: state ppid pgrp ...
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		var state string
		var ppid, pgrp int
		if _, err := fmt.Sscanf(s[i+1:], " %s %d %d", &state, &ppid, &pgrp); err != nil {
			continue
		}
		if (want[pgrp] || want[pid]) && state != "Z" {
			found = append(found, pid)
		}
	}
	sort.Ints(found)
	return found, nil
}

// startLine begins the line the supervisor writes to a child's log at each start.
const startLine = "=== nodeops-local: starting "

// lastWords returns what a child's last run wrote to its log at path: from a Go runtime's "panic:"
// or "fatal error:" line when there is one (crashed), so the message is not cut off by the goroutine
// dump after it (up to crashLines lines), else its last tailLines lines.
func lastWords(path string) (words string, crashed bool) {
	const tailLines, crashLines = 15, 40
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error(), false
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	for i := len(all) - 1; i >= 0; i-- {
		if strings.HasPrefix(all[i], startLine) {
			all = all[i:]
			break
		}
	}
	for i, line := range all {
		if strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") {
			return strings.Join(all[i:min(len(all), i+crashLines)], "\n"), true
		}
	}
	if len(all) > tailLines {
		all = all[len(all)-tailLines:]
	}
	return strings.Join(all, "\n"), false
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("renaming %s: %w", tmp, err)
	}
	return nil
}

// copyFile copies src to dst with mode, replacing dst.
func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("opening %s: %w", src, err)
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(dst), err)
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("creating %s: %w", dst, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", dst, err)
	}
	return nil
}

// WaitUntil polls cond every interval until it returns true, or returns an error when ctx ends,
// wrapping the last error cond returned.
func WaitUntil(ctx context.Context, interval time.Duration, cond func(context.Context) (bool, error)) error {
	var last error
	for {
		ok, err := cond(ctx)
		if err == nil && ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if cerr := clock.Sleep(ctx, interval); cerr != nil {
			if last != nil {
				return fmt.Errorf("%w (last error: %w)", cerr, last)
			}
			return cerr
		}
	}
}
