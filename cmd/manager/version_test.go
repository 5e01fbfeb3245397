package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nodeops/nodeops/internal/version"
)

// Built as `make build` and `make images` build them, from a tree Go records no VCS information
// for (-buildvcs=false, as from a tarball), the manager, the agent and the plugin report the
// version and revision the linker stamped: in --version, `kubectl nodeops version`,
// nodeops_build_info and nodeops_agent_build_info.
func TestStampedVersionIsReportedEverywhere(t *testing.T) {
	const stampVersion, stampRevision = "v0.0.0-stamp-test", "0123456789abcdef0123456789abcdef01234567"
	bin := t.TempDir()
	ldflags := "-X " + version.Package + ".version=" + stampVersion + " -X " + version.Package + ".revision=" + stampRevision
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", bin+"/",
		"github.com/nodeops/nodeops/cmd/manager", "github.com/nodeops/nodeops/cmd/agent", "github.com/nodeops/nodeops/cmd/kubectl-nodeops")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	line := stampVersion + " (commit " + stampRevision[:12] + "), " + runtime.Version()
	for _, args := range [][]string{{"manager", "--version"}, {"agent", "--version"}, {"kubectl-nodeops", "version", "--client"}} {
		out, err := exec.Command(filepath.Join(bin, args[0]), args[1:]...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), line) {
			t.Errorf("%s printed %q (%v), want %q", strings.Join(args, " "), out, err, line)
		}
	}

	env, ctx, kubeconfig := startAPIServer(t)
	managerAddr, agentAddr := freeAddress(t), freeAddress(t)
	start(t, filepath.Join(bin, "manager"), "--kubeconfig="+kubeconfig, "--metrics-bind-address="+managerAddr,
		"--health-probe-bind-address=0", "--leader-elect=false")
	start(t, filepath.Join(bin, "agent"), "--kubeconfig="+kubeconfig, "--metrics-bind-address="+agentAddr,
		"--noop-host", "--node-prefix=sim-", "--identity=version-test")
	reader, _ := serviceAccountTokens(t, ctx, env)
	labels := `{goversion="` + runtime.Version() + `",revision="` + stampRevision + `",version="` + stampVersion + `"}`
	waitForSeries(t, "https://"+managerAddr+"/metrics", reader, "the manager's build_info carries the stamp",
		map[string]float64{"nodeops_build_info" + labels: 1})
	waitForSeries(t, "http://"+agentAddr+"/metrics", "", "the agent's build_info carries the stamp",
		map[string]float64{"nodeops_agent_build_info" + labels: 1})
}

// start runs a binary until the test ends, its output in the test's log on failure.
func start(t *testing.T, path string, args ...string) {
	t.Helper()
	cmd := exec.Command(path, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s:\n%s", filepath.Base(path), out.String())
		}
	})
}
