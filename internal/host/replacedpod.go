package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// StopReplacedPod stops every process still running in the cgroup of the pod with UID uid, one the
// running kubelet no longer has (a static pod it replaced under a new UID after its restart): each
// gets SIGTERM, and SIGKILL if it still runs after grace. That is what the kubelet's housekeeping
// does to such an orphaned pod (with a grace of 1 s), only sooner: the housekeeping runs 2 s or more
// after the kubelet read its pods, by when the new pod's containers may have started and failed on
// the old ones' ports. It returns how many processes it stopped.
//
// Only a process whose cgroup names the pod is touched, checked again through a pidfd that holds
// that very process, so a PID used again meanwhile is never signalled.
func (k *KubeletPods) StopReplacedPod(ctx context.Context, uid string, grace time.Duration) (int, error) {
	if len(uid) < 8 {
		return 0, fmt.Errorf("pod UID %q is too short to look for", uid)
	}
	proc := filepath.Join(k.Root, "proc")
	pids, err := podPIDs(proc, uid)
	if err != nil {
		return 0, err
	}
	var held []int // pidfds of the processes signalled
	defer func() {
		for _, fd := range held {
			_ = unix.Close(fd)
		}
	}()
	var errs []error
	for _, pid := range pids {
		if pid == os.Getpid() {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone meanwhile
		}
		if !inPod(proc, pid, uid) {
			_ = unix.Close(fd)
			continue
		}
		if err := unix.PidfdSendSignal(fd, unix.SIGTERM, nil, 0); err != nil {
			_ = unix.Close(fd)
			if !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("process %d: SIGTERM: %w", pid, err))
			}
			continue
		}
		held = append(held, fd)
	}
	running := waitExited(ctx, held, grace)
	for _, fd := range running {
		if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("SIGKILL: %w", err))
		}
	}
	return len(held), errors.Join(errs...)
}

// waitExited waits until every process of fds has exited, grace has passed or ctx ends, and
// returns the pidfds of those still running.
func waitExited(ctx context.Context, fds []int, grace time.Duration) []int {
	deadline := time.Now().Add(grace)
	running := fds
	for len(running) > 0 {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			break
		}
		polls := make([]unix.PollFd, len(running))
		for i, fd := range running {
			polls[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
		}
		// A pidfd becomes readable when its process exits. Short polls, so that ctx is heard.
		if _, err := unix.Poll(polls, int(min(left, 100*time.Millisecond)/time.Millisecond)+1); err != nil && !errors.Is(err, unix.EINTR) {
			break
		}
		var still []int
		for i, p := range polls {
			if p.Revents == 0 {
				still = append(still, running[i])
			}
		}
		running = still
	}
	return running
}

// podPIDs are the processes whose cgroup names the pod uid, as the kubelet names a pod's cgroup:
// pod<uid> with the cgroupfs driver, pod<uid with "-" as "_">.slice with systemd's.
func podPIDs(proc, uid string) ([]int, error) {
	entries, err := os.ReadDir(proc)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if inPod(proc, pid, uid) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// inPod says whether process pid's cgroup, read from proc, is in the pod uid's cgroup.
func inPod(proc string, pid int, uid string) bool {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return false
	}
	names := []string{"pod" + uid, "pod" + strings.ReplaceAll(uid, "-", "_")}
	for _, line := range strings.Split(string(b), "\n") {
		// hierarchy-ID:controllers:path; the path's parts are checked whole, so that no other
		// UID that merely starts with this one matches.
		_, rest, _ := strings.Cut(line, ":")
		_, path, _ := strings.Cut(rest, ":")
		for _, part := range strings.Split(path, "/") {
			for _, name := range names {
				if part == name || strings.HasSuffix(part, "-"+name+".slice") {
					return true
				}
			}
		}
	}
	return false
}
