package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
)

// scenarioTarget measures the ClusterTarget at rest (issue 17): once it has observed every node,
// how many writes a minute nodeops makes and how much of a core the manager uses while nothing
// changes but kwok's node heartbeats.
const scenarioTarget = "target"

// restWindow is how long the cluster is watched at rest.
const restWindow = time.Minute

// Targets of issue 17 for the ClusterTarget at rest.
const (
	targetRestWrites = 0.0
	targetRestCPU    = 0.01 // of one core
)

// waitTargetSettled waits until the installer created the ClusterTarget and its status shows
// every one of the k sim nodes and the control plane, the control plane's certificates as its agent
// read them (bench clusters have one control plane), UpToDate, for the current generation.
// It returns the size of the ClusterTarget as JSON.
func waitTargetSettled(ctx context.Context, c *cluster, k int, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		var ct v1alpha1.ClusterTarget
		err := c.client.Get(ctx, client.ObjectKey{Name: v1alpha1.ClusterTargetName}, &ct)
		switch {
		case err != nil:
			last = err.Error()
		case ct.Status.ObservedGeneration != ct.Generation || len(ct.Status.Nodes) != k+1:
			last = fmt.Sprintf("observed generation %d of %d, %d nodes of %d", ct.Status.ObservedGeneration, ct.Generation, len(ct.Status.Nodes), k+1)
		case len(ct.Status.Certificates) != 1:
			last = fmt.Sprintf("certificates of %d control planes read, want the one (its agent reads them within a minute of starting)", len(ct.Status.Certificates))
		case !meta.IsStatusConditionTrue(ct.Status.Conditions, v1alpha1.ConditionUpToDate):
			last = fmt.Sprintf("not UpToDate: %+v", meta.FindStatusCondition(ct.Status.Conditions, v1alpha1.ConditionUpToDate))
		default:
			b, err := json.Marshal(&ct)
			return len(b), err
		}
		if err := clock.Sleep(ctx, time.Second); err != nil {
			return 0, fmt.Errorf("the ClusterTarget did not settle: %s", last)
		}
	}
}

// runAtRest is the measured window: nothing is done for restWindow.
func runAtRest(ctx context.Context) (time.Duration, taskTimes, error) {
	if err := clock.Sleep(ctx, restWindow); err != nil {
		return 0, taskTimes{}, err
	}
	return restWindow, taskTimes{}, nil
}

// targetRows are the at-rest rows of one ClusterTarget run.
func targetRows(k int, r runResult, size int) []row {
	title := "ClusterTarget at rest, every node observed"
	minutes := r.Wall.Minutes()
	writes := r.Writes.total(nodeopsWrite) / minutes
	cpu := r.CPU["manager"] / r.Wall.Seconds()
	return []row{
		{K: k, Scenario: title, What: "nodeops API writes per minute (" + r.Wall.String() + " watched)",
			Value: fmt.Sprintf("%.1f", writes), Target: "0", Met: metMissed(writes <= targetRestWrites)},
		{K: k, Scenario: title, What: "manager CPU",
			Value: fmt.Sprintf("%.2f%% of a core", 100*cpu), Target: "< 1% of a core", Met: metMissed(cpu < targetRestCPU)},
		{K: k, Scenario: title, What: "the ClusterTarget's size (JSON, status.nodes included)",
			Value: fmt.Sprintf("%d KiB", size/1024), Target: "— (etcd's object limit: 1.5 MiB)", Met: ""},
	}
}
