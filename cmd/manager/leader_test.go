package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/internal/testutil"
)

// runAsManager makes this test binary the manager itself when a test starts it with it set: the
// process then is what main is, down to replacing its own image.
const runAsManager = "NODEOPS_TEST_RUN_AS_MANAGER"

func TestMain(m *testing.M) {
	if os.Getenv(runAsManager) != "" {
		os.Args = append([]string{os.Args[0]}, strings.Fields(os.Getenv(runAsManager))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// lockedBuffer is a process's standard error, read while the process writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestLostLeadershipStartsANewCandidateInPlace: a manager whose Lease another holder took stops
// leading and, instead of exiting (which a kubelet answers with a crash-loop back-off before the
// next start), replaces its process image at once: the same process, a new candidate with a new
// identity, which takes the Lease once it is free again.
func TestLostLeadershipStartsANewCandidateInPlace(t *testing.T) {
	env, ctx, kubeconfig := startAPIServer(t)
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeops-system"}}); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	stderr := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	cmd.Env = append(os.Environ(), runAsManager+"="+strings.Join([]string{"--kubeconfig=" + kubeconfig, "--metrics-bind-address=0",
		"--health-probe-bind-address=0", "--leader-election-identity=manager-test",
		"--leader-elect-lease-duration=3s", "--leader-elect-renew-deadline=2s", "--leader-elect-retry-period=500ms"}, " "))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("manager's output:\n%s", stderr.String())
		}
	})

	key := client.ObjectKey{Namespace: "nodeops-system", Name: leaderElectionID}
	holder := func() (string, error) {
		var l coordinationv1.Lease
		if err := env.Client.Get(ctx, key, &l); err != nil {
			return "", err
		}
		return ptr.Deref(l.Spec.HolderIdentity, ""), nil
	}
	leads := func(what string, not string) string {
		var id string
		testutil.Eventually(t, time.Minute, what, func() error {
			select {
			case err := <-exited:
				t.Fatalf("the manager exited: %v", err)
			default:
			}
			h, err := holder()
			if err != nil {
				return err
			}
			if !strings.HasPrefix(h, "manager-test_") || h == not {
				return fmt.Errorf("the Lease is held by %q", h)
			}
			id = h
			return nil
		})
		return id
	}
	first := leads("the manager holding the Lease", "")

	// Another holder takes the Lease, as a standby would once the leader's renewals stopped.
	var l coordinationv1.Lease
	if err := env.Client.Get(ctx, key, &l); err != nil {
		t.Fatal(err)
	}
	l.Spec.HolderIdentity = ptr.To("another-manager")
	l.Spec.LeaseDurationSeconds = ptr.To[int32](3600)
	l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	if err := env.Client.Update(ctx, &l); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "the manager saying it lost the Lease and starts again in place", func() error {
		select {
		case err := <-exited:
			t.Fatalf("the manager exited: %v", err)
		default:
		}
		if !strings.Contains(stderr.String(), "leader election lost; starting again in place as a new candidate") {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	// The other holder goes: the same process, as a new candidate, takes the Lease.
	if err := env.Client.Delete(ctx, &l); err != nil {
		t.Fatal(err)
	}
	second := leads("the manager, started again in place, holding the Lease", first)
	select {
	case err := <-exited:
		t.Fatalf("the manager exited: %v", err)
	default:
	}
	t.Logf("pid %d led as %s, lost the Lease, and leads again in the same process as %s", cmd.Process.Pid, first, second)
}

// TestStartWaitsForTheAPIServer: a manager started while its API server is away (as on a single
// control plane whose API server a renewal restarts) waits until it answers, saying so, instead of
// failing at once.
func TestStartWaitsForTheAPIServer(t *testing.T) {
	var mu sync.Mutex
	refusals := 3
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if refusals > 0 {
			refusals--
			http.Error(w, "etcd is away", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
	}))
	defer srv.Close()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := waitForAPIServer(ctx, &rest.Config{Host: srv.URL}, &out); err != nil {
		t.Fatalf("waitForAPIServer: %v\n%s", err, out.String())
	}
	if got := out.String(); !strings.Contains(got, "manager: waiting for the API server (0s so far): ") || !strings.Contains(got, "manager: the API server answers after") {
		t.Errorf("output %q does not say it waited and then found the API server", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if refusals != 0 {
		t.Errorf("%d refusals left: it did not ask until the API server answered", refusals)
	}

	// Its wait ends with the manager's context, naming the last error.
	srv.Close()
	short, cancelShort := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelShort()
	if err := waitForAPIServer(short, &rest.Config{Host: srv.URL}, io.Discard); err == nil || !strings.Contains(err.Error(), "waiting for the API server") {
		t.Errorf("waitForAPIServer against a closed server: %v", err)
	}
}
