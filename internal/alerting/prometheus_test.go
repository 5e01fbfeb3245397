package alerting_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nodeops/nodeops/internal/alerting"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/internal/testutil/monitoring"
)

func TestSeriesWhileAMetricIsAboveAThreshold(t *testing.T) {
	target := monitoring.NewTarget(t, "nodeops_test_load")
	target.Set(5)
	server := monitoring.Prometheus(t, target.Addr)
	prom := alerting.Prometheus{URL: server.URL}
	const query = "nodeops_test_load > 3"

	want := fmt.Sprintf(`nodeops_test_load{instance=%q, job="test"} => 5`, target.Addr)
	seriesAre(t, prom, query, want)

	target.Set(1)
	seriesAre(t, prom, query)

	// A scalar is never empty: it holds the gate with its value.
	seriesAre(t, prom, "scalar(vector(2))", "scalar => 2")

	// A query Prometheus cannot parse is its refusal, with its reason.
	_, err := prom.Series(t.Context(), "nodeops_test_load >")
	var e *alerting.Error
	if !errors.As(err, &e) || e.Kind != alerting.Refused || e.Status != 400 || !strings.Contains(err.Error(), "bad_data") {
		t.Errorf("a query that does not parse: %v, want a refusal with bad_data", err)
	}
}

// seriesAre waits until Series(query) returns exactly want.
func seriesAre(t *testing.T, prom alerting.Prometheus, query string, want ...string) {
	t.Helper()
	testutil.EventuallyEvery(t, wait, 200*time.Millisecond, fmt.Sprintf("Series(%q) returns %q", query, want), func(ctx context.Context) error {
		got, err := prom.Series(ctx, query)
		if err != nil {
			return err
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			return fmt.Errorf("got %q", got)
		}
		return nil
	})
}
