package main

import (
	"context"
	"testing"
	"time"

	"github.com/nodeops/nodeops/internal/testutil"
)

// startAPIServer starts an envtest API server for the test, stopped when it ends, and returns it
// with a context bounded at three minutes and a kubeconfig file for the manager's --kubeconfig.
func startAPIServer(t *testing.T) (*testutil.Env, context.Context, string) {
	t.Helper()
	env, err := testutil.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	kubeconfig, err := env.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return env, ctx, kubeconfig
}
