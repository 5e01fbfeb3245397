package host

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// Service manager names, as --service-manager takes them.
const (
	ServiceManagerAuto      = "auto"
	ServiceManagerSystemd   = "systemd"
	ServiceManagerSystemctl = "systemctl"
	ServiceManagerOpenRC    = "openrc"
	ServiceManagerSysV      = "sysvinit"
	ServiceManagerLocal     = "local"
)

// LocalServiceLog is the local service table of nodeops-local nodes, under the host root.
const LocalServiceLog = "/var/lib/nodeops-local/services.log"

// NewServiceManager picks the service manager of a real node's root. auto goes by the init system
// DetectInit finds: systemd over D-Bus (falling back to systemctl if the connection fails), OpenRC's
// rc-service, or sysvinit's init scripts; with none, systemctl when the root has one, else every
// restart fails saying so.
// The local table comes with NewLocal, as it also records static pod restarts.
func NewServiceManager(kind string, root string, runner Runner) (ServiceManager, error) {
	fs := &FS{Root: root}
	switch kind {
	case ServiceManagerSystemctl:
		return &Systemctl{Runner: runner}, nil
	case ServiceManagerSystemd:
		return &SystemdDBus{Root: root, Fallback: &Systemctl{Runner: runner}}, nil
	case ServiceManagerOpenRC:
		return &OpenRC{Runner: runner, Files: fs}, nil
	case ServiceManagerSysV:
		return &SysVInit{Runner: runner, Files: fs}, nil
	case ServiceManagerAuto, "":
		switch init := DetectInit(fs); init {
		case InitSystemd:
			return &SystemdDBus{Root: root, Fallback: &Systemctl{Runner: runner}}, nil
		case InitOpenRC:
			return &OpenRC{Runner: runner, Files: fs}, nil
		case InitSysV:
			return &SysVInit{Runner: runner, Files: fs}, nil
		default:
			// No init system's marker, but a systemctl: it is how services restart on such a host
			// (a container's systemd stand-in, as on the real node this project tests on).
			if fs.Exists("/bin/systemctl") || fs.Exists("/usr/bin/systemctl") {
				return &Systemctl{Runner: runner}, nil
			}
			return NoInitSystem{Root: root}, nil
		}
	}
	return nil, fmt.Errorf("unknown service manager %q (auto, systemd, systemctl, openrc, sysvinit or local)", kind)
}

// NoInitSystem is the service manager of a root where no supported init system was found: every
// restart fails with the reason, so a command never passes a restart it could not make.
type NoInitSystem struct{ Root string }

// Name implements ServiceManager.
func (n NoInitSystem) Name() string { return "no init system" }

// Supported implements ServiceManager.
func (n NoInitSystem) Supported() error {
	return fmt.Errorf("no supported init system under %s: not systemd (/run/systemd/system), OpenRC (/run/openrc, /sbin/openrc) nor sysvinit (/etc/init.d with /etc/inittab); pass --service-manager to choose one", n.Root)
}

// Restart implements ServiceManager.
func (n NoInitSystem) Restart(context.Context, string) error { return n.Supported() }

// unitName adds .service to a bare service name.
func unitName(name string) string {
	if strings.Contains(name, ".") {
		return name
	}
	return name + ".service"
}

// Systemctl restarts services with `systemctl restart` run inside the host root.
type Systemctl struct {
	Runner Runner
}

// Name implements ServiceManager.
func (s *Systemctl) Name() string { return "systemctl" }

// Supported implements ServiceManager: systemctl runs inside the root.
func (s *Systemctl) Supported() error {
	if r, ok := s.Runner.(*ChrootRunner); ok && !(&FS{Root: r.Root}).Exists("/bin/systemctl") {
		return fmt.Errorf("/bin/systemctl is missing under %s", r.Root)
	}
	return nil
}

