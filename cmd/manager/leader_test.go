package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
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

// startManager runs this test binary as the manager with args, its standard output and error
// read into the returned buffer, and stops it when the test ends.
func startManager(t *testing.T, args ...string) (*exec.Cmd, *lockedBuffer, <-chan error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	stderr := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	cmd.Env = append(os.Environ(), runAsManager+"="+strings.Join(args, " "))
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
	return cmd, stderr, exited
}

// shortLease are leader election flags that make a lost Lease quick to see.
var shortLease = []string{"--metrics-bind-address=0", "--health-probe-bind-address=0", "--leader-election-identity=manager-test",
	"--leader-elect-lease-duration=3s", "--leader-elect-renew-deadline=2s", "--leader-elect-retry-period=500ms"}

// leaseWatch reads the manager's Lease as the test's administrator.
type leaseWatch struct {
	t      *testing.T
	ctx    context.Context
	c      client.Client
	exited <-chan error
}

func (w leaseWatch) get() (*coordinationv1.Lease, error) {
	var l coordinationv1.Lease
	err := w.c.Get(w.ctx, client.ObjectKey{Namespace: "nodeops-system", Name: leaderElectionID}, &l)
	return &l, err
}

// renewedAfter waits until the manager leads, renewing the Lease, and renewed it after since, and
// returns it. A Lease that names the manager is not enough: when the connection is cut between the
// API server's creating the Lease and the manager's reading the answer, the Lease names the manager
// while the manager does not know it leads (and so never loses leadership). Only a leader renews, so
// a renewal after the acquire time says the manager knows.
func (w leaseWatch) renewedAfter(what string, since time.Time) *coordinationv1.Lease {
	w.t.Helper()
	var held *coordinationv1.Lease
	testutil.Eventually(w.t, time.Minute, what, func() error {
		select {
		case err := <-w.exited:
			w.t.Fatalf("the manager exited: %v", err)
		default:
		}
		l, err := w.get()
		if err != nil {
			return err
		}
		h := ptr.Deref(l.Spec.HolderIdentity, "")
		if !strings.HasPrefix(h, "manager-test_") || l.Spec.RenewTime == nil || !l.Spec.RenewTime.After(since) ||
			l.Spec.AcquireTime == nil || !l.Spec.RenewTime.After(l.Spec.AcquireTime.Time) {
			return fmt.Errorf("the Lease is held by %q, acquired %v, renewed %v", h, l.Spec.AcquireTime, l.Spec.RenewTime)
		}
		held = l
		return nil
	})
	return held
}

// said waits until the manager's output says line.
func said(t *testing.T, out *lockedBuffer, exited <-chan error, line string) {
	t.Helper()
	testutil.Eventually(t, time.Minute, "the manager saying "+line, func() error {
		select {
		case err := <-exited:
			t.Fatalf("the manager exited: %v", err)
		default:
		}
		if !strings.Contains(out.String(), line) {
			return fmt.Errorf("not yet")
		}
		return nil
	})
}

const startsAgainInPlace = "leader election lost; starting again in place as a candidate with the same identity"

// TestLostLeadershipStartsACandidateInPlace: a manager whose Lease another holder took stops
// leading and, instead of exiting (which a kubelet answers with a crash-loop back-off before the
// next start), replaces its process image at once: the same process, a candidate with the same
// identity, which waits while the other holds the Lease and takes it once it is free again.
func TestLostLeadershipStartsACandidateInPlace(t *testing.T) {
	env, ctx, kubeconfig := startAPIServer(t)
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeops-system"}}); err != nil {
		t.Fatal(err)
	}
	cmd, out, exited := startManager(t, append([]string{"--kubeconfig=" + kubeconfig}, shortLease...)...)
	lease := leaseWatch{t: t, ctx: ctx, c: env.Client, exited: exited}
	first := ptr.Deref(lease.renewedAfter("the manager holding the Lease", time.Time{}).Spec.HolderIdentity, "")

	// Another holder takes the Lease, as a standby would once the leader's renewals stopped. The
	// manager renews it every moment meanwhile: a renewal between the read and the update is a
	// conflict, and the other holder reads again, as a real one does.
	var l *coordinationv1.Lease
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var err error
		if l, err = lease.get(); err != nil {
			return err
		}
		l.Spec.HolderIdentity = ptr.To("another-manager")
		l.Spec.LeaseDurationSeconds = ptr.To[int32](3600)
		l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		return env.Client.Update(ctx, l)
	})
	if err != nil {
		t.Fatal(err)
	}
	said(t, out, exited, startsAgainInPlace)
	testutil.Consistently(t, 3*time.Second, "the other manager keeping the Lease it holds", func() error {
		l, err := lease.get()
		if err != nil {
			return err
		}
		if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "another-manager" {
			return fmt.Errorf("the Lease is held by %q while another-manager's is valid", h)
		}
		return nil
	})
	// The other holder goes: the same process, with the same identity, takes the Lease.
	gone := time.Now()
	if err := env.Client.Delete(ctx, l); err != nil {
		t.Fatal(err)
	}
	second := ptr.Deref(lease.renewedAfter("the manager, started again in place, holding the Lease", gone).Spec.HolderIdentity, "")
	if second != first {
		t.Errorf("the manager led as %s and, started again in place, as %s: want its identity kept", first, second)
	}
	t.Logf("pid %d led as %s, lost the Lease, and leads again in the same process", cmd.Process.Pid, first)
}

