package cli

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
)

// commandText says what a command does on the node, in one line: its kind's own description (every
// kind has one, the API's reflection test makes sure), then the options every command has.
func commandText(c *nodeopsv1.Command) string {
	s := "no command kind set"
	if k := c.Spec(); k != nil {
		s = k.Description()
	}
	if c.Retries > 0 {
		s += fmt.Sprintf(" [retries %d]", c.Retries)
	}
	s += durationText(" [timeout ", c.Timeout)
	if c.Timeout != nil {
		s += "]"
	}
	return s
}

func durationText(prefix string, d *metav1.Duration) string {
	if d == nil {
		return ""
	}
	return prefix + d.Duration.String()
}
