package testutil

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// apiServerOwn are the resources the API server writes for itself (its identity lease, flow
// control, the kubernetes Service's endpoints): no controller's cost.
var apiServerOwn = map[string]bool{"leases": true, "flowschemas": true, "prioritylevelconfigurations": true, "endpoints": true, "endpointslices": true}

// Writes are the API server's own counts of the write requests it answered.
type Writes struct {
	// Done are the writes it made (a 2xx answer); Refused the others (a conflict, an invalid object),
	// which changed nothing and whose number depends on how clients' requests interleave.
	Done, Refused int64
}

// Sub is w less an earlier count.
func (w Writes) Sub(before Writes) Writes {
	return Writes{Done: w.Done - before.Done, Refused: w.Refused - before.Refused}
}

// APIServerWrites reads the API server's own count of the write requests it answered
// (apiserver_request_total of every verb that is not a read), all clients together, leaving out
// its own bookkeeping (apiServerOwn). Counted where the writes land, it sees every client.
func APIServerWrites(ctx context.Context, cfg *rest.Config) (Writes, error) {
	var w Writes
	err := apiServerRequests(ctx, cfg, func(labels func(string) string, n int64) {
		switch labels("verb") {
		case "GET", "LIST", "WATCH", "WATCHLIST", "CONNECT", "":
			return
		}
		if apiServerOwn[labels("resource")] {
			return
		}
		if strings.HasPrefix(labels("code"), "2") {
			w.Done += n
		} else {
			w.Refused += n
		}
	})
	return w, err
}

// APIServerRequests is the API server's count of the requests it answered for resource/subresource
// ("pods/eviction") with HTTP code ("429").
func APIServerRequests(ctx context.Context, cfg *rest.Config, resource, code string) (int64, error) {
	res, sub, _ := strings.Cut(resource, "/")
	var total int64
	err := apiServerRequests(ctx, cfg, func(labels func(string) string, n int64) {
		if labels("resource") == res && labels("subresource") == sub && labels("code") == code {
			total += n
		}
	})
	return total, err
}

// apiServerRequests calls each with every apiserver_request_total series of the API server's /metrics.
func apiServerRequests(ctx context.Context, cfg *rest.Config, each func(labels func(string) string, n int64)) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client for /metrics: %w", err)
	}
	body, err := cs.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("read the API server's /metrics: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	found := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "apiserver_request_total{")
		if !ok {
			continue
		}
		found = true
		labels, value, ok := strings.Cut(line, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return fmt.Errorf("apiserver_request_total value %q: %w", value, err)
		}
		each(func(name string) string { return label(labels, name) }, int64(v))
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("no apiserver_request_total in the API server's /metrics")
	}
	return nil
}

// label is the value of name in a Prometheus label list `a="x",b="y"`.
func label(labels, name string) string {
	for _, kv := range strings.Split(labels, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}
