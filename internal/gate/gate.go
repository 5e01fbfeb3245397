// Package gate evaluates the health gates of NodeOperations and NodeProfiles (CEL over objects,
// cluster health, Prometheus, Alertmanager, approval; a command gate is a NodeTask the
// NodeOperation controller runs), compiles their CEL before anything runs, and
// moves each gate's status record on (Advance, the one state machine of gates). It only reads:
// whatever a gate finds, the controller decides what to do and writes it with its batched status.
// An error is a gate that does not pass, never one that does (a gate that cannot be evaluated blocks, rule 14).
package gate

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/cel-go/cel"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/alerting"
)

// Result is one gate's verdict.
type Result struct {
	Passed  bool
	Message string
}

func hold(format string, a ...any) Result { return Result{Message: fmt.Sprintf(format, a...)} }

// Target is what a gate is checked for.
type Target struct {
	// Subject is the operation or profile whose gate it is.
	Subject Subject
	// Group is the operation's group; empty for a profile.
	Group string
	// Finished are the nodes the operation or profile finished most recently, which cluster health checks.
	Finished []string
}

// Checker evaluates gates. It reads objects and pods past the cache (Reader), so that a gate on
// any kind starts no informer, and nodes from the cache.
type Checker struct {
	Reader client.Reader
	Cache  client.Reader
	HTTP   *http.Client
	// Readyz asks the API server's /readyz; cluster health holds when it fails.
	Readyz func(context.Context) error
	// Timeout bounds one gate's evaluation.
	Timeout time.Duration

	mu    sync.Mutex
	progs map[string]cel.Program
}

// Check evaluates one gate.
func (c *Checker) Check(ctx context.Context, g *v1alpha1.Gate, t Target) Result {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case g.Approval != nil:
		if _, ok := t.Subject.Annotations[v1alpha1.AnnotationApproveGatePrefix+g.Name]; ok {
			return Result{Passed: true, Message: "approved"}
		}
		return hold("waiting for approval: kubectl nodeops approve %s --gate %s", t.Subject.Ref(), g.Name)
	case g.CEL != nil:
		return c.cel(ctx, g.CEL)
	case g.ClusterHealth != nil:
		return c.clusterHealth(ctx, t.Finished)
	case g.Prometheus != nil:
		series, err := alerting.Prometheus{URL: g.Prometheus.URL, Client: c.HTTP}.Series(ctx, g.Prometheus.Query)
		if err != nil {
			return hold("cannot query Prometheus %s: %v", g.Prometheus.URL, err)
		}
		if len(series) > 0 {
			return hold("query returned %d series: %s", len(series), first(series))
		}
		return Result{Passed: true, Message: "query returned no series"}
	case g.Alertmanager != nil:
		alerts, err := alerting.Alertmanager{URL: g.Alertmanager.URL, Client: c.HTTP}.Firing(ctx, g.Alertmanager.Matchers)
		if err != nil {
			return hold("cannot ask Alertmanager %s: %v", g.Alertmanager.URL, err)
		}
		if len(alerts) > 0 {
			return hold("%d alerts firing: %s", len(alerts), first(alerts))
		}
		return Result{Passed: true, Message: "no matching alert firing"}
	case g.Command != nil:
		// Run by the operation's controller as a gate-check NodeTask, never here.
		return hold("a command gate is checked by a NodeTask that only a NodeOperation creates")
	}
	return hold("this kind of gate is not implemented")
}

// firstLine is s's first line, marked when more follow.
func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " ..."
	}
	return s
}

// first is the first of lines, and how many more.
func first(lines []string) string {
	if len(lines) == 1 {
		return lines[0]
	}
	return fmt.Sprintf("%s (and %d more)", lines[0], len(lines)-1)
}

var (
	envOnce sync.Once
	celEnv  *cel.Env
	envErr  error
)

// env is the Kubernetes CEL environment (the API server's libraries: lists, regex, URLs, quantity,
// IP, ...) with the object as `self`.
func env() (*cel.Env, error) {
	envOnce.Do(func() {
		base := environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()).NewExpressionsEnv()
		celEnv, envErr = base.Extend(cel.Variable("self", cel.DynType))
	})
	return celEnv, envErr
}

