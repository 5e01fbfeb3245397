package kubeclient

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/nodeops/nodeops/internal/testutil"
)

// restartingAPIServer serves ConfigMaps as an API server that restarts: before, it lists a (v1) and
// b, and its watch sends b's change, then ends when the process stops; while away it closes every
// connection; after, a was changed (v2), b deleted and c created while it was away, and its watch
// cache begins after all that, so a watch from before is too old (410, in the stream as a new API
// server's watch cache answers).
type restartingAPIServer struct {
	*httptest.Server
	mu        sync.Mutex
	restarted chan struct{} // closed when the process stops
	awayFor   int           // requests the stopped server leaves unanswered
	away      int
	requests  []string
}

func newRestartingAPIServer(t *testing.T) *restartingAPIServer {
	s := &restartingAPIServer{restarted: make(chan struct{}), awayFor: 3}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *restartingAPIServer) restart() { close(s.restarted) }

func (s *restartingAPIServer) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.requests...)
}

func configMapJSON(name, v, rv string) string {
	return fmt.Sprintf(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":%q,"namespace":"default","resourceVersion":%q},"data":{"v":%q}}`, name, rv, v)
}

func (s *restartingAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	what := "list"
	if q.Get("watch") == "true" {
		what = "watch"
		if q.Get("sendInitialEvents") == "true" {
			what = "watchlist"
		}
	}
	what += " rv=" + q.Get("resourceVersion")
	restarted := false
	select {
	case <-s.restarted:
		restarted = true
	default:
	}
	s.mu.Lock()
	if restarted && s.away < s.awayFor {
		s.away++
		s.mu.Unlock()
		// As a starting API server answers (client-go asks again by itself after a closed connection).
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"ServiceUnavailable","code":503}`)
		return
	}
	s.requests = append(s.requests, what)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case strings.HasPrefix(what, "watchlist"):
		// This API server streams no lists: the reflector falls back to a list.
		w.WriteHeader(http.StatusBadRequest)
		_, _ = fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"BadRequest","code":400}`)
	case strings.HasPrefix(what, "list") && !restarted:
		_, _ = fmt.Fprintf(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"10"},"items":[%s,%s]}`,
			configMapJSON("a", "v1", "9"), configMapJSON("b", "v1", "10"))
	case strings.HasPrefix(what, "list"):
		_, _ = fmt.Fprintf(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"13"},"items":[%s,%s]}`,
			configMapJSON("a", "v2", "12"), configMapJSON("c", "v1", "13"))
	case !restarted:
		_, _ = fmt.Fprintf(w, `{"type":"MODIFIED","object":%s}`+"\n", configMapJSON("b", "v2", "11"))
		w.(http.Flusher).Flush()
		select { // the stream ends with the process
		case <-s.restarted:
		case <-r.Context().Done():
		}
	case q.Get("resourceVersion") != "13":
		_, _ = fmt.Fprint(w, `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410,"message":"too old resource version"}}`+"\n")
	default:
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}
}

// countingLists counts the lists the reflector itself asks for.
type countingLists struct {
	*reconnecting
	lists atomic.Int32
}

func (c *countingLists) List(options metav1.ListOptions) (runtime.Object, error) {
	return c.ListWithContext(context.Background(), options)
}

func (c *countingLists) ListWithContext(ctx context.Context, options metav1.ListOptions) (runtime.Object, error) {
	c.lists.Add(1)
	return c.reconnecting.ListWithContext(ctx, options)
}

