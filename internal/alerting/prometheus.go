package alerting

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Prometheus is one Prometheus server (or anything serving its HTTP API, such as Thanos or Mimir).
type Prometheus struct {
	// URL is the server's base URL, prefix included: http://prometheus:9090, http://host/prometheus.
	URL string
	// Client makes the calls; nil is a client with a 30 s timeout.
	Client *http.Client
}

// Series runs an instant query and returns each resulting series as a one-line string
// ({a="b"} => value); none means the gate passes. A scalar or string result is one line, as it
// is never empty. Any failure is an *Error: the caller blocks (rule 14).
func (p Prometheus) Series(ctx context.Context, query string) ([]string, error) {
	if strings.TrimSpace(query) == "" {
		return nil, errors.New("prometheus: empty query")
	}
	var lines []string
	err := p.endpoint().call(ctx, http.MethodGet, "api/v1/query", url.Values{"query": {query}}, nil, func(body []byte) error {
		var err error
		lines, err = decodeQuery(body)
		return err
	})
	if err != nil {
		return nil, err
	}
	return lines, nil
}

func (p Prometheus) endpoint() endpoint {
	return endpoint{service: "prometheus", base: p.URL, client: p.Client}
}

// queryResponse is /api/v1/query's envelope; data.result's shape depends on data.resultType.
type queryResponse struct {
	Status string `json:"status"`
	Data   *struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	} `json:"data"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
}

type sample struct {
	Metric map[string]string `json:"metric"`
	Value  *[2]any           `json:"value"`
	Values [][2]any          `json:"values"`
}

// decodeQuery reads an instant query's answer into one line per series; an error when the body is
// not a successful answer of a known result type.
func decodeQuery(body []byte) ([]string, error) {
	var r queryResponse
	if err := decodeJSON(body, &r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		if r.Error != "" {
			return nil, fmt.Errorf("status %q, not \"success\": %s: %s", r.Status, r.ErrorType, r.Error)
		}
		return nil, fmt.Errorf("status %q, not \"success\"", r.Status)
	}
	if r.Data == nil || len(r.Data.Result) == 0 {
		return nil, errors.New("no data.result")
	}
	switch r.Data.ResultType {
	case "vector", "matrix":
		var series []sample
		if err := decodeJSON(r.Data.Result, &series); err != nil {
			return nil, fmt.Errorf("%s result: %w", r.Data.ResultType, err)
		}
		lines := make([]string, 0, len(series))
		for _, s := range series {
			v := s.Value
			if r.Data.ResultType == "matrix" && len(s.Values) > 0 {
				v = &s.Values[len(s.Values)-1]
			}
			value, err := sampleValue(v)
			if err != nil {
				return nil, fmt.Errorf("series %s: %w", seriesName(s.Metric), err)
			}
			lines = append(lines, seriesName(s.Metric)+" => "+value)
		}
		slices.Sort(lines)
		return lines, nil
	case "scalar", "string":
		var v [2]any
		if err := decodeJSON(r.Data.Result, &v); err != nil {
			return nil, fmt.Errorf("%s result: %w", r.Data.ResultType, err)
		}
		value, err := sampleValue(&v)
		if err != nil {
			return nil, fmt.Errorf("%s result: %w", r.Data.ResultType, err)
		}
		return []string{r.Data.ResultType + " => " + value}, nil
	default:
		return nil, fmt.Errorf("unknown resultType %q", r.Data.ResultType)
	}
}

// sampleValue is the value of a [timestamp, "value"] pair.
func sampleValue(v *[2]any) (string, error) {
	if v == nil {
		return "", errors.New("no value")
	}
	s, ok := v[1].(string)
	if !ok {
		return "", fmt.Errorf("value %v is not a string", v[1])
	}
	return s, nil
}

// seriesName writes a label set as Prometheus does: name{a="b", c="d"}.
func seriesName(metric map[string]string) string {
	names := make([]string, 0, len(metric))
	for k := range metric {
		if k != "__name__" {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString(metric["__name__"])
	b.WriteByte('{')
	for i, k := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k + "=" + strconv.Quote(metric[k]))
	}
	b.WriteByte('}')
	return b.String()
}
