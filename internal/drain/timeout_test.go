package drain

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// A drain that times out while the API server has not yet answered a pod's eviction says so, rather
// than that the pod is still terminating: nothing was asked of the pod yet. Its clock is held, so
// the timeout falls while the eviction is in flight whatever the machine's speed.
func TestTimeoutDuringAnEvictionSaysItWasNotAnswered(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	yes := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "uid-web",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs", Controller: &yes}}},
		Spec:   corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	inFlight := make(chan struct{})
	var evictions atomic.Int32
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pod).
		WithIndex(&corev1.Pod{}, "spec.nodeName", func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).
		WithInterceptorFuncs(interceptor.Funcs{
			SubResourceCreate: func(ctx context.Context, _ client.Client, _ string, _ client.Object, _ client.Object, _ ...client.SubResourceCreateOption) error {
				if evictions.Add(1) == 1 {
					close(inFlight)
				}
				<-ctx.Done() // an API server that does not answer before the drain's timeout
				return ctx.Err()
			},
		}).Build()
	clk := clocktesting.NewFakeClock(time.Now())
	go func() {
		<-inFlight
		clk.Step(time.Minute)
	}()
	_, err := Run(context.Background(), Target{Node: "n1", Client: c, Reader: c, Clock: clk, Poll: time.Millisecond},
		&v1alpha1.DrainCommand{Timeout: &metav1.Duration{Duration: time.Minute}})
	if err == nil {
		t.Fatal("the drain succeeded")
	}
	if n := evictions.Load(); n != 1 {
		t.Errorf("the drain asked for the eviction %d times; once timed out it must ask no more", n)
	}
	msg := err.Error()
	if !strings.Contains(msg, "timed out after 1m0s") || !strings.Contains(msg, "ns/web refused by the API server, which had not answered the eviction when the drain timed out") {
		t.Errorf("message %q does not say the eviction of ns/web went unanswered until the timeout", msg)
	}
}
