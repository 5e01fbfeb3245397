package testutil

import (
	"context"
	"fmt"
	"os"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nodeops/nodeops/config"
)

// startTimeout is how long etcd and kube-apiserver may take to become ready: only a hang, never a
// slow machine, should reach it.
const startTimeout = 5 * time.Minute

// Options says what StartWith sets up.
type Options struct {
	// CRDs are the CRDs to install, as Start takes them: all when empty.
	CRDs []string
	// Admission installs the admission policies of a real install (config/admission): agents
	// confined to their node, NodeTasks created only by the manager's ServiceAccount. Off by
	// default, since controller tests create tasks as an administrator.
	Admission bool
	// NodeAuthorizer adds Kubernetes' Node authorizer before RBAC, as a real cluster has it: a kubelet's
	// user (system:node:<name>) then reads the Secrets of its node's pods.
	NodeAuthorizer bool
}

// StartWith is Start with options.
func StartWith(o Options) (*Env, error) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		return nil, fmt.Errorf("KUBEBUILDER_ASSETS is not set: run `make test-unit`, or `export KUBEBUILDER_ASSETS=\"$PWD/bin\"` in the repository after `make tools`")
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	defs, err := CRDs(o.CRDs...)
	if err != nil {
		return nil, err
	}
	te := &envtest.Environment{
		CRDInstallOptions:     envtest.CRDInstallOptions{CRDs: defs},
		BinaryAssetsDirectory: assets,
		Scheme:                scheme,
	}
	if os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT") == "" {
		// How fast etcd and kube-apiserver start is not under test: envtest's 20s ran out on a busy
		// 2-core machine (and its retries then failed too), so wait for them as long as a hang allows.
		te.ControlPlaneStartTimeout = startTimeout
	}
	if o.NodeAuthorizer {
		te.ControlPlane.GetAPIServer().Configure().Set("authorization-mode", "Node,RBAC")
	}
	cfg, err := te.Start()
	if err != nil {
		return nil, fmt.Errorf("start envtest (etcd and kube-apiserver from %s): %w", assets, err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = te.Stop()
		return nil, fmt.Errorf("client: %w", err)
	}
	env := &Env{Config: cfg, Scheme: scheme, Client: c, env: te}
	if o.Admission {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := config.InstallAdmission(ctx, cfg, c); err != nil {
			_ = te.Stop()
			return nil, err
		}
	}
	return env, nil
}
