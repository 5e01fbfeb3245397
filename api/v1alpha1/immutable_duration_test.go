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
