package testutil

import (
	"context"
	"fmt"
	"os"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/nodeops/nodeops/internal/nodelock"
)

// StartManager starts a controller manager on cfg for a package's controller tests: no metrics or
// probe listener, the node lock table the controllers share started on its cache with its budget
// ledger in nodeops-system (made if missing), as cmd/manager has it, and the controllers setup
// registers. stop stops it and waits until it has.
func StartManager(cfg *rest.Config, scheme *runtime.Scheme, setup func(mgr manager.Manager, locks *nodelock.Table) error) (stop func(), err error) {
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// Writes go straight to the API server, before the manager starts too.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeops-system"}}
	if err := mgr.GetClient().Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		cancel()
		return nil, fmt.Errorf("namespace %s for the budget ledger: %w", ns.Name, err)
	}
	locks := nodelock.New()
	if err := locks.Start(ctx, mgr.GetCache()); err != nil {
		cancel()
		return nil, fmt.Errorf("node lock table: %w", err)
	}
	locks.UseLedger(nodelock.NewLedger(mgr, ns.Name))
	if err := setup(mgr, locks); err != nil {
		cancel()
		return nil, fmt.Errorf("setup: %w", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager stopped:", err)
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}, nil
}
