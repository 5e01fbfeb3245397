package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// DefaultPath is the PATH programs run with inside the host root.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ExitError is a program that ran and exited non-zero.
type ExitError struct {
	Program string
	Code    int
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("%s exited with code %d", e.Program, e.Code)
}

// ExitCode is the exit code an error carries: 0 for nil, the code of an ExitError, -1 otherwise.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return -1
}

// ChrootRunner runs programs chrooted into Root (the child chroots itself, the agent stays where it is).
type ChrootRunner struct {
	Root string
}

// Run runs c inside the root and waits for it; a non-zero exit is an *ExitError.
func (r *ChrootRunner) Run(ctx context.Context, c Cmd) error {
	cmd := exec.CommandContext(ctx, c.Path, c.Args...)
	cmd.Env = c.Env
	if cmd.Env == nil {
		cmd.Env = []string{"PATH=" + DefaultPath}
	}
	cmd.Dir = "/"
	// Pdeathsig: a program never outlives its agent, as it would not outlive the agent's container.
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: r.Root, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// exec.Command resolves a bare path against the agent's filesystem; the program lives in the root.
	cmd.Path = c.Path
	cmd.Stdout, cmd.Stderr, cmd.Stdin = c.Output, c.Output, c.Stdin
	// Kill the whole process group on cancel, so a script's children do not outlive it.
	cmd.Cancel = func() error {
		if cmd.Process == nil {
			return nil
		}
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = 5 * time.Second
	return wrapRunError(c.Path, cmd.Run())
}

func wrapRunError(program string, err error) error {
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code := ee.ExitCode()
		if code < 0 {
			code = 128 + int(syscall.SIGKILL)
		}
		return &ExitError{Program: program, Code: code}
	}
	return fmt.Errorf("running %s: %w", program, err)
}

// KubeadmRunner runs the host's own kubeadm with --rootfs, not chrooted by us: kubeadm chroots itself.
type KubeadmRunner struct {
	Root string
}

// Kubeadm runs `<root>/usr/bin/kubeadm --rootfs <root> args...` with a bare environment.
func (k *KubeadmRunner) Kubeadm(ctx context.Context, out io.Writer, args ...string) error {
	bin := filepath.Join(k.Root, "usr/bin/kubeadm")
	full := append([]string{"--rootfs", k.Root}, args...)
	cmd := exec.CommandContext(ctx, bin, full...)
	cmd.Env = []string{"PATH=" + DefaultPath, "HOME=/root"}
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, as a script has: a SIGTERM to the agent's group (nodeops-local stops
	// its children so) must not cut kubeadm short while the agent lets it finish (every command has a timeout, rule 12).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error {
		if cmd.Process == nil {
			return nil
		}
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = 5 * time.Second
	if out != nil {
		_, _ = fmt.Fprintf(out, "$ kubeadm %s\n", strings.Join(full, " "))
	}
	return wrapRunError("kubeadm "+firstWords(args, 2), cmd.Run())
}

func firstWords(args []string, n int) string {
	if len(args) > n {
		args = args[:n]
	}
	return strings.Join(args, " ")
}

// ScriptEnv is the environment of a script: PATH, the script's own variables, then the NODEOPS_
// variables (which a script cannot override). Nothing of the agent's environment is passed on.
func ScriptEnv(nodeName, operation string, dryRun bool, extra []v1alpha1.EnvVar) []string {
	env := []string{"PATH=" + DefaultPath, "HOME=/root"}
	for _, e := range extra {
		if strings.HasPrefix(e.Name, "NODEOPS_") || e.Name == "KUBECONFIG" {
			continue
		}
		env = append(env, e.Name+"="+e.Value)
	}
	return append(env,
		"NODEOPS_NODE_NAME="+nodeName,
		"NODEOPS_OPERATION="+operation,
		fmt.Sprintf("NODEOPS_DRY_RUN=%t", dryRun),
	)
}
