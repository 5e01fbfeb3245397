package agent_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent"
	"github.com/nodeops/nodeops/internal/testutil"
)

// With --metrics-bind-address the agent serves its own series, and they follow its tasks.
func TestAgentServesItsCommandMetrics(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	startAgent(t, agent.Options{NodeName: "metrics-1", Noop: true, MetricsBindAddress: addr})
	scrape := func() (string, error) {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/metrics")
		if err != nil {
			return "", err
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("scrape: %s", resp.Status)
		}
		return string(body), err
	}
	const succeeded = `nodeops_agent_commands{kind="wait",result="Succeeded"} `
	testutil.Eventually(t, 30*time.Second, "the agent serves its metrics", func() error {
		body, err := scrape()
		if err != nil {
			return err
		}
		if !strings.Contains(body, "nodeops_agent_build_info{") || strings.Contains(body, succeeded) {
			return fmt.Errorf("want build info and no wait command yet:\n%s", body)
		}
		return nil
	})

	create(t, newTask("metrics-1-task", "metrics-1", v1alpha1.ExecutionAuto, v1alpha1.Command{Wait: &v1alpha1.WaitCommand{}}))
	waitTask(t, "metrics-1-task", phaseIs(v1alpha1.TaskSucceeded))
	testutil.Eventually(t, 30*time.Second, "the succeeded command is counted", func() error {
		body, err := scrape()
		if err != nil {
			return err
		}
		if !strings.Contains(body, succeeded+"1\n") || !strings.Contains(body, `nodeops_agent_last_result_timestamp_seconds{kind="wait",result="Succeeded"} `) {
			return fmt.Errorf("no succeeded wait command in:\n%s", body)
		}
		return nil
	})
}
