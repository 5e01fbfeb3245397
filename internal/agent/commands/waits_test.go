package commands

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
