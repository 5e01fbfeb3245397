package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodeops/nodeops/internal/localcluster"
	"github.com/nodeops/nodeops/test/e2e/framework"
)

// demoDeadline bounds `make demo` once the binaries are built (issue 7); it is a deadline, not a timing assertion.
const demoDeadline = 10 * time.Minute

// TestDemo runs the demo unattended, as `make demo` does after building (hack/demo.sh), and checks it
// ends with its summary, every step ok, exit 0, and nothing it started left running.
func TestDemo(t *testing.T) {
	t.Parallel()
	bin := framework.BinDir(t, "nodeops-local", "manager", "agent", "kubectl-nodeops")
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), demoDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(repo, "hack", "demo.sh"), "--dir", dir)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "NODEOPS_BIN="+bin)
	// On the deadline the demo gets SIGTERM, so it stops the cluster before it exits.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 3 * time.Minute
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	runErr := cmd.Run()
	output := out.String()
	if err := os.WriteFile(filepath.Join(dir, "demo-output.txt"), out.Bytes(), 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("hack/demo.sh exited (%v) after %s", runErr, time.Since(start).Round(time.Second))
	if runErr != nil || ctx.Err() != nil {
		t.Errorf("the demo did not succeed within %s: %v (context: %v)", demoDeadline, runErr, ctx.Err())
	}

	summary := output[strings.LastIndex(output, " Summary\n")+1:]
	if !strings.HasPrefix(summary, "Summary\n") {
		t.Errorf("no summary at the end")
	}
	for _, row := range []string{"cluster ", "1  renew certificates", "2  upgrade to v1.37.2 in DryRun", "3  WebAssembly shims",
		"4  custom operation, 50 sim nodes at 20%", "5  a failure, then skip", "6  ClusterTarget: one edit upgrades to v1.37.2", "-  stop everything"} {
		if !demoRowOK(summary, row) {
			t.Errorf("summary row %q is missing or not ok", row)
		}
	}
	if !strings.HasSuffix(strings.TrimRight(output, "\n"), "demo: every step succeeded") {
		t.Errorf("the output does not end with the summary's success line")
	}
	// What the narration promises is on screen: the live watch of the failure, and the skip.
	for _, want := range []string{
		"$ kubectl nodeops plan renew-certs",
		"$ kubectl nodeops watch demo-maintenance",
		"backup still running: backup job 4711",
		"$ kubectl nodeops skip demo-maintenance",
		"PLACEHOLDER shim files",
		"$ kubectl nodeops target set --version v1.37.2",
		"$ kubectl nodeops watch cluster-upgrade-v1.37.2-1",
		"ClusterTarget cluster: UpToDate\n  kubernetes version   v1.36.4, target v1.36.4",
		"$ kubectl wait clustertarget/cluster --for=condition=UpToDate --timeout=2m",
		"ClusterTarget cluster: UpToDate\n  kubernetes version   v1.37.2, target v1.37.2",
	} {
		if !strings.Contains(output, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}

	// Nothing it started is left: nodeops-local and every child it recorded.
	clusterDir := filepath.Join(dir, "cluster")
	procs, err := localcluster.ReadProcesses(clusterDir)
	if err != nil {
		t.Errorf("reading the cluster's process table: %v", err)
	}
	var pids []int
	if data, err := os.ReadFile(filepath.Join(clusterDir, localcluster.PIDFile)); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			pids = append(pids, pid)
		}
	}
	for _, pid := range procs {
		pids = append(pids, pid)
	}
	if len(pids) < 2 {
		t.Errorf("found only %d recorded processes in %s", len(pids), clusterDir)
	}
	alive, err := localcluster.ProcessGroupMembers(pids)
	if err != nil || len(alive) > 0 {
		t.Errorf("still running after the demo: %v (%v); process table %v", alive, err, procs)
	}
	if t.Failed() {
		lines := strings.Split(strings.TrimRight(output, "\n"), "\n")
		if len(lines) > 150 {
			lines = lines[len(lines)-150:]
		}
		t.Logf("last lines of the demo's output (all of it: %s):\n%s", filepath.Join(dir, "demo-output.txt"), strings.Join(lines, "\n"))
	}
}

// demoRowOK finds the summary row starting with prefix and reports whether its result is ok.
func demoRowOK(summary, prefix string) bool {
	for _, line := range strings.Split(summary, "\n") {
		if strings.HasPrefix(line, prefix) {
			return strings.Contains(line, "  ok  ")
		}
	}
	return false
}