// Restart implements ServiceManager.
func (s *Systemctl) Restart(ctx context.Context, name string) error {
	var out strings.Builder
	// "--": a unit name is never read as an option, even from a task admitted before the name rules.
	err := s.Runner.Run(ctx, Cmd{Path: "/bin/systemctl", Args: []string{"restart", "--", unitName(name)}, Output: &out})
	if err != nil {
		return fmt.Errorf("systemctl restart %s: %w: %s", name, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// SystemdDBus restarts services through systemd's D-Bus interface under the host root: its private
// socket, or the system bus (where systemd owns org.freedesktop.systemd1), waiting for the restart
// job to finish; when neither can be reached it falls back.
type SystemdDBus struct {
	Root     string
	Fallback ServiceManager
}

// Sockets of systemd's D-Bus interface, under the host root: systemd's own (no bus daemon, no
// Hello), then the system bus's.
const (
	systemdPrivateSocket = "/run/systemd/private"
	systemBusSocket      = "/run/dbus/system_bus_socket"
)

// Name implements ServiceManager.
func (s *SystemdDBus) Name() string { return "systemd" }

// Supported implements ServiceManager: systemd's private socket, the system bus, or the fallback.
func (s *SystemdDBus) Supported() error {
	fs := &FS{Root: s.Root}
	if fs.Exists(systemdPrivateSocket) || fs.Exists(systemBusSocket) {
		return nil
	}
	if s.Fallback != nil {
		return s.Fallback.Supported()
	}
	return fmt.Errorf("neither systemd's socket %s nor the system bus %s is there", systemdPrivateSocket, systemBusSocket)
}

// connect dials systemd under the root: the private socket when there, else the system bus.
func (s *SystemdDBus) connect(ctx context.Context) (*sddbus.Conn, string, error) {
	socket, hello := filepath.Join(s.Root, systemdPrivateSocket), false
	if !(&FS{Root: s.Root}).Exists(systemdPrivateSocket) {
		socket, hello = filepath.Join(s.Root, systemBusSocket), true
	}
	conn, err := sddbus.NewConnection(func() (*dbus.Conn, error) {
		c, err := dbus.Dial("unix:path="+socket, dbus.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		if err := c.Auth([]dbus.Auth{dbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
			_ = c.Close()
			return nil, err
		}
		if hello {
			if err := c.Hello(); err != nil {
				_ = c.Close()
				return nil, err
			}
		}
		return c, nil
	})
	return conn, socket, err
}

// Restart implements ServiceManager.
func (s *SystemdDBus) Restart(ctx context.Context, name string) error {
	conn, socket, err := s.connect(ctx)
	if err != nil {
		if s.Fallback != nil {
			return s.Fallback.Restart(ctx, name)
		}
		return fmt.Errorf("connecting to systemd at %s: %w", socket, err)
	}
	defer conn.Close()
	// systemd sends JobRemoved, which ends the wait below, only to subscribed clients.
	if err := conn.Subscribe(); err != nil {
		return fmt.Errorf("subscribing to systemd's job signals at %s: %w", socket, err)
	}
	done := make(chan string, 1)
	if _, err := conn.RestartUnitContext(ctx, unitName(name), "replace", done); err != nil {
		return fmt.Errorf("restarting %s: %w", unitName(name), err)
	}
	select {
	case result := <-done:
		if result != "done" {
			return fmt.Errorf("restarting %s: job %s", unitName(name), result)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("restarting %s: %w", unitName(name), ctx.Err())
	}
}

// LocalServices is nodeops-local's stand-in for a service manager: a restart appends
// `restart NAME TIME` to the local service table, which tests read.
type LocalServices struct {
	Files *FS
	mu    sync.Mutex
}

// Name implements ServiceManager.
func (l *LocalServices) Name() string { return "local service table" }

// Supported implements ServiceManager: the table takes every restart.
func (l *LocalServices) Supported() error { return nil }

// Restart implements ServiceManager.
func (l *LocalServices) Restart(_ context.Context, name string) error {
	return l.Record("restart " + name)
}

// Record appends one line with the time to the table.
func (l *LocalServices) Record(what string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	real, err := l.Files.Path(LocalServiceLog)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(real), 0o755); err != nil {
		return fmt.Errorf("creating the local service table: %w", err)
	}
	f, err := os.OpenFile(real, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("opening the local service table: %w", err)
	}
	_, err = fmt.Fprintf(f, "%s %s\n", what, time.Now().UTC().Format(time.RFC3339Nano))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("recording %q in the local service table: %w", what, err)
	}
	return nil
}

// LocalRuntimeSocket is where a nodeops-local node's agent listens for the preflight's container
// runtime check, under the node's root: containerd's socket.
const LocalRuntimeSocket = "/run/containerd/containerd.sock"

// ServeLocalRuntimeSocket listens on containerd's socket under a nodeops-local node's root, where no
// containerd runs, accepting and closing connections: a stand-in, like the service table, so that
// the preflight's runtime check connects. Close stops it and removes the socket.
func ServeLocalRuntimeSocket(root string) (io.Closer, error) {
	p := filepath.Join(root, LocalRuntimeSocket)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, fmt.Errorf("local runtime socket: %w", err)
	}
	if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(p) // a previous agent's
	}
	addr, done, err := ShortUnixPath(p)
	if err != nil {
		return nil, fmt.Errorf("local runtime socket: %w", err)
	}
	l, err := net.Listen("unix", addr)
	done()
	if err != nil {
		return nil, fmt.Errorf("local runtime socket: %w", err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return l, nil
}
