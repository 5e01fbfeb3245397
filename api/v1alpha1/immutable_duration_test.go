package v1alpha1_test

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// A soak delay written "30m" reads back as 30 minutes, and a Go client sends it as "30m0s": the
// same duration, so an update that changes only what may change (paused) is accepted, and a
// different delay is still refused as immutable.
func TestSoakDelaysCompareAsDurationsNotStrings(t *testing.T) {
	env, kubectl, kubeconfig := startAPIServer(t)
	ctx := context.Background()
	cmd := exec.Command(kubectl, "--kubeconfig", kubeconfig, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(scheduled("soak-strings", "postNodeDelay: 30m\npostGroupDelay: 1h"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("create: %v\n%s", err, out.String())
	}
	var cur v1alpha1.NodeOperation
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "soak-strings"}, &cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Paused = true
	if err := env.Client.Update(ctx, &cur); err != nil {
		t.Fatalf("pausing through a Go client's update (postNodeDelay sent as %q): %v", cur.Spec.PostNodeDelay.Duration.String(), err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "soak-strings"}, &cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.PostNodeDelay = &metav1.Duration{Duration: 31 * time.Minute}
	if err := env.Client.Update(ctx, &cur); err == nil || !strings.Contains(err.Error(), "postNodeDelay is immutable") {
		t.Errorf("changing postNodeDelay: %v, want it refused as immutable", err)
	}
}

// Durations inside lists (a window's duration, a gate's timeout and its silence's maxDuration, a
// command's timeout, a drain's timeout, a wait's duration, a group's own windows and gates) written
// "90s" by kubectl read back "1m30s" through a Go client: an update that changes only paused is
// accepted, and a changed duration in each list is still refused as immutable. With CEL's == on the
// whole list, which compares the strings, the pause is refused as "windows is immutable".
func TestDurationsInListsCompareAsDurationsNotStrings(t *testing.T) {
	env, kubectl, kubeconfig := startAPIServer(t)
	ctx := context.Background()
	apply := func(manifest string) {
		t.Helper()
		cmd := exec.Command(kubectl, "--kubeconfig", kubeconfig, "apply", "-f", "-")
		cmd.Stdin = strings.NewReader(manifest)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("create: %v\n%s", err, out.String())
		}
	}
	apply(`apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: list-durations
spec:
  windows:
  - {schedule: "0 2 * * *", duration: 90m}
  gates:
  - {name: a, timeout: 90s, approval: {}}
  - name: b
    timeout: 5m
    alertmanager: {url: "http://am:9093", silence: {matchers: ["instance={{node}}"], maxDuration: 90m}}
  custom:
    groups:
    - name: g
      windows:
      - {schedule: "0 3 * * *", duration: 120m}
      gates:
      - {name: c, timeout: 120s, approval: {}}
      commands:
      - {timeout: 90s, wait: {duration: 90s}}
      - drain: {timeout: 120s}
---
apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: upgrade-durations
spec:
  upgrade:
    kubernetesVersion: v1.37.2
    upgradeKubeletAndKubectl: false
    drain: {timeout: 90s}
---
apiVersion: nodeops.io/v1alpha1
kind: NodeTask
metadata:
  name: task-durations
spec:
  nodeName: n1
  commands:
  - {timeout: 90s, wait: {duration: 120s}}
`)
	for _, tc := range []struct {
		name, object, field string
		mutate              func(*v1alpha1.NodeOperationSpec)
	}{
		{"window duration", "list-durations", "windows", func(s *v1alpha1.NodeOperationSpec) { s.Windows[0].Duration.Duration++ }},
		{"gate timeout", "list-durations", "gates", func(s *v1alpha1.NodeOperationSpec) { s.Gates[0].Timeout.Duration = 5 * time.Minute }},
		{"silence maxDuration", "list-durations", "gates", func(s *v1alpha1.NodeOperationSpec) {
			s.Gates[1].Alertmanager.Silence.MaxDuration.Duration = 2 * time.Hour
		}},
		{"group window duration", "list-durations", "custom", func(s *v1alpha1.NodeOperationSpec) {
			s.Custom.Groups[0].Windows[0].Duration.Duration = time.Hour
		}},
		{"group gate timeout", "list-durations", "custom", func(s *v1alpha1.NodeOperationSpec) { s.Custom.Groups[0].Gates[0].Timeout = nil }},
		{"command timeout", "list-durations", "custom", func(s *v1alpha1.NodeOperationSpec) {
			s.Custom.Groups[0].Commands[0].Timeout.Duration = 5 * time.Minute
		}},
		{"wait duration", "list-durations", "custom", func(s *v1alpha1.NodeOperationSpec) {
			s.Custom.Groups[0].Commands[0].Wait.Duration.Duration = 5 * time.Minute
		}},
		{"drain timeout", "list-durations", "custom", func(s *v1alpha1.NodeOperationSpec) {
			s.Custom.Groups[0].Commands[1].Drain.Timeout.Duration = 90 * time.Second
		}},
		{"a command more", "list-durations", "custom", func(s *v1alpha1.NodeOperationSpec) {
			s.Custom.Groups[0].Commands = append(s.Custom.Groups[0].Commands, v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}})
		}},
		{"upgrade drain timeout", "upgrade-durations", "upgrade", func(s *v1alpha1.NodeOperationSpec) { s.Upgrade.Drain.Timeout.Duration = 5 * time.Minute }},
	} {
		var cur v1alpha1.NodeOperation
		if err := env.Client.Get(ctx, client.ObjectKey{Name: tc.object}, &cur); err != nil {
			t.Fatal(err)
		}
		cur.Spec.Paused = !cur.Spec.Paused
		if err := env.Client.Update(ctx, &cur); err != nil {
			t.Fatalf("%s: pausing through a Go client's update, which re-spells every duration: %v", tc.object, err)
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: tc.object}, &cur); err != nil {
			t.Fatal(err)
		}
		tc.mutate(&cur.Spec)
		err := env.Client.Update(ctx, &cur)
		if err == nil || !strings.Contains(err.Error(), "spec."+tc.field+": Invalid value") || !strings.Contains(err.Error(), tc.field+" is immutable") {
			t.Errorf("changing the %s: %v; want it refused as %s is immutable", tc.name, err, tc.field)
		}
	}
	var tk v1alpha1.NodeTask
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "task-durations"}, &tk); err != nil {
		t.Fatal(err)
	}
	tk.Spec.Paused = true
	if err := env.Client.Update(ctx, &tk); err != nil {
		t.Fatalf("pausing a task through a Go client's update: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "task-durations"}, &tk); err != nil {
		t.Fatal(err)
	}
	tk.Spec.Commands[0].Timeout.Duration = 91 * time.Second
	if err := env.Client.Update(ctx, &tk); err == nil || !strings.Contains(err.Error(), "commands are immutable") {
		t.Errorf("changing a task's command timeout: %v; want it refused as commands are immutable", err)
	}
}
