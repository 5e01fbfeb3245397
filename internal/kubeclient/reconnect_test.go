package kubeclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/nodeops/nodeops/internal/testutil"
)

// away is how the test's API server fails a request.
type away int

const (
	serve        away = iota
	closeConn         // the connection ends with no answer, as when the API server's process stops
	unavailable       // 503, as a starting API server answers
	serverError       // 500: the server is there and failed the request
	forbidden         // 403: a refusal, not an absence
	unauthorized      // 401: a refusal, as a starting server's authenticator gives
	tooMany           // 429: the server asks clients to slow down
	gone              // 410: the watch's resource version is too old
	tooLarge          // 504 ResourceVersionTooLarge: the server has not reached the resource version
)

// flakyAPIServer answers ConfigMap lists and watches after failing the first requests as plan says.
type flakyAPIServer struct {
	*httptest.Server
	mu       sync.Mutex
	plan     []away
	always   away // after the plan
	requests int
}

func newFlakyAPIServer(t *testing.T, plan ...away) *flakyAPIServer {
	s := &flakyAPIServer{plan: plan}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// newAwayAPIServer fails every request as how says.
func newAwayAPIServer(t *testing.T, how away) *flakyAPIServer {
	s := newFlakyAPIServer(t)
	s.always = how
	return s
}

func (s *flakyAPIServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

func (s *flakyAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	how := s.always
	if s.requests < len(s.plan) {
		how = s.plan[s.requests]
	}
	s.requests++
	s.mu.Unlock()
	status := func(code int, reason metav1.StatusReason) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":%q,"code":%d}`, reason, code)
	}
	switch how {
	case closeConn:
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	case unavailable:
		status(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable)
	case serverError:
		status(http.StatusInternalServerError, metav1.StatusReasonInternalError)
	case tooLarge:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusGatewayTimeout)
		_, _ = fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Timeout","code":504,"details":{"causes":[{"reason":"ResourceVersionTooLarge","message":"Too large resource version"}]}}`)
	case forbidden:
		status(http.StatusForbidden, metav1.StatusReasonForbidden)
	case unauthorized:
		status(http.StatusUnauthorized, metav1.StatusReasonUnauthorized)
	case tooMany:
		status(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests)
	case gone:
		status(http.StatusGone, metav1.StatusReasonGone)
	default:
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "true" {
			_, _ = fmt.Fprint(w, `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"back","namespace":"default","resourceVersion":"8"}}}`+"\n")
			return
		}
		_, _ = fmt.Fprint(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"back","namespace":"default","resourceVersion":"7"}}]}`)
	}
}

// configMaps is client-go's own ConfigMap ListWatch against host, as an informer would list and
// watch them.
func configMaps(t *testing.T, host string) toolscache.ListerWatcher {
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: host, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return toolscache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "configmaps", "default", fields.Everything())
}

// TestReconnectingAsksAgainWhileTheAPIServerIsAway: a list or watch that failed because the API
// server was away (the connection ended unanswered, a starting server's 503) is asked again until
// it answers, and the informer's reflector, which would back off for up to a minute on the error,
// never sees it; a refusal, too many requests, a server error and a resource version too old or
// too new (which the reflector answers by listing again) reach it at once. After an absence, a
// starting server's refusals are asked again too.
func TestReconnectingAsksAgainWhileTheAPIServerIsAway(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		plan []away
		// asks is how many requests the server sees; fails, whether the caller gets an error.
		asks  int
		fails bool
	}{
		{name: "the API server's process stopped, then a starting one answered 503, then it serves",
			plan: []away{closeConn, closeConn, unavailable, unavailable}, asks: 5},
		{name: "a starting API server", plan: []away{unavailable, unavailable, unavailable}, asks: 4},
		{name: "a server error", plan: []away{serverError}, asks: 1, fails: true},
		{name: "a resource version the server has not reached", plan: []away{tooLarge}, asks: 1, fails: true},
		{name: "a refusal", plan: []away{forbidden}, asks: 1, fails: true},
		{name: "the API server's process stopped, then the starting one refused until its authorizer caught up",
			plan: []away{closeConn, unavailable, unauthorized, forbidden}, asks: 5},
		{name: "the API server's process stopped, then the starting one failed a request",
			plan: []away{closeConn, serverError}, asks: 2, fails: true},
		{name: "too many requests", plan: []away{tooMany}, asks: 1, fails: true},
		{name: "the resource version is too old", plan: []away{gone}, asks: 1, fails: true},
	} {
		for _, op := range []string{"list", "watch"} {
			t.Run(op+": "+tc.name, func(t *testing.T) {
				srv := newFlakyAPIServer(t, tc.plan...)
				lw := reconnectingWith(configMaps(t, srv.URL), 10*time.Millisecond, time.Minute)
				var err error
				if op == "list" {
					var obj any
					obj, err = lw.ListWithContext(ctx, metav1.ListOptions{})
					if err == nil {
						if l, ok := obj.(*corev1.ConfigMapList); !ok || len(l.Items) != 1 {
							t.Errorf("list answered %#v, want the one ConfigMap", obj)
						}
					}
				} else {
					w, werr := lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: "7"})
					err = werr
					if err == nil {
						ev := <-w.ResultChan()
						w.Stop()
						if cm, ok := ev.Object.(*corev1.ConfigMap); !ok || cm.Name != "back" {
							t.Errorf("watch's first event %s %#v, want ConfigMap back ADDED", ev.Type, ev.Object)
						}
					}
				}
				if (err != nil) != tc.fails {
					t.Errorf("%s: error %v, want an error: %t", op, err, tc.fails)
				}
				if got := srv.count(); got != tc.asks {
					t.Errorf("%s: the API server saw %d requests, want %d", op, got, tc.asks)
				}
			})
		}
	}
}

// TestReconnectingGivesUpAfterItsBound: while the API server stays away, the asks end after the
// bound with the last error, which then goes to client-go's own back-off; and they end with the
// caller's context.
func TestReconnectingGivesUpAfterItsBound(t *testing.T) {
	srv := newAwayAPIServer(t, unavailable)
	lw := reconnectingWith(configMaps(t, srv.URL), 10*time.Millisecond, 300*time.Millisecond)
	_, err := lw.ListWithContext(context.Background(), metav1.ListOptions{})
	if !apierrors.IsServiceUnavailable(err) {
		t.Errorf("list against an API server that stays away: %v, want its 503", err)
	}
	if n := srv.count(); n < 2 {
		t.Errorf("the API server saw %d requests before the bound, want several", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	before := srv.count()
	go func() {
		_, err := reconnectingWith(configMaps(t, srv.URL), 10*time.Millisecond, time.Hour).
			WatchWithContext(ctx, metav1.ListOptions{})
		done <- err
	}()
	testutil.Eventually(t, time.Minute, "the watch asking three times", func() error {
		if n := srv.count() - before; n < 3 {
			return fmt.Errorf("asked %d times", n)
		}
		return nil
	})
	cancel()
	// The context may end while a request is out (that request's error) or between two.
	if err := <-done; !apierrors.IsServiceUnavailable(err) && !errors.Is(err, context.Canceled) {
		t.Errorf("watch asked until its context ended: %v, want the last 503 or the context's end", err)
	}
}

// TestReconnectingAsksSteadilyThroughAControlPlaneRestart: the pause between asks stays `every`
// for the first ReconnectSteady of an absence, so the manager notices a restarted API server within
// a quarter second; only a longer absence slows the asks, doubling to at most 4 s.
func TestReconnectingAsksSteadilyThroughAControlPlaneRestart(t *testing.T) {
	for _, tc := range []struct {
		asking, want time.Duration
	}{
		{0, ReconnectEvery},
		{10 * time.Second, ReconnectEvery},
		{ReconnectSteady - time.Millisecond, ReconnectEvery},
		{ReconnectSteady, 2 * ReconnectEvery},
		{2 * ReconnectSteady, 4 * ReconnectEvery},
		{3 * ReconnectSteady, 8 * ReconnectEvery},
		{4 * ReconnectSteady, reconnectAtMost},
		{time.Hour, reconnectAtMost},
	} {
		if got := askDelay(ReconnectEvery, tc.asking); got != tc.want {
			t.Errorf("%s into an absence: next ask after %s, want %s", tc.asking, got, tc.want)
		}
	}
	if got := askDelay(10*time.Second, time.Hour); got != 10*time.Second {
		t.Errorf("asking every 10s: next ask after %s an hour in, want 10s", got)
	}
}

// TestAPIServerAway: what counts as the API server's absence, from real failures.
func TestAPIServerAway(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	_ = ln.Close()
	_, refused := toolscache.ToListerWatcherWithContext(configMaps(t, closed)).ListWithContext(context.Background(), metav1.ListOptions{})
	if refused == nil || !APIServerAway(refused) {
		t.Errorf("a refused connection (%v) is not the API server's absence", refused)
	}
	for _, tc := range []struct {
		how  away
		want bool
	}{{closeConn, true}, {unavailable, true}, {serverError, false}, {forbidden, false}, {tooMany, false}, {gone, false}, {tooLarge, false}} {
		srv := newAwayAPIServer(t, tc.how)
		_, err := toolscache.ToListerWatcherWithContext(configMaps(t, srv.URL)).ListWithContext(context.Background(), metav1.ListOptions{})
		if err == nil || APIServerAway(err) != tc.want {
			t.Errorf("answer %d: error %v, away %t, want %t", tc.how, err, err != nil && APIServerAway(err), tc.want)
		}
	}
	if APIServerAway(context.Canceled) {
		t.Error("a cancelled request is not the API server's absence")
	}
}