// Compile parses and type-checks a gate's expression: it must be a boolean.
func Compile(expr string) (cel.Program, error) {
	e, err := env()
	if err != nil {
		return nil, err
	}
	ast, iss := e.Compile(expr)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	if t := ast.OutputType(); !t.IsExactType(cel.BoolType) && !t.IsExactType(cel.DynType) {
		return nil, fmt.Errorf("the expression is a %s, not a bool", t)
	}
	return e.Program(ast, cel.CostLimit(1_000_000))
}

// ValidateGates compiles every CEL gate of gates, at path ("spec.gates"), returning the first
// error with its field path.
func ValidateGates(path string, gates []v1alpha1.Gate) error {
	for i := range gates {
		if g := gates[i].CEL; g != nil {
			if _, err := Compile(g.Expression); err != nil {
				return fmt.Errorf("%s[%d].cel.expression: %w", path, i, err)
			}
		}
	}
	return nil
}

// Validate compiles every CEL gate of spec, returning the first error with its field path.
func Validate(spec *v1alpha1.NodeOperationSpec) error {
	check := ValidateGates
	if err := check("spec.gates", spec.Gates); err != nil {
		return err
	}
	if spec.Custom != nil {
		for i := range spec.Custom.Groups {
			if err := check(fmt.Sprintf("spec.custom.groups[%d].gates", i), spec.Custom.Groups[i].Gates); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *Checker) program(expr string) (cel.Program, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.progs[expr]; ok {
		return p, nil
	}
	p, err := Compile(expr)
	if err != nil {
		return nil, err
	}
	if c.progs == nil {
		c.progs = map[string]cel.Program{}
	}
	c.progs[expr] = p
	return p, nil
}

func (c *Checker) cel(ctx context.Context, g *v1alpha1.CELGate) Result {
	prog, err := c.program(g.Expression)
	if err != nil {
		return hold("cannot compile the expression: %v", err)
	}
	gv, err := schema.ParseGroupVersion(g.APIVersion)
	if err != nil {
		return hold("apiVersion %q: %v", g.APIVersion, err)
	}
	var objs []unstructured.Unstructured
	what := fmt.Sprintf("%s %s", g.Kind, objName(g.Namespace, g.Name))
	if g.Name != "" {
		u := unstructured.Unstructured{}
		u.SetGroupVersionKind(gv.WithKind(g.Kind))
		if err := c.Reader.Get(ctx, client.ObjectKey{Namespace: g.Namespace, Name: g.Name}, &u); err != nil {
			return hold("cannot read %s: %v", what, err)
		}
		objs = append(objs, u)
	} else {
		sel, err := metav1.LabelSelectorAsSelector(g.Selector)
		if err != nil {
			return hold("selector: %v", err)
		}
		what = fmt.Sprintf("%s matching %s", g.Kind, sel)
		list := unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gv.WithKind(g.Kind + "List"))
		if err := c.Reader.List(ctx, &list, client.InNamespace(g.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
			return hold("cannot list %s: %v", what, err)
		}
		if len(list.Items) == 0 {
			return hold("no %s", what)
		}
		objs = list.Items
	}
	for i := range objs {
		out, _, err := prog.ContextEval(ctx, map[string]any{"self": objs[i].Object})
		name := fmt.Sprintf("%s %s", g.Kind, objName(objs[i].GetNamespace(), objs[i].GetName()))
		if err != nil {
			return hold("cannot evaluate the expression on %s: %v", name, err)
		}
		if b, ok := out.Value().(bool); !ok {
			return hold("the expression gave %v on %s, not a bool", out.Value(), name)
		} else if !b {
			return hold("the expression is false on %s", name)
		}
	}
	return Result{Passed: true, Message: fmt.Sprintf("the expression is true on %s", what)}
}

func objName(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// controlPlaneComponents are the mirror pods (kube-system/<component>-<node>) a control plane
// must have Ready. A component no control plane runs as a static pod (external etcd) is not checked.
var controlPlaneComponents = []string{"kube-apiserver", "etcd", "kube-scheduler"}

// clusterHealth is k0s-style readiness: the API server answers /readyz; every control plane's
// API server, etcd and scheduler mirror pods are Ready; the nodes just finished are Ready and so
// are their pods.
func (c *Checker) clusterHealth(ctx context.Context, finished []string) Result {
	if c.Readyz != nil {
		if err := c.Readyz(ctx); err != nil {
			return hold("the API server's /readyz: %v", err)
		}
	}
	var nodes corev1.NodeList
	if err := c.Cache.List(ctx, &nodes, client.HasLabels{"node-role.kubernetes.io/control-plane"}); err != nil {
		return hold("cannot list control-plane nodes: %v", err)
	}
	var pods corev1.PodList
	if err := c.Reader.List(ctx, &pods, client.InNamespace("kube-system")); err != nil {
		return hold("cannot list kube-system pods: %v", err)
	}
	byName := map[string]*corev1.Pod{}
	runs := map[string]bool{}
	for i := range pods.Items {
		p := &pods.Items[i]
		byName[p.Name] = p
		for _, comp := range controlPlaneComponents {
			if p.Name == comp+"-"+p.Spec.NodeName {
				runs[comp] = true
			}
		}
	}
	var bad []string
	for _, n := range nodes.Items {
		for _, comp := range controlPlaneComponents {
			if !runs[comp] {
				continue
			}
			name := comp + "-" + n.Name
			p, ok := byName[name]
			switch {
			case !ok:
				bad = append(bad, fmt.Sprintf("kube-system/%s is missing", name))
			case !podReady(p):
				bad = append(bad, fmt.Sprintf("kube-system/%s is not Ready", name))
			}
		}
	}
	for _, n := range finished {
		var node corev1.Node
		if err := c.Cache.Get(ctx, client.ObjectKey{Name: n}, &node); err != nil {
			return hold("cannot read node %s: %v", n, err)
		}
		if !nodeReady(&node) {
			bad = append(bad, fmt.Sprintf("node %s is not Ready", n))
			continue
		}
		var on corev1.PodList
		if err := c.Reader.List(ctx, &on, client.MatchingFields{"spec.nodeName": n}); err != nil {
			return hold("cannot list the pods of node %s: %v", n, err)
		}
		for i := range on.Items {
			p := &on.Items[i]
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || p.DeletionTimestamp != nil {
				continue
			}
			if !podReady(p) {
				bad = append(bad, fmt.Sprintf("pod %s/%s on node %s is not Ready", p.Namespace, p.Name, n))
			}
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return hold("%s", first(bad))
	}
	return Result{Passed: true, Message: fmt.Sprintf("%d control planes and %d finished nodes healthy", len(nodes.Items), len(finished))}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Describe is a gate in words, for plan and describe.
func Describe(g *v1alpha1.Gate) string {
	var what string
	switch {
	case g.CEL != nil:
		obj := objName(g.CEL.Namespace, g.CEL.Name)
		if g.CEL.Selector != nil {
			sel, _ := metav1.LabelSelectorAsSelector(g.CEL.Selector)
			obj = "each matching " + sel.String()
			if g.CEL.Namespace != "" {
				obj += " in " + g.CEL.Namespace
			}
		}
		what = fmt.Sprintf("cel on %s %s %s: %s", g.CEL.APIVersion, g.CEL.Kind, obj, g.CEL.Expression)
	case g.ClusterHealth != nil:
		what = "clusterHealth"
	case g.Prometheus != nil:
		what = fmt.Sprintf("prometheus %s: %s is empty", g.Prometheus.URL, g.Prometheus.Query)
	case g.Alertmanager != nil:
		what = fmt.Sprintf("alertmanager %s: no alert firing matching {%s}", g.Alertmanager.URL, strings.Join(g.Alertmanager.Matchers, ", "))
	case g.Command != nil:
		on := "the node about to start"
		if g.Command.Node != "" {
			on = "node " + g.Command.Node
		}
		what = fmt.Sprintf("command on %s exits 0: %s", on, firstLine(g.Command.Script))
	case g.Approval != nil:
		what = "approval"
	}
	timeout := "30m0s"
	if g.Timeout != nil {
		timeout = g.Timeout.Duration.String()
	}
	return fmt.Sprintf("%s: %s (timeout %s)", g.Name, what, timeout)
}

// NewChecker is the manager's Checker: objects and pods read past the cache (live), nodes from
// cache, HTTP with a timeout, and /readyz asked of the API server at cfg.
func NewChecker(cfg *rest.Config, live, cache client.Reader) (*Checker, error) {
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for /readyz: %w", err)
	}
	return &Checker{Reader: live, Cache: cache, HTTP: &http.Client{Timeout: 10 * time.Second},
		Readyz: func(ctx context.Context) error {
			return disco.RESTClient().Get().AbsPath("/readyz").Do(ctx).Error()
		}}, nil
}
