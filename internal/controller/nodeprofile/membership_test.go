package nodeprofile

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func TestMembership(t *testing.T) {
	kwasm := &v1alpha1.ProfileTrigger{Annotation: "kwasm.sh/kwasm-node=true"}
	workers := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "node-role.kubernetes.io/control-plane", Operator: metav1.LabelSelectorOpDoesNotExist},
	}}
	cp := map[string]string{"node-role.kubernetes.io/control-plane": ""}
	tests := []struct {
		name        string
		spec        v1alpha1.NodeProfileSpec
		labels      map[string]string
		annotations map[string]string
		want        bool
	}{
		{name: "annotated", spec: v1alpha1.NodeProfileSpec{Trigger: kwasm}, annotations: map[string]string{"kwasm.sh/kwasm-node": "true"}, want: true},
		{name: "not annotated", spec: v1alpha1.NodeProfileSpec{Trigger: kwasm}, want: false},
		{name: "annotation with another value", spec: v1alpha1.NodeProfileSpec{Trigger: kwasm}, annotations: map[string]string{"kwasm.sh/kwasm-node": "false"}, want: false},
		{name: "trigger as a label does not count", spec: v1alpha1.NodeProfileSpec{Trigger: kwasm}, labels: map[string]string{"kwasm.sh/kwasm-node": "true"}, want: false},
		{name: "empty value matches an empty annotation", spec: v1alpha1.NodeProfileSpec{Trigger: &v1alpha1.ProfileTrigger{Annotation: "example.com/wasm="}}, annotations: map[string]string{"example.com/wasm": ""}, want: true},
		{name: "empty value needs the annotation", spec: v1alpha1.NodeProfileSpec{Trigger: &v1alpha1.ProfileTrigger{Annotation: "example.com/wasm="}}, want: false},
		{name: "autoProvision takes every node", spec: v1alpha1.NodeProfileSpec{AutoProvision: true}, want: true},
		{name: "autoProvision within the selector", spec: v1alpha1.NodeProfileSpec{AutoProvision: true, NodeSelector: workers}, labels: cp, want: false},
		{name: "annotated but outside the selector", spec: v1alpha1.NodeProfileSpec{Trigger: kwasm, NodeSelector: workers}, labels: cp, annotations: map[string]string{"kwasm.sh/kwasm-node": "true"}, want: false},
		{name: "annotated inside the selector", spec: v1alpha1.NodeProfileSpec{Trigger: kwasm, NodeSelector: workers}, labels: map[string]string{"x": "y"}, annotations: map[string]string{"kwasm.sh/kwasm-node": "true"}, want: true},
		{name: "empty selector selects all", spec: v1alpha1.NodeProfileSpec{AutoProvision: true, NodeSelector: &metav1.LabelSelector{}}, want: true},
		{name: "matchLabels", spec: v1alpha1.NodeProfileSpec{AutoProvision: true, NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "wasm"}}}, labels: map[string]string{"pool": "wasm"}, want: true},
		{name: "selectorOnly: an annotation outside the selector does not count", spec: v1alpha1.NodeProfileSpec{SelectorOnly: true, AutoProvision: true, Trigger: kwasm,
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"node-restriction.kubernetes.io/wasm": "true"}}}, annotations: map[string]string{"kwasm.sh/kwasm-node": "true"}, want: false},
		{name: "selectorOnly: the selector alone", spec: v1alpha1.NodeProfileSpec{SelectorOnly: true, Trigger: kwasm,
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"node-restriction.kubernetes.io/wasm": "true"}}}, labels: map[string]string{"node-restriction.kubernetes.io/wasm": "true"}, want: true},
		{name: "neither trigger nor autoProvision", spec: v1alpha1.NodeProfileSpec{}, annotations: map[string]string{"kwasm.sh/kwasm-node": "true"}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := NewMembership(&tt.spec)
			if err != nil {
				t.Fatalf("NewMembership: %v", err)
			}
			if got := m.Contains(tt.labels, tt.annotations); got != tt.want {
				t.Fatalf("Contains = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestMembershipInvalid(t *testing.T) {
	for name, spec := range map[string]v1alpha1.NodeProfileSpec{
		"bad operator": {AutoProvision: true, NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}},
		"no equals":    {Trigger: &v1alpha1.ProfileTrigger{Annotation: "kwasm.sh/kwasm-node"}},
		"empty key":    {Trigger: &v1alpha1.ProfileTrigger{Annotation: "=true"}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := NewMembership(&spec); err == nil {
				t.Fatal("NewMembership accepted an invalid spec")
			}
		})
	}
}

func TestSpecHash(t *testing.T) {
	base := v1alpha1.NodeProfileSpec{
		Trigger:        &v1alpha1.ProfileTrigger{Annotation: "kwasm.sh/kwasm-node=true"},
		Install:        []v1alpha1.Command{{InstallFile: &v1alpha1.InstallFileCommand{URL: "https://x/a", SHA256: "aa", Path: "/usr/local/bin/a"}}},
		Uninstall:      []v1alpha1.Command{{InstallFile: &v1alpha1.InstallFileCommand{Path: "/usr/local/bin/a", Remove: true}}},
		RuntimeClasses: []v1alpha1.RuntimeClassSpec{{Name: "wasmedge", Handler: "wasmedge"}},
	}
	h := SpecHash(&base)
	if len(h) != hashLen {
		t.Fatalf("hash %q: want %d hex digits", h, hashLen)
	}
	if again := SpecHash(base.DeepCopy()); again != h {
		t.Fatalf("not deterministic: %s then %s", h, again)
	}
	same := map[string]func(*v1alpha1.NodeProfileSpec){
		"selector": func(s *v1alpha1.NodeProfileSpec) {
			s.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}
		},
		"trigger":        func(s *v1alpha1.NodeProfileSpec) { s.Trigger = nil; s.AutoProvision = true },
		"maxUnavailable": func(s *v1alpha1.NodeProfileSpec) { s.MaxUnavailable = nil },
	}
	for name, f := range same {
		s := base.DeepCopy()
		f(s)
		if got := SpecHash(s); got != h {
			t.Errorf("changing %s changed the hash: it would re-provision every node", name)
		}
	}
	differ := map[string]func(*v1alpha1.NodeProfileSpec){
		"install sha256":  func(s *v1alpha1.NodeProfileSpec) { s.Install[0].InstallFile.SHA256 = "bb" },
		"uninstall":       func(s *v1alpha1.NodeProfileSpec) { s.Uninstall = nil },
		"runtime handler": func(s *v1alpha1.NodeProfileSpec) { s.RuntimeClasses[0].Handler = "other" },
		"command order": func(s *v1alpha1.NodeProfileSpec) {
			s.Install = append(s.Install, v1alpha1.Command{RestartService: &v1alpha1.RestartServiceCommand{Name: "containerd"}})
		},
	}
	for name, f := range differ {
		s := base.DeepCopy()
		f(s)
		if got := SpecHash(s); got == h {
			t.Errorf("changing %s kept the hash: nodes would not be re-provisioned", name)
		}
	}
}
