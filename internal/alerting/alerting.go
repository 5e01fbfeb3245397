// Package alerting asks Prometheus and Alertmanager whether work may go on: a PromQL query that
// must come back empty (Prometheus' /api/v1/query), the alerts firing that match given matchers,
// and the silences nodeops holds over a node while it works on it (Alertmanager's v2 API). Plain
// net/http and encoding/json, no client library.
//
// A gate that cannot be evaluated blocks (rule 14), so every answer this package cannot trust is an
// error that says what was unreachable, refused or undecodable: an empty result is returned only
// from a 2xx answer whose body decoded as the API's own success shape. It keeps no state between
// calls and touches no Kubernetes object; the gates code decides what an answer means for an operation.
package alerting

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// defaultTimeout bounds a call made with no Client and no deadline on its context: a server that
// accepts the connection and never answers must not hold a gate forever.
const defaultTimeout = 30 * time.Second

// maxBody bounds what is read of an answer; a larger one is reported as undecodable.
const maxBody = 16 << 20

// Kind says which way a call failed.
type Kind string

const (
	// Unreachable: no HTTP answer came (bad URL, connection refused, DNS, timeout).
	Unreachable Kind = "unreachable"
	// Refused: an answer came with a status outside 2xx, or Prometheus' status "error".
	Refused Kind = "refused"
	// Undecodable: a 2xx answer whose body is not the API's shape.
	Undecodable Kind = "undecodable"
)

// Error is every failure of this package: which service, which request, and why.
type Error struct {
	// Service is "prometheus" or "alertmanager".
	Service string
	// Request is the method and the URL without its query or credentials.
	Request string
	Kind    Kind
	// Status is the HTTP status code of a Refused or Undecodable answer.
	Status int
	// Detail is the server's own explanation (an error message or the start of its body), if any.
	Detail string
	Err    error
}

func (e *Error) Error() string {
	var b strings.Builder
	switch e.Kind {
	case Unreachable:
		fmt.Fprintf(&b, "%s unreachable: %s", e.Service, e.Request)
	case Refused:
		fmt.Fprintf(&b, "%s refused %s: HTTP %d", e.Service, e.Request, e.Status)
	default:
		fmt.Fprintf(&b, "%s answered %s with HTTP %d and a body that is not its API's", e.Service, e.Request, e.Status)
	}
	if e.Detail != "" {
		fmt.Fprintf(&b, ": %s", e.Detail)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// endpoint is one service at one base URL, with the HTTP client its calls use.
type endpoint struct {
	service string
	base    string
	client  *http.Client
}

// call sends one request and decodes a 2xx answer's JSON body into out with decode; a non-2xx answer
// is Refused, with explain's reading of its body as the detail.
func (e endpoint) call(ctx context.Context, method, path string, query url.Values, in any, decode func([]byte) error) error {
	u, err := e.url(path)
	request := method + " " + path
	if err != nil {
		return &Error{Service: e.service, Request: request, Kind: Unreachable, Err: err}
	}
	request = method + " " + u.Redacted()
	if len(query) > 0 {
		u.RawQuery = query.Encode()
	}
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s: encode the request: %w", request, err)
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return &Error{Service: e.service, Request: request, Kind: Unreachable, Err: err}
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	client := e.client
	if client == nil {
		client = &http.Client{Timeout: defaultTimeout}
	}
	resp, err := client.Do(req)
	if err != nil {
		// The request is named once already; url.Error would repeat it, query and all.
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		return &Error{Service: e.service, Request: request, Kind: Unreachable, Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return &Error{Service: e.service, Request: request, Kind: Unreachable, Status: resp.StatusCode, Err: fmt.Errorf("read the answer: %w", err)}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return &Error{Service: e.service, Request: request, Kind: Refused, Status: resp.StatusCode, Detail: explain(data)}
	}
	if len(data) > maxBody {
		return &Error{Service: e.service, Request: request, Kind: Undecodable, Status: resp.StatusCode, Err: fmt.Errorf("longer than %d bytes", maxBody)}
	}
	if decode == nil {
		return nil
	}
	if err := decode(data); err != nil {
		return &Error{Service: e.service, Request: request, Kind: Undecodable, Status: resp.StatusCode, Detail: excerpt(data), Err: err}
	}
	return nil
}

// url is the base URL with path appended to its own path, so a server behind a prefix
// (http://host/alertmanager) is reached at its prefix.
func (e endpoint) url(path string) (*url.URL, error) {
	u, err := url.Parse(e.base)
	if err != nil {
		return nil, fmt.Errorf("URL %q: %w", e.base, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("URL %q: want http:// or https:// and a host", u.Redacted())
	}
	u = u.JoinPath(path)
	u.RawQuery, u.Fragment = "", ""
	return u, nil
}

// explain is what a refusing server said: Prometheus' "error" field, Alertmanager's "message" or
// its bare JSON string, else the start of the body.
func explain(body []byte) string {
	var prom struct {
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
		Message   string `json:"message"`
	}
	if json.Unmarshal(body, &prom) == nil {
		switch {
		case prom.Error != "" && prom.ErrorType != "":
			return prom.ErrorType + ": " + prom.Error
		case prom.Error != "":
			return prom.Error
		case prom.Message != "":
			return prom.Message
		}
	}
	var s string
	if json.Unmarshal(body, &s) == nil {
		return s
	}
	return excerpt(body)
}

// excerpt is the start of a body, on one line, for a message.
func excerpt(body []byte) string {
	const max = 200
	s := strings.Join(strings.Fields(string(body)), " ")
	if len(s) > max {
		s = s[:max] + "..."
	}
	if s == "" {
		return "(empty body)"
	}
	return fmt.Sprintf("%q", s)
}

// decodeJSON decodes data into out, refusing trailing data and a JSON null where out wants a value:
// "null" must never read as "no alerts".
func decodeJSON(data []byte, out any) error {
	trimmed := bytes.TrimSpace(data)
	if bytes.Equal(trimmed, []byte("null")) || len(trimmed) == 0 {
		return errors.New("empty or null body")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	if err := dec.Decode(out); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}
