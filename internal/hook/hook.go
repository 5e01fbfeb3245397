// Package hook runs a NodeOperation's hooks: it builds the Job of a job hook from its template,
// reads a hook Job's outcome, and builds, signs and POSTs the CloudEvent of an http hook with
// exponential back-off. It decides nothing: the NodeOperation controller (hooks.go) says which
// hook runs and records each one's outcome in the operation's status.
package hook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/objname"
)

// Namespace is where hook Jobs run and the signing Secret lives.
const Namespace = v1alpha1.HookNamespace

// Header carries the signature: "sha256=" and the hex HMAC-SHA256 of the body under the key.
const Header = "X-Nodeops-Signature"

// ContentType is CloudEvents' structured JSON mode.
const ContentType = "application/cloudevents+json; charset=utf-8"

// Event types, one per transition.
const (
	TypeOperationStarted   = "io.nodeops.operation.started"
	TypeOperationSucceeded = "io.nodeops.operation.succeeded"
	TypeNodeStarted        = "io.nodeops.node.started"
	TypeNodeSucceeded      = "io.nodeops.node.succeeded"
	TypeNodeFailed         = "io.nodeops.node.failed"
)

// Outcomes of a post-node hook run.
const (
	OutcomeSucceeded = "Succeeded"
	OutcomeFailed    = "Failed"
)

// Key names one run of the hooks at a point: for a node of a group, or for the operation.
type Key struct {
	Point       v1alpha1.HookPoint
	Group, Node string
	Outcome     string
}

// KeyOf is r's key.
func KeyOf(r *v1alpha1.HookRun) Key {
	return Key{Point: r.Point, Group: r.Group, Node: r.Node, Outcome: r.Outcome}
}

// Type is the CloudEvent type of a run at k.
func Type(k Key) string {
	switch k.Point {
	case v1alpha1.HookPreOperation:
		return TypeOperationStarted
	case v1alpha1.HookPostOperation:
		return TypeOperationSucceeded
	case v1alpha1.HookPreNode:
		return TypeNodeStarted
	}
	if k.Outcome == OutcomeFailed {
		return TypeNodeFailed
	}
	return TypeNodeSucceeded
}

// Event is one CloudEvent (CloudEvents 1.0, structured JSON mode).
type Event struct {
	SpecVersion     string    `json:"specversion"`
	ID              string    `json:"id"`
	Source          string    `json:"source"`
	Type            string    `json:"type"`
	Time            time.Time `json:"time"`
	Subject         string    `json:"subject"`
	DataContentType string    `json:"datacontenttype"`
	Data            EventData `json:"data"`
}

// EventData is what an event says about the operation.
type EventData struct {
	Operation string `json:"operation"`
	UID       string `json:"uid"`
	Point     string `json:"point"`
	Group     string `json:"group,omitempty"`
	Node      string `json:"node,omitempty"`
	Hook      string `json:"hook"`
	// Message is the failed task's message for io.nodeops.node.failed.
	Message string `json:"message,omitempty"`
}

// NewEvent is the event of the run at k of op, sent by hook at since. Its id depends only on the
// operation and k: every retry, and every receiver, gets the same id.
func NewEvent(op *v1alpha1.NodeOperation, k Key, hook string, since time.Time, message string) Event {
	subject := op.Name
	if k.Node != "" {
		subject = k.Node
	}
	return Event{
		SpecVersion: "1.0", ID: objname.Hash(string(op.UID), string(k.Point), k.Group, k.Node, k.Outcome)[:32],
		Source: Source(op.Name), Type: Type(k), Time: since.UTC(),
		Subject: subject, DataContentType: "application/json",
		Data: EventData{Operation: op.Name, UID: string(op.UID), Point: string(k.Point), Group: k.Group, Node: k.Node, Hook: hook, Message: message},
	}
}

