package alerting_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeops/nodeops/internal/alerting"
)

// TestRule14_AnswersThatCannotBeTrustedAreErrors: a gate that cannot be evaluated blocks (rule 14),
// so an unreachable server, a refusal and a body that is not the API's must each be an error,
// never "no alerts" or "no series".
func TestRule14_AnswersThatCannotBeTrustedAreErrors(t *testing.T) {
	closed := closedURL(t)
	for _, tc := range []struct {
		name string
		url  string // else a server answering status and body
		code int
		body string
		kind alerting.Kind
		// only: the calls this case applies to (all when empty).
		only []string
	}{
		{name: "unreachable", url: closed, kind: alerting.Unreachable},
		{name: "not an http URL", url: "ftp://127.0.0.1/", kind: alerting.Unreachable},
		{name: "no URL", url: "", kind: alerting.Unreachable},
		{name: "500", code: 500, body: "boom", kind: alerting.Refused},
		{name: "404 of a wrong path", code: 404, body: `{"code":404,"message":"path /x was not found"}`, kind: alerting.Refused},
		{name: "garbage", code: 200, body: "<html>please log in</html>", kind: alerting.Undecodable, only: []string{"Series", "Firing", "Silence", "Extend"}},
		{name: "null", code: 200, body: "null", kind: alerting.Undecodable, only: []string{"Series", "Firing", "Silence", "Extend"}},
		{name: "empty", code: 200, body: "", kind: alerting.Undecodable, only: []string{"Series", "Firing", "Silence", "Extend"}},
		{name: "an object where a list is due", code: 200, body: "{}", kind: alerting.Undecodable, only: []string{"Series", "Firing", "Silence", "Extend"}},
		{name: "trailing data", code: 200, body: `[] []`, kind: alerting.Undecodable, only: []string{"Firing"}},
		{name: "prometheus status error", code: 200, body: `{"status":"error","errorType":"timeout","error":"query timed out"}`, kind: alerting.Undecodable, only: []string{"Series"}},
		{name: "prometheus null result", code: 200, body: `{"status":"success","data":{"resultType":"vector","result":null}}`, kind: alerting.Undecodable, only: []string{"Series"}},
		{name: "prometheus unknown result type", code: 200, body: `{"status":"success","data":{"resultType":"histogram","result":[]}}`, kind: alerting.Undecodable, only: []string{"Series"}},
		{name: "prometheus series without a value", code: 200, body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}`, kind: alerting.Undecodable, only: []string{"Series"}},
		{name: "silence without an id", code: 200, body: `{"silenceID":""}`, kind: alerting.Undecodable, only: []string{"Silence", "Extend"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.url
			if tc.code != 0 {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.WriteHeader(tc.code)
					_, _ = w.Write([]byte(tc.body))
				}))
				t.Cleanup(srv.Close)
				url = srv.URL
			}
			for name, call := range calls(url) {
				if len(tc.only) > 0 && !slices.Contains(tc.only, name) {
					continue
				}
				lines, err := call(t.Context())
				var e *alerting.Error
				switch {
				case err == nil:
					t.Errorf("%s: no error, returned %q", name, lines)
				case !errors.As(err, &e):
					t.Errorf("%s: %v is not an *alerting.Error", name, err)
				case e.Kind != tc.kind:
					t.Errorf("%s: %v: kind %s, want %s", name, err, e.Kind, tc.kind)
				case lines != nil:
					t.Errorf("%s: an error and lines %q", name, lines)
				default:
					t.Logf("%s: %v", name, err)
				}
			}
		})
	}
}

// A server that accepts and never answers holds a gate only until the caller's deadline.
func TestAHangingServerIsUnreachableAtTheDeadline(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := alerting.Alertmanager{URL: srv.URL}.Firing(ctx, nil)
	var e *alerting.Error
	if !errors.As(err, &e) || e.Kind != alerting.Unreachable || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Firing against a hanging server: %v, want unreachable at the deadline", err)
	}
}

// The message names the service and the request, never a URL's password.
func TestErrorsNameTheServerWithoutCredentials(t *testing.T) {
	closed := strings.Replace(closedURL(t), "http://", "http://nodeops:s3cret@", 1)
	_, err := alerting.Prometheus{URL: closed + "/prom"}.Series(t.Context(), "up")
	if err == nil {
		t.Fatal("no error from a closed port")
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "prometheus unreachable: GET http://nodeops:xxxxx@127.0.0.1:") || !strings.Contains(msg, "/prom/api/v1/query") || strings.Contains(msg, "s3cret") {
		t.Errorf("message %q: want the service, method and URL, no password", msg)
	}
}

// calls are the package's four calls against url, each as a function returning lines.
func calls(url string) map[string]func(context.Context) ([]string, error) {
	prom, am := alerting.Prometheus{URL: url}, alerting.Alertmanager{URL: url}
	return map[string]func(context.Context) ([]string, error){
		"Series": func(ctx context.Context) ([]string, error) { return prom.Series(ctx, "up") },
		"Firing": func(ctx context.Context) ([]string, error) { return am.Firing(ctx, []string{"node=a"}) },
		"Silence": func(ctx context.Context) ([]string, error) {
			id, err := am.Silence(ctx, "", []string{"node=a"}, "test", "test", time.Now().Add(time.Hour))
			if id != "" {
				return []string{id}, err
			}
			return nil, err
		},
		"Extend": func(ctx context.Context) ([]string, error) {
			id, err := am.Silence(ctx, "0b9a4c52-2d5c-4c1e-9a57-6e3f7b1d2c44", []string{"node=a"}, "test", "test", time.Now().Add(time.Hour))
			if id != "" {
				return []string{id}, err
			}
			return nil, err
		},
		"Expire": func(ctx context.Context) ([]string, error) {
			return nil, am.Expire(ctx, "0b9a4c52-2d5c-4c1e-9a57-6e3f7b1d2c44")
		},
	}
}

// closedURL is the URL of a loopback port nothing listens on.
func closedURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}
