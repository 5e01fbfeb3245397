package host_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/testutil"
)

// fakeSystemd implements, on a real bus, the part of systemd's manager interface a restart uses:
// Subscribe, RestartUnit (returning a job) and the JobRemoved signal with the job's result.
type fakeSystemd struct {
	conn *dbus.Conn
	mu   sync.Mutex
	jobs uint32
	// results are the units' job results; a unit not listed does not exist.
	results    map[string]string
	restarted  []string
	subscribed int
}

func (m *fakeSystemd) Subscribe() *dbus.Error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.subscribed++
	return nil
}

func (m *fakeSystemd) RestartUnit(name, mode string) (dbus.ObjectPath, *dbus.Error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	result, ok := m.results[name]
	if !ok {
		return "", dbus.NewError("org.freedesktop.systemd1.NoSuchUnit", []any{"Unit " + name + " not found."})
	}
	m.jobs++
	id, job := m.jobs, dbus.ObjectPath(fmt.Sprintf("/org/freedesktop/systemd1/job/%d", m.jobs))
	m.restarted = append(m.restarted, name+" "+mode)
	// The job ends after the reply, as systemd's does.
	go func() {
		_ = m.conn.Emit("/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager.JobRemoved", id, job, name, result)
	}()
	return job, nil
}

// startSystemBus runs Debian's dbus-daemon with the system bus's socket under root, and on it a
// fake systemd that owns org.freedesktop.systemd1.
func startSystemBus(t *testing.T, root string, results map[string]string) *fakeSystemd {
	t.Helper()
	socket := filepath.Join(root, "run/dbus/system_bus_socket")
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "bus.conf")
	if err := os.WriteFile(config, []byte(`<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=`+socket+`</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
`), 0o644); err != nil {
		t.Fatal(err)
	}
	daemon, err := exec.LookPath("dbus-daemon")
	if err != nil {
		t.Fatalf("Debian's dbus-daemon is missing (hack/install-deps.sh installs it): %v", err)
	}
	cmd := exec.Command(daemon, "--nofork", "--config-file="+config)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var conn *dbus.Conn
	testutil.Eventually(t, 10*time.Second, "dbus-daemon answering at "+socket, func() error {
		c, err := dbus.Connect("unix:path=" + socket)
		if err != nil {
			return err
		}
		conn = c
		return nil
	})
	t.Cleanup(func() { _ = conn.Close() })
	m := &fakeSystemd{conn: conn, results: results}
	if err := conn.Export(m, "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager"); err != nil {
		t.Fatal(err)
	}
	reply, err := conn.RequestName("org.freedesktop.systemd1", dbus.NameFlagDoNotQueue)
	if err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("owning org.freedesktop.systemd1: %v (reply %d)", err, reply)
	}
	return m
}

// The agent's systemd service manager restarts a unit through real D-Bus: it subscribes, calls
// RestartUnit with mode replace and waits for the job's JobRemoved signal; a job that ends
// failed, and a unit that does not exist, fail the restart with systemd's words.
func TestSystemdRestartsOverDBus(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "run/systemd/system"), 0o755); err != nil {
		t.Fatal(err)
	}
	m := startSystemBus(t, root, map[string]string{"kubelet.service": "done", "broken.service": "failed"})
	sm, err := host.NewServiceManager(host.ServiceManagerAuto, root, &host.ChrootRunner{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if sm.Name() != "systemd" || sm.Supported() != nil {
		t.Fatalf("service manager %s (supported: %v), want systemd", sm.Name(), sm.Supported())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := sm.Restart(ctx, "kubelet"); err != nil {
		t.Fatalf("restart kubelet: %v", err)
	}
	if err := sm.Restart(ctx, "broken"); err == nil || !strings.Contains(err.Error(), "job failed") {
		t.Errorf("restart of a unit whose job failed: %v", err)
	}
	if err := sm.Restart(ctx, "absent"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("restart of a unit that does not exist: %v", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if got := strings.Join(m.restarted, ", "); got != "kubelet.service replace, broken.service replace" || m.subscribed < 2 {
		t.Errorf("systemd saw restarts %q and %d subscriptions", got, m.subscribed)
	}
}
