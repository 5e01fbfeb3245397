package nodeprofile_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/testutil"
)

// Coming from KWasm: a profile triggered by KWasm's kwasm.sh/kwasm-node=true annotation sets
// KWasm's kwasm.sh/kwasm-provisioned=<node> label too, so workloads that select it keep landing;
// a change of provisionedLabels relabels provisioned nodes without installing again; leaving
// removes them with the profile's own label.
func TestProvisionedLabelsForKWasmWorkloads(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	makeNode(t, ctx, "kwasm-1", "kwasm", nil, kwasm)
	makeProfile(t, ctx, "kwasm", "kwasm", func(s *v1alpha1.NodeProfileSpec) {
		s.ProvisionedLabels = []v1alpha1.ProvisionedLabel{{Key: "kwasm.sh/kwasm-provisioned", Value: "$(NODE_NAME)"}}
	})
	install := provision(t, ctx, "kwasm", "kwasm-1")
	if n := getNode(t, ctx, "kwasm-1"); n.Labels["kwasm.sh/kwasm-provisioned"] != "kwasm-1" {
		t.Fatalf("labels %v: want kwasm.sh/kwasm-provisioned=kwasm-1", n.Labels)
	}

	updateProfile(t, ctx, "kwasm", func(p *v1alpha1.NodeProfile) {
		p.Spec.ProvisionedLabels = append(p.Spec.ProvisionedLabels, v1alpha1.ProvisionedLabel{Key: "example.com/wasm", Value: "spin"})
	})
	testutil.Eventually(t, 30*time.Second, "the new provisioned label set", func() error {
		if n := getNode(t, ctx, "kwasm-1"); n.Labels["example.com/wasm"] != "spin" || n.Labels["kwasm.sh/kwasm-provisioned"] != "kwasm-1" {
			return fmt.Errorf("labels %v", n.Labels)
		}
		return nil
	})
	byNode, err := tasksOf(ctx, "kwasm")
	if err != nil {
		t.Fatal(err)
	}
	if got := names(byNode["kwasm-1"]); len(got) != 1 {
		t.Errorf("tasks %v after a provisionedLabels change, want only the install %s", got, install.Name)
	}

	patchNode(t, ctx, "kwasm-1", `{"metadata":{"annotations":{"kwasm.sh/kwasm-node":null}}}`)
	un := waitTask(t, ctx, "kwasm", "kwasm-1", nodeprofile.ActionUninstall)
	agentRun(t, ctx, un.Name)
	agentSucceed(t, ctx, un.Name)
	waitLabel(t, ctx, "kwasm", "kwasm-1", false, "")
	if n := getNode(t, ctx, "kwasm-1"); n.Labels["kwasm.sh/kwasm-provisioned"] != "" || n.Labels["example.com/wasm"] != "" {
		t.Errorf("labels %v after leaving: want the provisioned labels gone", n.Labels)
	}
}