// TestStartInPlaceLeadsAgainAtOnceWhileTheLeaseNamesIt: the API server is away longer than the
// renew deadline (a single control plane's API server restarting), so the manager gives up its
// leadership and starts again in place; when the API server answers again and no one took the
// Lease, the manager leads again as the same holder, the Lease never changing hands (its
// acquire time and transitions kept), instead of waiting for its own Lease to expire.
func TestStartInPlaceLeadsAgainAtOnceWhileTheLeaseNamesIt(t *testing.T) {
	env, ctx, kubeconfig := startAPIServer(t)
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeops-system"}}); err != nil {
		t.Fatal(err)
	}
	apiServer, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(t, apiServer.Host)
	data, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), apiServer.Host) {
		t.Fatalf("the kubeconfig does not name the API server %s", apiServer.Host)
	}
	viaGate := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(viaGate, []byte(strings.ReplaceAll(string(data), apiServer.Host, g.addr())), 0o600); err != nil {
		t.Fatal(err)
	}
	// A lease duration long enough that a candidate with a new identity would still be waiting for
	// the old holder's Lease to expire when the test looks.
	_, out, exited := startManager(t, "--kubeconfig="+viaGate, "--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--leader-election-identity=manager-test",
		"--leader-elect-lease-duration=60s", "--leader-elect-renew-deadline=2s", "--leader-elect-retry-period=500ms")
	lease := leaseWatch{t: t, ctx: ctx, c: env.Client, exited: exited}
	before := lease.renewedAfter("the manager holding the Lease", time.Time{})

	g.set(false)
	said(t, out, exited, startsAgainInPlace)
	back := time.Now()
	g.set(true)
	after := lease.renewedAfter("the manager renewing the Lease once the API server answers again", back)
	if h, was := ptr.Deref(after.Spec.HolderIdentity, ""), ptr.Deref(before.Spec.HolderIdentity, ""); h != was {
		t.Errorf("after the API server came back the Lease is held by %s, before by %s: want the same holder", h, was)
	}
	if a, b := ptr.Deref(after.Spec.LeaseTransitions, 0), ptr.Deref(before.Spec.LeaseTransitions, 0); a != b {
		t.Errorf("the Lease changed hands %d times while the API server was away, want never", a-b)
	}
	if !after.Spec.AcquireTime.Equal(before.Spec.AcquireTime) {
		t.Errorf("the Lease was acquired again at %v (first at %v): want it kept", after.Spec.AcquireTime, before.Spec.AcquireTime)
	}
	if since := after.Spec.RenewTime.Sub(back); since >= 60*time.Second {
		t.Errorf("the manager renewed %s after the API server came back, not before its own Lease could expire", since)
	}
}

// gate forwards TCP connections to an API server while open; closed, it ends every connection,
// as an API server that stopped does.
type gate struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	open     bool
	conns    map[net.Conn]bool
}

func newGate(t *testing.T, upstream string) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln, upstream: upstream, open: true, conns: map[net.Conn]bool{}}
	go g.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		g.set(false)
	})
	return g
}

func (g *gate) addr() string { return g.ln.Addr().String() }

func (g *gate) serve() {
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", g.upstream)
		g.mu.Lock()
		if err != nil || !g.open {
			g.mu.Unlock()
			_ = c.Close()
			if up != nil {
				_ = up.Close()
			}
			continue
		}
		g.conns[c], g.conns[up] = true, true
		g.mu.Unlock()
		go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
		go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
	}
}

// set opens or closes the gate; closing ends every connection through it.
func (g *gate) set(open bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = open
	if !open {
		for c := range g.conns {
			_ = c.Close()
		}
		clear(g.conns)
	}
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

// TestInheritedIdentityOnlyForThisProcess: the identity handed over to a start in place is taken
// only by the process it was stamped for; another process (another PID, or the same PID in another
// container started at another time) with the variable copied into its environment starts as a new
// candidate, and the variable is removed either way.
func TestInheritedIdentityOnlyForThisProcess(t *testing.T) {
	stamp := processStamp()
	parts := strings.Split(stamp, "/")
	if len(parts) != 3 {
		t.Fatalf("processStamp() = %q, want PID/START/BOOT", stamp)
	}
	pid, start, boot := parts[0], parts[1], parts[2]
	for _, tc := range []struct{ name, value, want string }{
		{"this process", stamp + " manager_1", "manager_1"},
		{"another PID", "1" + pid + "/" + start + "/" + boot + " manager_1", ""},
		{"the same PID started at another time", pid + "/1" + start + "/" + boot + " manager_1", ""},
		{"another boot", pid + "/" + start + "/another-boot manager_1", ""},
		{"no stamp", "manager_1", ""},
		{"no identity", stamp + " ", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(inheritedIdentityEnv, tc.value)
			if got := inheritedIdentity(); got != tc.want {
				t.Errorf("inheritedIdentity() with %q = %q, want %q", tc.value, got, tc.want)
			}
			if v, ok := os.LookupEnv(inheritedIdentityEnv); ok {
				t.Errorf("%s is still set (%q): a process the manager starts would see it", inheritedIdentityEnv, v)
			}
		})
	}
}
