package realnode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Down tears the node down and leaves the machine as it was before `up`: kubeadm reset, the
// kubelet, containerd, the shims and every container process stopped, their mounts, cgroups and
// bridge removed, the host binaries put back and every path the node created deleted. It is safe
// to run at any time, also when `up` failed half-way or never ran.
func Down(ctx context.Context) error {
	_, errState := os.Stat(StateDir)
	_, errRun := os.Stat(RunDir)
	if errState != nil && errRun != nil && len(nodeProcesses()) == 0 {
		Logf("no real node here: nothing to tear down")
		return nil
	}
	start := time.Now()
	var errs []error
	supervised := false
	if _, err := Call(SupervisorSock, "list", "", 5*time.Second); err == nil {
		supervised = true
	}
	if supervised && exists("/usr/bin/kubeadm") && exists("/etc/kubernetes") {
		Logf("kubeadm reset")
		rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		logf, _ := os.OpenFile(filepath.Join(LogDir, "kubeadm-reset.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		var w io.Writer = io.Discard
		if logf != nil {
			w = logf
		}
		if err := run(rctx, w, "/usr/bin/kubeadm", "reset", "-f", "--cri-socket", "unix://"+ContainerdSock); err != nil {
			Logf("kubeadm reset failed (going on with the rest): %v", err)
		}
		cancel()
		if logf != nil {
			logf.Close()
		}
	}
	if supervised {
		for _, u := range []string{"kubelet", "containerd"} {
			if _, err := Call(SupervisorSock, "stop", u, time.Minute); err != nil {
				errs = append(errs, fmt.Errorf("stop %s: %w", u, err))
			}
		}
	}
	// Shims and container processes outlive containerd by design; the supervisor reaps them.
	killNodeProcesses(false)
	if supervised {
		_, _ = Call(SupervisorSock, "exit", "", time.Minute)
	}
	killNodeProcesses(true)
	if left := nodeProcesses(); len(left) > 0 {
		errs = append(errs, fmt.Errorf("processes still running: %v", left))
	}
	if err := unmountAll(); err != nil {
		errs = append(errs, err)
	}
	if exists(RootMadeShared) {
		if err := syscall.Mount("none", "/", "", syscall.MS_PRIVATE, ""); err != nil {
			errs = append(errs, fmt.Errorf("make / private again: %w", err))
		}
	}
	if err := removeCgroups(); err != nil {
		errs = append(errs, err)
	}
	if _, err := os.Stat("/sys/class/net/" + BridgeName); err == nil {
		if err := run(ctx, io.Discard, "ip", "link", "delete", BridgeName); err != nil {
			errs = append(errs, err)
		}
	}
	if err := restoreHostBinaries(); err != nil {
		errs = append(errs, err)
	}
	if err := removeOwned(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tear-down incomplete: %w", err)
	}
	Logf("torn down in %s: no kubelet, containerd or control-plane process, mount, cgroup or file of the node remains",
		time.Since(start).Round(time.Second))
	return nil
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// nodeProcesses lists the processes the node started: those running a binary from the state
// directory (containerd, shims, runc, the supervisor) or the host's kubelet, and every process in
// the kubepods or k8s.io cgroups (the containers, the control plane among them).
func nodeProcesses() []int {
	var pids []int
	self := os.Getpid()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		exe = strings.TrimSuffix(exe, " (deleted)")
		if strings.HasPrefix(exe, RuntimeBinDir+"/") || exe == "/usr/bin/kubelet" {
			pids = append(pids, pid)
			continue
		}
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if InNodeCgroup(string(cg)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// InNodeCgroup tells from /proc/PID/cgroup whether a process belongs to the node's pods.
func InNodeCgroup(procCgroup string) bool {
	for _, line := range strings.Split(procCgroup, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		p := parts[2]
		for _, root := range nodeCgroupRoots {
			if p == "/"+root || strings.HasPrefix(p, "/"+root+"/") {
				return true
			}
		}
	}
	return false
}

var nodeCgroupRoots = []string{"kubepods", "kubepods.slice", "k8s.io"}

// killNodeProcesses sends SIGKILL to the node's processes until none remain (30 s at most).
// The supervisor itself is spared unless all is true.
func killNodeProcesses(all bool) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		left := 0
		for _, pid := range nodeProcesses() {
			exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
			if !all && strings.TrimSuffix(exe, " (deleted)") == filepath.Join(RuntimeBinDir, "realnode") {
				continue
			}
			if state(pid) == "Z" {
				continue // exited; its parent (the supervisor) reaps it
			}
			left++
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if left == 0 {
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func state(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(data)
	if i := strings.LastIndex(s, ")"); i >= 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return ""
}

// mountPoints lists mount points with their file system types, from /proc/self/mountinfo.
func mountPoints() (map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		fstype := ""
		for i, x := range fields {
			if x == "-" && i+1 < len(fields) {
				fstype = fields[i+1]
			}
		}
		out[unescapeMount(fields[4])] = fstype
	}
	return out, sc.Err()
}

func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// NodeMount tells whether a mount point is one the node made.
func NodeMount(p string) bool {
	for _, prefix := range []string{"/var/lib/kubelet", StateDir, RunDir, "/run/netns/cni-", "/var/run/netns/cni-"} {
		if p == prefix || strings.HasPrefix(p, prefix+"/") || (strings.HasSuffix(prefix, "-") && strings.HasPrefix(p, prefix)) {
			return true
		}
	}
	return false
}

// unmountAll detaches every mount the node made, deepest first.
func unmountAll() error {
	for range 3 {
		mounts, err := mountPoints()
		if err != nil {
			return err
		}
		var ours []string
		for p := range mounts {
			if NodeMount(p) {
				ours = append(ours, p)
			}
		}
		if len(ours) == 0 {
			return nil
		}
		sort.Slice(ours, func(i, j int) bool { return len(ours[i]) > len(ours[j]) })
		for _, p := range ours {
			_ = syscall.Unmount(p, syscall.MNT_DETACH)
		}
	}
	mounts, err := mountPoints()
	if err != nil {
		return err
	}
	var left []string
	for p := range mounts {
		if NodeMount(p) {
			left = append(left, p)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("mounts left: %v", left)
	}
	return nil
}

// removeCgroups removes the kubepods and k8s.io cgroups in every hierarchy, deepest first.
func removeCgroups() error {
	mounts, err := mountPoints()
	if err != nil {
		return err
	}
	var errs []error
	for mp, fstype := range mounts {
		if fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		for _, root := range nodeCgroupRoots {
			top := filepath.Join(mp, root)
			if !exists(top) {
				continue
			}
			var dirs []string
			_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
			for _, d := range dirs {
				var rmErr error
				for range 10 {
					if rmErr = syscall.Rmdir(d); rmErr == nil || errors.Is(rmErr, syscall.ENOENT) {
						rmErr = nil
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				if rmErr != nil {
					errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, rmErr))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// restoreHostBinaries removes the node's kubeadm, kubelet, kubectl, systemctl stand-in and
// containerd config and puts back whatever was there before.
func restoreHostBinaries() error {
	var errs []error
	for _, p := range HostFiles {
		saved := filepath.Join(BackupDir, p)
		if !exists(StateDir) {
			break // nothing was installed by a node
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
			continue
		}
		_ = os.Remove(p + ".realnode-tmp")
		if exists(saved) {
			if err := os.Rename(saved, p); err != nil {
				errs = append(errs, fmt.Errorf("restore %s: %w", p, err))
			}
		}
	}
	return errors.Join(errs...)
}

// removeOwned deletes the paths recorded by `up` as created by the node, never descending into
// a mount point.
func removeOwned() error {
	data, err := os.ReadFile(OwnedList)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", OwnedList, err)
	}
	mounts, err := mountPoints()
	if err != nil {
		return err
	}
	var errs []error
	owned := strings.Fields(string(data))
	// The state directory holds the list itself: it goes last.
	sort.SliceStable(owned, func(i, j int) bool { return owned[j] == StateDir && owned[i] != StateDir })
	for _, p := range owned {
		if !filepath.IsAbs(p) || p == "/" {
			continue
		}
		blocked := false
		for mp := range mounts {
			if mp == p || strings.HasPrefix(mp, p+"/") {
				errs = append(errs, fmt.Errorf("not removing %s: %s is still mounted", p, mp))
				blocked = true
				break
			}
		}
		if blocked {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
