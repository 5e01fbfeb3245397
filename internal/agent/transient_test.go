package agent_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/drain"
)

// unavailable answers the first n calls of the kind it wraps with a 503, as an API server that is
// restarting or overloaded does, then lets them through to the real one.
func unavailable(n int32, calls *atomic.Int32) error {
	if calls.Add(1) <= n {
		return apierrors.NewServiceUnavailable("the server is currently unable to handle the request")
	}
	return nil
}

// Cordon, uncordon and the drain's pod list wait out a moment of 503s from the real API server
// (found by make test-faults: one 503 used to fail the command and block the operation), and
// still fail, naming the 503, when the API server stays unavailable past the command's timeout.
func TestNodeWritesWaitOutAMomentOf503s(t *testing.T) {
	ctx := context.Background()
	create(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "transient-1"}})
	var patches, lists atomic.Int32
	flaky := interceptor.NewClient(cl, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			if err := unavailable(3, &patches); err != nil {
				return err
			}
			return c.Patch(ctx, obj, p, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := unavailable(2, &lists); err != nil {
				return err
			}
			return c.List(ctx, list, opts...)
		},
	})
	env := &commands.Env{NodeName: "transient-1", Operation: "op-transient", Client: flaky}
	if _, err := commands.Run(ctx, env, &v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}}); err != nil {
		t.Fatalf("cordon after three 503s: %v", err)
	}
	var n corev1.Node
	if err := cl.Get(ctx, client.ObjectKey{Name: "transient-1"}, &n); err != nil || !n.Spec.Unschedulable {
		t.Fatalf("node not cordoned (%v): %+v", err, n.Spec)
	}
	// The manager's drain (internal/drain), which no longer runs in the agent.
	if _, err := drain.Run(ctx, drain.Target{Node: "transient-1", Client: flaky, Reader: flaky}, &v1alpha1.DrainCommand{}); err != nil {
		t.Fatalf("drain after two 503s on its pod list: %v", err)
	}
	if _, err := commands.Run(ctx, env, &v1alpha1.Command{Uncordon: &v1alpha1.UncordonCommand{}}); err != nil {
		t.Fatalf("uncordon: %v", err)
	}
	if err := cl.Get(ctx, client.ObjectKey{Name: "transient-1"}, &n); err != nil || n.Spec.Unschedulable {
		t.Fatalf("node not restored (%v): %+v", err, n.Spec)
	}

	// A 503 window longer than 20 s (the fault suite's) is waited out too.
	var long atomic.Int64
	slow := interceptor.NewClient(cl, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			if long.Load() == 0 {
				long.Store(time.Now().Add(22 * time.Second).Unix())
			}
			if time.Now().Unix() < long.Load() {
				return apierrors.NewServiceUnavailable("the server is currently unable to handle the request")
			}
			return c.Patch(ctx, obj, p, opts...)
		},
	})
	if _, err := commands.Run(ctx, &commands.Env{NodeName: "transient-1", Operation: "op-transient", Client: slow}, &v1alpha1.Command{Cordon: &v1alpha1.CordonCommand{}}); err != nil {
		t.Fatalf("cordon through 22 s of 503s: %v", err)
	}

	// An API server that stays unavailable: the command fails within its own deadline, naming the 503.
	down := interceptor.NewClient(cl, interceptor.Funcs{
		Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
			return apierrors.NewServiceUnavailable("the server is currently unable to handle the request")
		},
	})
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := commands.Run(short, &commands.Env{NodeName: "transient-1", Operation: "op-transient", Client: down}, &v1alpha1.Command{Uncordon: &v1alpha1.UncordonCommand{}})
	if err == nil || !strings.Contains(err.Error(), "unable to handle the request") {
		t.Fatalf("uncordon against an API server that stays unavailable: %v, want the 503", err)
	}
}
