package host_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nodeops/nodeops/internal/host"
)

// TestStopReplacedPodStopsOnlyThatPodsProcesses: after a kubelet restart that replaced a static pod
// under a new UID, the old pod's processes are stopped (SIGTERM, then SIGKILL after the grace for one
// that ignores it; SIGKILL at once for a pod given no grace), and no process of any other pod is touched: not the new pod's, not one whose UID
// merely starts with the old one's. The processes are real; the host's /proc is a directory whose
// cgroup files place them in pods, as the kubelet's cgroupfs and systemd drivers name them.
func TestStopReplacedPodsStopsOnlyThosePodsProcesses(t *testing.T) {
	const (
		oldUID  = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
		killUID = "5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"
		newUID  = "9a8b7c6d5e4f30211203f4e5d6c7b8a9"
	)
	root := t.TempDir()
	start := func(cgroup string, args ...string) *exec.Cmd {
		t.Helper()
		cmd := exec.Command(args[0], args[1:]...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
		dir := filepath.Join(root, "proc", strconv.Itoa(cmd.Process.Pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	oldMain := start("12:pids:/kubepods/burstable/pod"+oldUID+"/1c2b3a\n4:memory:/kubepods/burstable/pod"+oldUID+"/1c2b3a\n", "sleep", "300")
	// A pod given no grace (the old API server's) is killed outright, though SIGTERM would end it.
	oldKilled := start("12:pids:/kubepods/burstable/pod"+killUID+"/2d3e4f\n", "sleep", "300")
	// SIG_IGN survives exec: this sleep ignores SIGTERM, as a component stuck in its shutdown would.
	oldStubborn := start("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+oldUID+".slice/cri-containerd-4d5e.scope\n",
		"sh", "-c", `trap "" TERM; exec sleep 300`)
	newMain := start("12:pids:/kubepods/burstable/pod"+newUID+"/7f8e9d\n", "sleep", "300")
	longer := start("12:pids:/kubepods/burstable/pod"+oldUID+"ff/5a6b7c\n", "sleep", "300")
	// The shell must have set SIGTERM aside before it is sent, or it dies of it: wait until the
	// process is sleep itself.
	waitExec(t, oldStubborn.Process.Pid, "sleep")

	k := &host.KubeletPods{Root: root}
	n, err := k.StopReplacedPods(context.Background(), map[string]time.Duration{oldUID: 300 * time.Millisecond, killUID: 0})
	if err != nil {
		t.Fatal(err)
	}
	if n[oldUID] != 2 || n[killUID] != 1 || len(n) != 2 {
		t.Errorf("stopped %v processes, want the old pod's 2 and the other old pod's 1", n)
	}
	for _, c := range []struct {
		name string
		cmd  *exec.Cmd
		sig  syscall.Signal
	}{{"the old pod's process", oldMain, syscall.SIGTERM}, {"the old pod's process that ignores SIGTERM", oldStubborn, syscall.SIGKILL},
		{"the process of the old pod given no grace", oldKilled, syscall.SIGKILL}} {
		st, err := waitFor(c.cmd, 5*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if ws := st.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != c.sig {
			t.Errorf("%s ended with %v, want killed by %v", c.name, st, c.sig)
		}
	}
	for _, c := range []struct {
		name string
		cmd  *exec.Cmd
	}{{"the new pod's process", newMain}, {"a process of a pod whose UID starts with the old one's", longer}} {
		if err := c.cmd.Process.Signal(syscall.Signal(0)); err != nil {
			t.Errorf("%s was stopped: %v", c.name, err)
		}
	}
	if n, err := k.StopReplacedPods(context.Background(), map[string]time.Duration{oldUID: 300 * time.Millisecond, killUID: 0}); err != nil || len(n) != 0 {
		t.Errorf("a second stop found %v processes (%v), want none left", n, err)
	}
}

// waitExec waits until process pid runs program (its shell has exec'd it).
func waitExec(t *testing.T, pid int, program string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		if err == nil && string(b) == program+"\n" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d does not run %s: %q %v", pid, program, b, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFor waits for cmd's process to end, at most d.
func waitFor(cmd *exec.Cmd, d time.Duration) (*os.ProcessState, error) {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if err == nil || errors.As(err, &exit) {
			return cmd.ProcessState, nil
		}
		return nil, err
	case <-time.After(d):
		return nil, errors.New("still running")
	}
}