// Sign is the header value for body under key.
func Sign(key, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Verify reports whether sig is body's signature under key, in constant time.
func Verify(key, body []byte, sig string) bool {
	return hmac.Equal([]byte(sig), []byte(Sign(key, body)))
}

// Backoff is the wait after the nth failed delivery (n >= 1): 1s, 2s, 4s, ... at most a minute.
func Backoff(n int) time.Duration {
	if n < 1 {
		return 0
	}
	if n > 7 {
		return time.Minute
	}
	return min(time.Second<<(n-1), time.Minute)
}

// Sender POSTs events, remembering for each event id its failures (for the back-off) and whether
// it was delivered: a reconcile that reads a status older than its own last write then does not
// send a delivered event again.
type Sender struct {
	HTTP *http.Client

	mu sync.Mutex
	// failures and delivered are by event source (one operation), then url and event id.
	failures  map[string]map[string]attempt
	delivered map[string]map[string]bool
}

type attempt struct {
	n    int
	next time.Time
	last string
}

// Outcome of one delivery call.
type Outcome struct {
	Delivered bool
	// Due, when not delivered, is when the next attempt may go.
	Due time.Time
	// Message is the last failure.
	Message string
}

// Deliver sends ev to url signed with key, unless it was delivered already or its back-off has
// not run out at now. Only a 2xx counts as delivered.
func (s *Sender) Deliver(ctx context.Context, url string, key []byte, ev Event, now time.Time) Outcome {
	id, src := url+" "+ev.ID, ev.Source
	s.mu.Lock()
	if s.delivered[src][id] {
		s.mu.Unlock()
		return Outcome{Delivered: true}
	}
	a := s.failures[src][id]
	s.mu.Unlock()
	if now.Before(a.next) {
		return Outcome{Due: a.next, Message: a.last}
	}
	err := s.post(ctx, url, key, ev)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		if s.delivered == nil {
			s.delivered = map[string]map[string]bool{}
		}
		if s.delivered[src] == nil {
			s.delivered[src] = map[string]bool{}
		}
		s.delivered[src][id] = true
		delete(s.failures[src], id)
		return Outcome{Delivered: true}
	}
	a.n++
	a.next = now.Add(Backoff(a.n))
	a.last = fmt.Sprintf("attempt %d: %v", a.n, err)
	if s.failures == nil {
		s.failures = map[string]map[string]attempt{}
	}
	if s.failures[src] == nil {
		s.failures[src] = map[string]attempt{}
	}
	s.failures[src][id] = a
	return Outcome{Due: a.next, Message: a.last}
}

// Forget drops what s remembers of the events of one source (an operation gone or finished).
func (s *Sender) Forget(source string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.failures, source)
	delete(s.delivered, source)
}

// Source is the CloudEvent source of the operation named op.
func Source(op string) string { return "/apis/nodeops.io/v1alpha1/nodeoperations/" + op }

