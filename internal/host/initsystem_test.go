package host_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
	"github.com/nodeops/nodeops/internal/testutil/debroot"
)

func TestDetectInit(t *testing.T) {
	for _, tt := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"systemd booted", map[string]string{"/run/systemd/system/.keep": ""}, host.InitSystemd},
		{"PID 1 is systemd", map[string]string{"/proc/1/comm": "systemd\n", "/sbin/openrc": ""}, host.InitSystemd},
		{"openrc", map[string]string{"/run/openrc/softlevel": ""}, host.InitOpenRC},
		{"sysvinit", map[string]string{"/etc/inittab": "", "/etc/init.d/kubelet": ""}, host.InitSysV},
		{"none", map[string]string{"/etc/os-release": "ID=debian\n"}, host.InitUnknown},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := hosttest.NewRoot(t, tt.files)
			if got := host.DetectInit(&host.FS{Root: root}); got != tt.want {
				t.Errorf("DetectInit = %s, want %s", got, tt.want)
			}
		})
	}
}

// A root with no init system gets a service manager whose every restart fails saying so, and
// which the preflight's init system check refuses: a restart is never passed by default.
func TestNoInitSystemFailsRestarts(t *testing.T) {
	root := hosttest.NewRoot(t, map[string]string{"/etc/os-release": "ID=debian\n"})
	m, err := host.NewServiceManager(host.ServiceManagerAuto, root, &host.ChrootRunner{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Restart(context.Background(), "kubelet")
	if err == nil || !strings.Contains(err.Error(), "no supported init system") {
		t.Fatalf("restart on a root with no init system: %v", err)
	}
	if m.Supported() == nil {
		t.Fatal("Supported() passed a root with no init system")
	}
}

// openrcRoot is a real Debian root with Debian's openrc, a probe service whose start and stop are
// logged, and the state OpenRC's boot would have made (a chroot is not booted by OpenRC).
func openrcRoot(t *testing.T) string {
	t.Helper()
	root := debroot.Root(t, debroot.Shared...)
	write := func(p, data string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(root, p), []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/init.d/probe", "#!/sbin/openrc-run\nstart() { echo start >> /var/log/probe; }\nstop() { echo stop >> /var/log/probe; }\n", 0o755)
	write("etc/init.d/broken", "#!/sbin/openrc-run\nstart() { echo cannot start; return 1; }\n", 0o755)
	for _, d := range []string{"started", "starting", "stopping", "inactive", "exclusive", "wasinactive", "failed", "scheduled", "options", "daemons", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, "run/openrc", d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("run/openrc/softlevel", "default\n", 0o644)
	return root
}

// In a Debian root with Debian's openrc, auto detection picks OpenRC and a restart runs the real
// rc-service: the probe service is stopped and started again; a service that fails to start fails
// the restart with rc-service's own words.
func TestOpenRCRestartsThroughRCService(t *testing.T) {
	root := openrcRoot(t)
	ctx := context.Background()
	m, err := host.NewServiceManager(host.ServiceManagerAuto, root, &host.ChrootRunner{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if m.Name() != "openrc" || m.Supported() != nil {
		t.Fatalf("service manager %s (supported: %v), want openrc", m.Name(), m.Supported())
	}
	for range 2 {
		if err := m.Restart(ctx, "probe.service"); err != nil {
			t.Fatalf("restart probe: %v", err)
		}
	}
	log, err := os.ReadFile(filepath.Join(root, "var/log/probe"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(log)); strings.Join(got, " ") != "start stop start" {
		t.Errorf("probe's log %q, want start, then stop and start", got)
	}
	if err := m.Restart(ctx, "broken"); err == nil || !strings.Contains(err.Error(), "rc-service broken restart") {
		t.Errorf("restarting a service that cannot start: %v", err)
	}
	if err := m.Restart(ctx, "../../bin/sh"); err == nil {
		t.Error("a service name with a path was restarted")
	}
}

// sysvinit restarts through the service's init script, or the service program when there is none.
func TestSysVInitRestartsThroughInitScripts(t *testing.T) {
	root := debroot.Root(t, debroot.Shared...)
	write := func(p, data string) {
		if err := os.WriteFile(filepath.Join(root, p), []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/init.d/plain", "#!/bin/sh\necho \"plain $1\" >> /var/log/plain\n")
	m, err := host.NewServiceManager(host.ServiceManagerSysV, root, &host.ChrootRunner{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Restart(context.Background(), "plain"); err != nil {
		t.Fatalf("restart plain: %v", err)
	}
	if log, _ := os.ReadFile(filepath.Join(root, "var/log/plain")); string(log) != "plain restart\n" {
		t.Errorf("init script saw %q", log)
	}
	if err := m.Restart(context.Background(), "absent"); err == nil {
		t.Error("restarting a service with no init script passed")
	}
}
