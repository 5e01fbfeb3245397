package plan

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// ResolvedGroup is a group with the nodes it applies to now.
type ResolvedGroup struct {
	v1alpha1.Group
	// Nodes are the names of the group's nodes, sorted.
	Nodes []string
	// MaxUnavailable is the group's limit in nodes, resolved against len(Nodes): at least 1.
	MaxUnavailable int
}

// Resolve expands spec and gives each group its nodes: those matching both the operation's and the
// group's nodeSelector, sorted by name, then narrowed by the group's nodeFilter.
func Resolve(spec *v1alpha1.NodeOperationSpec, nodes []corev1.Node) ([]ResolvedGroup, error) {
	groups, err := Expand(spec)
	if err != nil {
		return nil, err
	}
	opSel, err := selector(spec.NodeSelector)
	if err != nil {
		return nil, fmt.Errorf("spec.nodeSelector: %w", err)
	}
	out := make([]ResolvedGroup, 0, len(groups))
	for _, g := range groups {
		groupSel, err := selector(g.NodeSelector)
		if err != nil {
			return nil, fmt.Errorf("group %q nodeSelector: %w", g.Name, err)
		}
		var names []string
		for i := range nodes {
			l := labels.Set(nodes[i].Labels)
			if opSel.Matches(l) && groupSel.Matches(l) {
				names = append(names, nodes[i].Name)
			}
		}
		names = Filter(names, g.NodeFilter)
		mu := g.MaxUnavailable
		if mu == nil {
			mu = spec.MaxUnavailable
		}
		limit, err := MaxUnavailable(mu, len(names))
		if err != nil {
			return nil, fmt.Errorf("group %q maxUnavailable: %w", g.Name, err)
		}
		out = append(out, ResolvedGroup{Group: g, Nodes: names, MaxUnavailable: limit})
	}
	if len(out) > 0 && out[0].Name == GroupPreflight {
		// The preflight checks every node some later group selects, all at once: it changes nothing.
		seen := map[string]bool{}
		var union []string
		for _, g := range out[1:] {
			for _, n := range g.Nodes {
				if !seen[n] {
					seen[n] = true
					union = append(union, n)
				}
			}
		}
		sort.Strings(union)
		out[0].Nodes, out[0].MaxUnavailable = union, max(1, len(union))
	}
	return out, nil
}

// Filter sorts names and applies filter: All keeps them all, Head the first, Tail all but the first.
func Filter(names []string, filter v1alpha1.NodeFilter) []string {
	sorted := append([]string(nil), names...)
	sort.Strings(sorted)
	switch filter {
	case v1alpha1.NodeFilterHead:
		if len(sorted) > 1 {
			return sorted[:1]
		}
	case v1alpha1.NodeFilterTail:
		if len(sorted) == 0 {
			return sorted
		}
		return sorted[1:]
	}
	return sorted
}

// MaxUnavailable resolves an integer or percentage against total nodes: percentages round down,
// and the result is at least 1 (nil means 1).
func MaxUnavailable(v *intstr.IntOrString, total int) (int, error) {
	if v == nil {
		return 1, nil
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(v, total, false)
	if err != nil {
		return 0, fmt.Errorf("resolve %q against %d nodes: %w", v.String(), total, err)
	}
	return max(n, 1), nil
}

// NodeReady reports whether the node's Ready condition is True; a node that has not reported is not ready.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func selector(s *metav1.LabelSelector) (labels.Selector, error) {
	if s == nil {
		return labels.Everything(), nil
	}
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return nil, fmt.Errorf("invalid label selector: %w", err)
	}
	return sel, nil
}
