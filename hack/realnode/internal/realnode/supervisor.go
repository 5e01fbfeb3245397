package realnode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The supervisor is this machine's stand-in for systemd (there is none as PID 1): it runs the
// node's two services, containerd and the kubelet, restarts them when they exit as their
// systemd units would (Restart=always), and takes start/stop/restart requests over a unix
// socket. The systemctl stand-in (cmd/systemctl, installed on the host) is its client, so kubeadm
// and nodeops' agent restart the kubelet the same way they would on a systemd host.

// Unit is one supervised service.
type Unit struct {
	Name string
	// Command is evaluated at every start, as systemd re-reads EnvironmentFile= on each start.
	Command      func() (argv, env []string, err error)
	RestartDelay time.Duration
}

type unitState struct {
	Unit
	want     bool
	proc     *os.Process
	since    time.Time
	restarts int
	exited   chan struct{}
}

// Supervisor runs units and reaps every orphan below it (it is a child subreaper, so the
// container shims that containerd starts are reaped here, not left to PID 1).
type Supervisor struct {
	mu     sync.Mutex
	units  map[string]*unitState
	order  []string
	logDir string
	log    *log.Logger
}

// NodeUnits are the node's services: containerd and the kubelet as kubeadm's unit runs it.
func NodeUnits() []Unit {
	path := "PATH=" + HostPath
	return []Unit{
		{
			Name: "containerd", RestartDelay: 2 * time.Second,
			Command: func() ([]string, []string, error) {
				// No --config: containerd reads its default, ContainerdConf.
				return []string{filepath.Join(RuntimeBinDir, "containerd")},
					[]string{"PATH=" + RuntimeBinDir + ":" + strings.TrimPrefix(path, "PATH=")}, nil
			},
		},
		{
			Name: "kubelet", RestartDelay: 2 * time.Second,
			Command: func() ([]string, []string, error) {
				flags, err := readEnvFile("/var/lib/kubelet/kubeadm-flags.env")
				if err != nil {
					return nil, nil, err
				}
				extra, err := readEnvFile("/etc/default/kubelet")
				if err != nil {
					return nil, nil, err
				}
				return KubeletArgs("/usr/bin/kubelet", flags, extra), []string{path}, nil
			},
		},
	}
}

// readEnvFile reads an optional EnvironmentFile (systemd's "-" prefix: missing is empty).
func readEnvFile(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	env, err := ParseEnvFile(string(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return env, nil
}

// NewSupervisor returns a supervisor of units that logs to logDir.
func NewSupervisor(units []Unit, logDir string, logger *log.Logger) *Supervisor {
	s := &Supervisor{units: map[string]*unitState{}, logDir: logDir, log: logger}
	for _, u := range units {
		s.units[u.Name] = &unitState{Unit: u}
		s.order = append(s.order, u.Name)
	}
	return s
}

// Run starts every unit, serves requests on sock and returns after an "exit" request or SIGTERM.
func (s *Supervisor) Run(ctx context.Context, sock string) error {
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return fmt.Errorf("become child subreaper: %w", errno)
	}
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	defer ln.Close()
	if err := os.Chmod(sock, 0o600); err != nil {
		return fmt.Errorf("chmod %s: %w", sock, err)
	}
	go s.reap()
	for _, n := range s.order {
		s.start(n)
	}
	ctx, cancel := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	done := make(chan struct{})
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(conn, done)
		}
	}()
	select {
	case <-ctx.Done():
		s.log.Printf("signalled: stopping every unit")
		s.stopAll()
	case <-done:
	}
	// Let the last orphans be reaped before leaving.
	time.Sleep(500 * time.Millisecond)
	return nil
}

// serve answers one request line: "VERB [UNIT]".
func (s *Supervisor) serve(conn net.Conn, done chan struct{}) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Minute))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return
	}
	verb, unit, _ := strings.Cut(strings.TrimSpace(line), " ")
	reply, err := s.handle(verb, unit)
	if err != nil {
		fmt.Fprintf(conn, "err %v\n", err)
		return
	}
	fmt.Fprintf(conn, "ok %s\n", reply)
	if verb == "exit" {
		close(done)
	}
}