func (s *Sender) post(ctx context.Context, url string, key []byte, ev Event) error {
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", ContentType)
	req.Header.Set(Header, Sign(key, body))
	c := s.HTTP
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return fmt.Errorf("%s answered %s: %s", url, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

// JobName is the Job of attempt of hook at k of op: readable, deterministic and at most 63
// characters (a Job's name is also its pods' job-name label).
func JobName(op string, k Key, hook string, attempt int32) string {
	h := objname.Hash(op, string(k.Point), k.Group, k.Node, k.Outcome, hook, fmt.Sprint(attempt))[:10]
	prefix := op + "-" + hook
	if len(prefix) > 52 {
		prefix = prefix[:52]
	}
	return strings.TrimRight(prefix, "-.") + "-" + h
}

// BuildJob is the Job of a job hook's attempt at k of op.
func BuildJob(op *v1alpha1.NodeOperation, k Key, h *v1alpha1.Hook, attempt int32) (*batchv1.Job, error) {
	tmpl, err := Template(h.Job)
	if err != nil {
		return nil, err
	}
	job := &batchv1.Job{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	job.Name, job.GenerateName, job.Namespace = JobName(op.Name, k, h.Name, attempt), "", Namespace
	if job.Labels == nil {
		job.Labels = map[string]string{}
	}
	job.Labels[v1alpha1.LabelOperation] = objname.LabelValue(op.Name)
	job.Labels[v1alpha1.LabelHook] = h.Name
	if k.Node != "" {
		job.Labels[v1alpha1.LabelNode] = objname.LabelValue(k.Node)
	}
	job.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeOperation", Name: op.Name, UID: op.UID, Controller: ptr.To(true),
	}}
	if job.Spec.Template.Spec.RestartPolicy == "" {
		job.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	}
	env := []corev1.EnvVar{
		{Name: "NODEOPS_OPERATION", Value: op.Name}, {Name: "NODEOPS_HOOK_POINT", Value: string(k.Point)},
		{Name: "NODEOPS_GROUP", Value: k.Group}, {Name: "NODEOPS_NODE", Value: k.Node},
	}
	for i := range job.Spec.Template.Spec.Containers {
		c := &job.Spec.Template.Spec.Containers[i]
		c.Env = append(append([]corev1.EnvVar(nil), c.Env...), env...)
	}
	return job, nil
}

// Template decodes a job hook's template strictly: a field the Job API does not know is an error.
func Template(j *v1alpha1.JobHook) (*batchv1.JobTemplateSpec, error) {
	if j == nil || len(j.Template.Raw) == 0 {
		return nil, fmt.Errorf("no template")
	}
	dec := json.NewDecoder(bytes.NewReader(j.Template.Raw))
	dec.DisallowUnknownFields()
	var t batchv1.JobTemplateSpec
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("not a JobTemplateSpec: %w", err)
	}
	if len(t.Spec.Template.Spec.Containers) == 0 {
		return nil, fmt.Errorf("spec.template.spec.containers: a Job needs a container")
	}
	return &t, nil
}

// JobResult reads a hook Job's outcome: done, and whether it succeeded, with its reason.
func JobResult(j *batchv1.Job) (done, ok bool, message string) {
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			return true, true, fmt.Sprintf("Job %s completed", j.Name)
		case batchv1.JobFailed:
			return true, false, fmt.Sprintf("Job %s failed: %s: %s", j.Name, c.Reason, c.Message)
		}
	}
	return false, false, fmt.Sprintf("Job %s: %d active, %d failed pods", j.Name, j.Status.Active, j.Status.Failed)
}

// Validate decodes every job hook's template of spec, returning the first error with its field path.
func Validate(spec *v1alpha1.NodeOperationSpec) error {
	check := func(path string, h *v1alpha1.Hooks) error {
		if h == nil {
			return nil
		}
		for _, p := range []struct {
			name  string
			hooks []v1alpha1.Hook
		}{{"preOperation", h.PreOperation}, {"preNode", h.PreNode}, {"postNode", h.PostNode}, {"postOperation", h.PostOperation}} {
			for i := range p.hooks {
				if j := p.hooks[i].Job; j != nil {
					if _, err := Template(j); err != nil {
						return fmt.Errorf("%s.%s[%d].job.template: %w", path, p.name, i, err)
					}
				}
			}
		}
		return nil
	}
	if err := check("spec.hooks", spec.Hooks); err != nil {
		return err
	}
	if spec.Custom != nil {
		for i := range spec.Custom.Groups {
			if err := check(fmt.Sprintf("spec.custom.groups[%d].hooks", i), spec.Custom.Groups[i].Hooks); err != nil {
				return err
			}
		}
	}
	return nil
}

// Describe is a hook in words, for plan and describe.
func Describe(h *v1alpha1.Hook) string {
	timeout := "10m0s"
	if h.Timeout != nil {
		timeout = h.Timeout.Duration.String()
	}
	switch {
	case h.Job != nil:
		image := ""
		if t, err := Template(h.Job); err == nil {
			image = " " + t.Spec.Template.Spec.Containers[0].Image
		}
		return fmt.Sprintf("%s: job%s (timeout %s)", h.Name, image, timeout)
	case h.HTTP != nil:
		return fmt.Sprintf("%s: http %s, signed with key %s of secret %s/%s (timeout %s)", h.Name, h.HTTP.URL, h.HTTP.SigningKey, Namespace, v1alpha1.HookSigningSecret, timeout)
	}
	return h.Name
}
