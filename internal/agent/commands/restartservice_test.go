package commands

import "testing"

// TestOnlyANewMinorKubeletCountsAsRenamingStaticPods: the old runs of the static pods are stopped
// right after a kubelet restart only when the kubelet moves to another minor (or major) version,
// which names every static pod anew; a patch release or the same version keeps the UIDs, and a
// version that does not parse is never taken for a new one.
func TestOnlyANewMinorKubeletCountsAsRenamingStaticPods(t *testing.T) {
	for _, c := range []struct {
		from, to string
		want     bool
	}{
		{"v1.36.3", "v1.37.2", true},
		{"v1.37.2", "v2.0.0", true},
		{"v1.37.1", "v1.37.2", false},
		{"v1.37.2", "v1.37.2", false},
		{"", "v1.37.2", false},
		{"v1.36.3", "unknown", false},
	} {
		if got := newMinor(c.from, c.to); got != c.want {
			t.Errorf("newMinor(%q, %q) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
}