func (s *Supervisor) handle(verb, unit string) (string, error) {
	s.log.Printf("request: %s %s", verb, unit)
	switch verb {
	case "exit":
		s.stopAll()
		return "", nil
	case "list":
		return strings.Join(s.order, " "), nil
	}
	s.mu.Lock()
	_, known := s.units[unit]
	s.mu.Unlock()
	if !known {
		return "", fmt.Errorf("unknown unit %q", unit)
	}
	switch verb {
	case "start":
		s.start(unit)
	case "stop":
		s.stop(unit)
	case "restart":
		s.stop(unit)
		s.start(unit)
	case "status":
	default:
		return "", fmt.Errorf("unknown request %q", verb)
	}
	return s.status(unit), nil
}

// status is "active pid=N since=T restarts=N" or "inactive".
func (s *Supervisor) status(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.units[name]
	if u.proc == nil {
		if u.want {
			return fmt.Sprintf("activating restarts=%d", u.restarts)
		}
		return "inactive"
	}
	return fmt.Sprintf("active pid=%d since=%s restarts=%d", u.proc.Pid, u.since.Format(time.RFC3339), u.restarts)
}

func (s *Supervisor) stopAll() {
	for i := len(s.order) - 1; i >= 0; i-- {
		s.stop(s.order[i])
	}
}

// start runs the unit unless it runs already; a failed start is retried after RestartDelay.
func (s *Supervisor) start(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.units[name]
	u.want = true
	if u.proc != nil {
		return
	}
	argv, env, err := u.Command()
	if err == nil {
		u.proc, err = s.spawn(name, argv, env)
	}
	if err != nil {
		s.log.Printf("%s: start failed: %v", name, err)
		s.retryLater(u)
		return
	}
	u.since = time.Now()
	u.exited = make(chan struct{})
	s.log.Printf("%s: started pid %d: %s", name, u.proc.Pid, strings.Join(argv, " "))
}

func (s *Supervisor) spawn(name string, argv, env []string) (*os.Process, error) {
	logf, err := os.OpenFile(filepath.Join(s.logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", os.DevNull, err)
	}
	defer devnull.Close()
	p, err := os.StartProcess(argv[0], argv, &os.ProcAttr{
		Env:   env,
		Files: []*os.File{devnull, logf, logf},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	return p, nil
}

func (s *Supervisor) retryLater(u *unitState) {
	u.restarts++
	name := u.Name
	time.AfterFunc(u.RestartDelay, func() {
		s.mu.Lock()
		again := s.units[name].want && s.units[name].proc == nil
		s.mu.Unlock()
		if again {
			s.start(name)
		}
	})
}

// stop sends SIGTERM, then SIGKILL after 15 s, and waits for the exit. Only the unit's main
// process is signalled (systemd's KillMode=process for containerd): running containers survive
// a containerd or kubelet restart, as on a real node.
func (s *Supervisor) stop(name string) {
	s.mu.Lock()
	u := s.units[name]
	u.want = false
	p, exited := u.proc, u.exited
	s.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		s.log.Printf("%s: did not stop in 15s: killing", name)
		_ = p.Kill()
		<-exited
	}
}

// reap waits for every child, the units and any orphan reparented here.
func (s *Supervisor) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err != nil {
			time.Sleep(200 * time.Millisecond) // ECHILD: nothing to wait for yet
			continue
		}
		s.mu.Lock()
		for _, u := range s.units {
			if u.proc == nil || u.proc.Pid != pid {
				continue
			}
			s.log.Printf("%s: pid %d exited: %s", u.Name, pid, exitText(ws))
			u.proc = nil
			close(u.exited)
			if u.want {
				s.retryLater(u)
			}
		}
		s.mu.Unlock()
	}
}

func exitText(ws syscall.WaitStatus) string {
	if ws.Signaled() {
		return "signal " + ws.Signal().String()
	}
	return fmt.Sprintf("status %d", ws.ExitStatus())
}

// Call sends one request to the supervisor and returns its reply (without "ok ").
func Call(sock, verb, unit string, timeout time.Duration) (string, error) {
	conn, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return "", fmt.Errorf("reach the node supervisor at %s: %w", sock, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(conn, "%s %s\n", verb, unit); err != nil {
		return "", fmt.Errorf("send to the node supervisor: %w", err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read from the node supervisor: %w", err)
	}
	line = strings.TrimSpace(line)
	if rest, ok := strings.CutPrefix(line, "ok"); ok {
		return strings.TrimSpace(rest), nil
	}
	return "", fmt.Errorf("node supervisor: %s", strings.TrimPrefix(line, "err "))
}
