package host

import (
	"context"
	"fmt"
	"strings"
)

// Init systems DetectInit tells apart.
const (
	InitSystemd = "systemd"
	InitOpenRC  = "openrc"
	InitSysV    = "sysvinit"
	InitUnknown = "unknown"
)

// DetectInit names the init system running the root: PID 1's name when the root's /proc shows it,
// else the markers each init system leaves (systemd's /run/systemd/system, as sd_booted checks;
// OpenRC's /run/openrc or its binaries; sysvinit's /etc/inittab beside /etc/init.d).
func DetectInit(f Files) string {
	if b, err := f.ReadFile("/proc/1/comm"); err == nil {
		switch strings.TrimSpace(string(b)) {
		case "systemd":
			return InitSystemd
		case "openrc-init":
			return InitOpenRC
		}
	}
	switch {
	case f.Exists("/run/systemd/system"):
		return InitSystemd
	case f.Exists("/run/openrc"), f.Exists("/sbin/openrc"), f.Exists("/usr/sbin/openrc"), f.Exists("/sbin/openrc-run"):
		return InitOpenRC
	case f.Exists("/etc/inittab") && f.Exists("/etc/init.d"):
		return InitSysV
	}
	return InitUnknown
}

// serviceBase is a service's name without systemd's .service suffix, as OpenRC and init scripts
// name it; a name that could be read as an option or a path out of /etc/init.d is refused.
func serviceBase(name string) (string, error) {
	svc := strings.TrimSuffix(name, ".service")
	if svc == "" || strings.HasPrefix(svc, "-") || strings.ContainsAny(svc, "/\x00") || svc == "." || svc == ".." {
		return "", fmt.Errorf("service name %q is not a plain name", name)
	}
	return svc, nil
}

// firstExisting is the first of paths that exists under f, or "".
func firstExisting(f Files, paths ...string) string {
	for _, p := range paths {
		if f.Exists(p) {
			return p
		}
	}
	return ""
}

// OpenRC restarts services with `rc-service NAME restart` run inside the host root.
type OpenRC struct {
	Runner Runner
	Files  Files
}

// Name implements ServiceManager.
func (o *OpenRC) Name() string { return "openrc" }

func (o *OpenRC) program() string {
	return firstExisting(o.Files, "/sbin/rc-service", "/usr/sbin/rc-service", "/bin/rc-service", "/usr/bin/rc-service")
}

// Supported implements ServiceManager.
func (o *OpenRC) Supported() error {
	if o.program() == "" {
		return fmt.Errorf("OpenRC's rc-service is missing (/sbin/rc-service, /usr/sbin/rc-service)")
	}
	return nil
}

// Restart implements ServiceManager.
func (o *OpenRC) Restart(ctx context.Context, name string) error {
	if err := o.Supported(); err != nil {
		return err
	}
	svc, err := serviceBase(name)
	if err != nil {
		return err
	}
	var out strings.Builder
	err = o.Runner.Run(ctx, Cmd{Path: o.program(), Args: []string{svc, "restart"}, Output: &out, Env: []string{"PATH=" + DefaultPath}})
	if err != nil {
		return fmt.Errorf("rc-service %s restart: %w: %s", svc, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// SysVInit restarts services with their init script, `/etc/init.d/NAME restart`, or `service NAME
// restart` when the script is not there, run inside the host root.
type SysVInit struct {
	Runner Runner
	Files  Files
}

// Name implements ServiceManager.
func (s *SysVInit) Name() string { return "sysvinit" }

// Supported implements ServiceManager.
func (s *SysVInit) Supported() error {
	if !s.Files.Exists("/etc/init.d") {
		return fmt.Errorf("/etc/init.d is missing: no sysvinit scripts")
	}
	return nil
}

// Restart implements ServiceManager.
func (s *SysVInit) Restart(ctx context.Context, name string) error {
	svc, err := serviceBase(name)
	if err != nil {
		return err
	}
	script := "/etc/init.d/" + svc
	c := Cmd{Path: script, Args: []string{"restart"}, Env: []string{"PATH=" + DefaultPath}}
	if !s.Files.Exists(script) {
		program := firstExisting(s.Files, "/usr/sbin/service", "/sbin/service")
		if program == "" {
			return fmt.Errorf("restarting %s: neither %s nor the service program exists", svc, script)
		}
		c = Cmd{Path: program, Args: []string{svc, "restart"}, Env: c.Env}
	}
	var out strings.Builder
	c.Output = &out
	if err := s.Runner.Run(ctx, c); err != nil {
		return fmt.Errorf("%s %s: %w: %s", c.Path, strings.Join(c.Args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}
