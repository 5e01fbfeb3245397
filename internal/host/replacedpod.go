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

// killedWait bounds the wait for a process sent SIGKILL to be gone.
const killedWait = time.Second

// StopReplacedPods stops every process still running in the cgroups of the pods whose UIDs graces
// holds, ones the running kubelet no longer has (static pods it replaced under new UIDs after its
// restart): each gets SIGTERM, all at once, and SIGKILL if it still runs after its pod's grace (a
// pod whose grace is 0 gets SIGKILL at once); it returns once they are gone. That is what the
// kubelet's housekeeping does to such orphaned pods (with a grace of 1 s), only sooner: the
// housekeeping runs 2 s or more after the kubelet read its pods, by when the new pods' containers
// may have started and failed on the old ones' ports. It returns how many processes of each pod it
// stopped.
//
// Only a process whose cgroup names one of the pods is touched, checked again through a pidfd that
// holds that very process, so a PID used again meanwhile is never signalled.
func (k *KubeletPods) StopReplacedPods(ctx context.Context, graces map[string]time.Duration) (map[string]int, error) {
	uids := make([]string, 0, len(graces))
	var grace time.Duration
	for uid, g := range graces {
		uids = append(uids, uid)
		grace = max(grace, g)
		if len(uid) < 8 {
			return nil, fmt.Errorf("pod UID %q is too short to look for", uid)
		}
	}
	proc := filepath.Join(k.Root, "proc")
	entries, err := os.ReadDir(proc)
	if err != nil {
		return nil, err
	}
	stopped := map[string]int{}
	var held []int // pidfds of the processes signalled
	defer func() {
		for _, fd := range held {
			_ = unix.Close(fd)
		}
	}()
	var errs []error
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		uid := podOf(proc, pid, uids)
		if uid == "" {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone meanwhile
		}
		if podOf(proc, pid, []string{uid}) == "" {
			_ = unix.Close(fd)
			continue
		}
		sig, name := unix.SIGTERM, "SIGTERM"
		if graces[uid] <= 0 {
			sig, name = unix.SIGKILL, "SIGKILL"
		}
		if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
			_ = unix.Close(fd)
			if !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("process %d: %s: %w", pid, name, err))
			}
			continue
		}
		held = append(held, fd)
		stopped[uid]++
	}
	left := waitExited(ctx, held, grace)
	for _, fd := range left {
		if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("SIGKILL: %w", err))
		}
	}
	// A killed process is gone within moments: wait for that, so that its ports are free on return.
	if len(waitExited(ctx, left, killedWait)) > 0 && ctx.Err() == nil {
		errs = append(errs, fmt.Errorf("a process still ran %s after SIGKILL", killedWait))
	}
	return stopped, errors.Join(errs...)
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

// podOf is the one of uids whose pod cgroup process pid, read from proc, is in ("" when none), as
// the kubelet names a pod's cgroup: pod<uid> with the cgroupfs driver, a slice ending in
// pod<uid with "-" as "_">.slice with systemd's.
func podOf(proc string, pid int, uids []string) string {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		// hierarchy-ID:controllers:path; the path's parts are compared whole, so that no other
		// UID that merely starts with one of these matches.
		_, rest, _ := strings.Cut(line, ":")
		_, path, _ := strings.Cut(rest, ":")
		for _, part := range strings.Split(path, "/") {
			for _, uid := range uids {
				for _, name := range []string{"pod" + uid, "pod" + strings.ReplaceAll(uid, "-", "_")} {
					if part == name || strings.HasSuffix(part, "-"+name+".slice") {
						return uid
					}
				}
			}
		}
	}
	return ""
}
