package commands

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// What a command waits for is added up by kind of wait, in the order first waited for, and a wait
// command's whole run is waiting.
func TestWaitsAddUpByWhatWasWaitedFor(t *testing.T) {
	env := &Env{Waits: &Waits{}}
	if _, err := Run(context.Background(), env, &v1alpha1.Command{Wait: &v1alpha1.WaitCommand{Duration: metav1.Duration{Duration: 30 * time.Millisecond}}}); err != nil {
		t.Fatal(err)
	}
	env.Waits.add(v1alpha1.WaitMirrorPodGone, 2*time.Second)
	env.Waits.add(v1alpha1.WaitMirrorPodBack, time.Second)
	env.Waits.add(v1alpha1.WaitMirrorPodGone, 3*time.Second)
	got := env.Waits.List()
	if len(got) != 3 || got[0].For != v1alpha1.WaitWait || got[0].Duration.Duration < 30*time.Millisecond ||
		got[1] != (v1alpha1.CommandWait{For: v1alpha1.WaitMirrorPodGone, Duration: metav1.Duration{Duration: 5 * time.Second}}) ||
		got[2] != (v1alpha1.CommandWait{For: v1alpha1.WaitMirrorPodBack, Duration: metav1.Duration{Duration: time.Second}}) {
		t.Errorf("waits = %+v, want Wait >= 30ms, then MirrorPodGone 5s, MirrorPodBack 1s", got)
	}
	var none *Waits
	if none.List() != nil {
		t.Error("a nil Waits lists something")
	}
	(&Env{}).waiting(v1alpha1.WaitDrain)() // an Env without Waits records nothing and does not panic
}

// TestMirrorPodReadsAreBoundedWhileEtcdIsAway: with etcd's manifest out, an API server on the same
// node cannot answer a read of the mirror pod and hangs until it gives up (about 30 s on the real
// node, longer than the restart would wait). Each read is bounded, so the restart tells that etcd
// went from the unanswered read, not from the end of its whole wait.
func TestMirrorPodReadsAreBoundedWhileEtcdIsAway(t *testing.T) {
	hanging := interceptor.NewClient(fake.NewClientBuilder().Build(), interceptor.Funcs{
		Get: func(ctx context.Context, _ client.WithWatch, _ client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
			<-ctx.Done() // the API server never answers while etcd is away
			return ctx.Err()
		},
	})
	var out strings.Builder
	env := &Env{Client: hanging, NodeName: "cp-1", Out: &out, Poll: 10 * time.Millisecond}
	// The restart's own wait is far longer than a read's bound: only the bound can end the read.
	ctx, cancel := context.WithTimeout(context.Background(), staticPodGoneWait)
	defer cancel()
	if err := (&mirrorPod{env: env, comp: "etcd"}).WaitGone(ctx, "run-1"); err != nil {
		t.Fatalf("WaitGone for etcd with a hanging API server: %v, want gone", err)
	}
	if !strings.Contains(out.String(), "API server unreachable after moving the etcd manifest out") {
		t.Errorf("output %q does not say the API server went away", out.String())
	}
}

// The controller-manager and the scheduler restart together; etcd and the API server each alone.
func TestRestartRounds(t *testing.T) {
	got := restartRounds([]string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"})
	if fmt.Sprint(got) != "[[etcd] [kube-apiserver] [kube-controller-manager kube-scheduler]]" {
		t.Errorf("rounds %v", got)
	}
	if got := restartRounds([]string{"kube-scheduler", "etcd", "kube-controller-manager"}); fmt.Sprint(got) != "[[kube-scheduler] [etcd] [kube-controller-manager]]" {
		t.Errorf("rounds %v: components in the order asked, only neighbours together", got)
	}
}

// TestStaticPodRunUnreadableIsNoRun: a restart names the run before it moves the manifest out and
// waits for a run other than that one. A read that failed used to name no run (""), so that the old
// run, still Ready, passed for the new one at once; now the read is made again, and a run that
// cannot be read fails the restart before anything is moved.
func TestStaticPodRunUnreadableIsNoRun(t *testing.T) {
	failing := interceptor.NewClient(fake.NewClientBuilder().Build(), interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return apierrors.NewServiceUnavailable("etcd is away")
		},
	})
	env := &Env{Client: failing, NodeName: "cp-1", Poll: 10 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	id, err := (&mirrorPod{env: env, comp: "kube-apiserver"}).Identity(ctx)
	if err == nil || !strings.Contains(err.Error(), "etcd is away") {
		t.Fatalf("Identity with the mirror pod unreadable = %q, %v; want an error naming why", id, err)
	}

	reads := 0
	flaky := interceptor.NewClient(fake.NewClientBuilder().WithObjects(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-apiserver-cp-1", UID: "uid-1"},
	}).Build(), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if reads++; reads < 3 {
				return apierrors.NewServiceUnavailable("etcd is away")
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	env.Client = flaky
	if id, err := (&mirrorPod{env: env, comp: "kube-apiserver"}).Identity(context.Background()); err != nil || id != "uid-1" {
		t.Fatalf("Identity after two failed reads = %q, %v; want uid-1", id, err)
	}
}