// TestTheManagersCacheCatchesUpWithARestartedAPIServerWithoutRelisting: after a single control
// plane's API server restarted, the watch from where the cache stood is too old for the new one.
// The cache catches up at once (the change, the delete and the create made while it was away) and
// watches on, without the reflector's own list, which comes only after its back-off of 0.8 s or
// more: the manager learns of an agent's last write as soon as the API server serves it.
func TestTheManagersCacheCatchesUpWithARestartedAPIServerWithoutRelisting(t *testing.T) {
	srv := newRestartingAPIServer(t)
	r := reconnectingWith(configMaps(t, srv.URL), 10*time.Millisecond, time.Minute)
	lw := &countingLists{reconnecting: r}
	informer := toolscache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, toolscache.Indexers{})
	r.catchUpInto(informer.GetStore(), &corev1.ConfigMap{})
	var deleted atomic.Value
	if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			deleted.Store(cm.Name + " " + cm.Data["v"])
		}
	}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go informer.RunWithContext(ctx)

	cached := func() string {
		var got []string
		for _, obj := range informer.GetStore().List() {
			cm := obj.(*corev1.ConfigMap)
			got = append(got, cm.Name+" "+cm.Data["v"]+" "+cm.ResourceVersion)
		}
		sort.Strings(got)
		return strings.Join(got, ", ")
	}
	testutil.Eventually(t, 30*time.Second, "the cache before the restart", func() error {
		if got, want := cached(), "a v1 9, b v2 11"; got != want {
			return fmt.Errorf("cache %q, want %q", got, want)
		}
		return nil
	})
	srv.restart()
	testutil.Eventually(t, 30*time.Second, "the cache after the restart", func() error {
		if got, want := cached(), "a v2 12, c v1 13"; got != want {
			return fmt.Errorf("cache %q, want %q (requests %q)", got, want, srv.seen())
		}
		if got := informer.LastSyncResourceVersion(); got != "13" {
			return fmt.Errorf("the reflector is at resource version %q, want the list's 13", got)
		}
		return nil
	})
	// Handlers hear of a change after the store holds it, from a goroutine of their own.
	testutil.Eventually(t, 30*time.Second, "the delete handler told of b as the cache last had it", func() error {
		if got, want := deleted.Load(), "b v2"; got != want {
			return fmt.Errorf("the delete handler saw %v, want the cache's last b (%q)", got, want)
		}
		return nil
	})
	// The watch goes on from the list, and the reflector listed only once, at its start.
	testutil.Eventually(t, 30*time.Second, "the watch from the list's resource version", func() error {
		if seen := srv.seen(); seen[len(seen)-1] != "watch rv=13" {
			return fmt.Errorf("requests %q, want the last a watch from 13", seen)
		}
		return nil
	})
	if n := lw.lists.Load(); n != 1 {
		t.Errorf("the reflector listed %d times, want once (requests %q)", n, srv.seen())
	}
}

// TestAWatchTheReturnedAPIServerServesIsHandedOnAsItIs: after an absence, a watch the returned API
// server can serve from the cache's resource version is the reflector's as it is, first event and
// all; and a watch the API server was never away for is not looked into.
func TestAWatchTheReturnedAPIServerServesIsHandedOnAsItIs(t *testing.T) {
	for _, plan := range [][]away{{unavailable, unavailable}, nil} {
		srv := newFlakyAPIServer(t, plan...)
		r := reconnectingWith(configMaps(t, srv.URL), 10*time.Millisecond, time.Minute)
		r.catchUpInto(toolscache.NewStore(toolscache.MetaNamespaceKeyFunc), &corev1.ConfigMap{})
		w, err := r.WatchWithContext(context.Background(), metav1.ListOptions{ResourceVersion: "7"})
		if err != nil {
			t.Fatal(err)
		}
		ev := <-w.ResultChan()
		w.Stop()
		if cm, ok := ev.Object.(*corev1.ConfigMap); !ok || ev.Type != "ADDED" || cm.Name != "back" {
			t.Errorf("after %d unanswered asks: first event %s %#v, want ConfigMap back ADDED", len(plan), ev.Type, ev.Object)
		}
		if _, caught := w.(*caughtUp); caught != (len(plan) > 0) {
			t.Errorf("after %d unanswered asks: the watch was looked into: %t", len(plan), caught)
		}
		if got := srv.count(); got != len(plan)+1 {
			t.Errorf("after %d unanswered asks: the API server saw %d requests, want %d", len(plan), got, len(plan)+1)
		}
	}
}
