package nodeprofile

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Membership decides which nodes are in a profile: those matching its nodeSelector that either
// carry the trigger annotation or, with autoProvision, all of them.
type Membership struct {
	selector labels.Selector
	auto     bool
	key      string
	value    string
}

// NewMembership parses the profile's selector and trigger.
func NewMembership(spec *v1alpha1.NodeProfileSpec) (Membership, error) {
	// selectorOnly: the selector alone counts, whatever trigger says (admission refuses both).
	m := Membership{selector: labels.Everything(), auto: spec.AutoProvision || spec.SelectorOnly}
	if spec.NodeSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(spec.NodeSelector)
		if err != nil {
			return Membership{}, fmt.Errorf("spec.nodeSelector: %w", err)
		}
		m.selector = sel
	}
	if spec.Trigger != nil && !spec.SelectorOnly {
		key, value, ok := strings.Cut(spec.Trigger.Annotation, "=")
		if !ok || key == "" {
			return Membership{}, fmt.Errorf("spec.trigger.annotation %q: want key=value", spec.Trigger.Annotation)
		}
		m.key, m.value = key, value
	}
	return m, nil
}

// Contains reports whether a node with these labels and annotations is in the profile.
func (m Membership) Contains(nodeLabels, annotations map[string]string) bool {
	if !m.selector.Matches(labels.Set(nodeLabels)) {
		return false
	}
	if m.auto {
		return true
	}
	if m.key == "" {
		return false
	}
	v, ok := annotations[m.key]
	return ok && v == m.value
}

// hashLen hex digits of sha256 name a spec: short enough for task names, enough to tell edits apart.
const hashLen = 10

// SpecHash identifies what a provisioned node has: the install and uninstall commands and the
// RuntimeClasses. Selector, trigger and maxUnavailable choose nodes and pace the work, so changing
// them re-provisions nothing.
func SpecHash(spec *v1alpha1.NodeProfileSpec) string {
	// encoding/json writes struct fields in declaration order and sorts map keys: deterministic.
	b, err := json.Marshal(struct {
		Install        []v1alpha1.Command          `json:"install"`
		Uninstall      []v1alpha1.Command          `json:"uninstall"`
		RuntimeClasses []v1alpha1.RuntimeClassSpec `json:"runtimeClasses"`
	}{spec.Install, spec.Uninstall, spec.RuntimeClasses})
	if err != nil {
		// Commands hold only strings, numbers and durations; marshalling cannot fail. Hash the
		// error text rather than panic so the controller still converges on something stable.
		b = []byte(err.Error())
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:hashLen]
}

// ProvisionedLabel is the node label a provisioned node carries, with value "provisioned".
func ProvisionedLabel(profile string) string { return v1alpha1.ProfileLabelPrefix + profile }

// HashAnnotation is the node annotation holding the spec hash the node was provisioned with.
func HashAnnotation(profile string) string { return v1alpha1.ProfileHashAnnotationPrefix + profile }
