package objname

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// FuzzTaskName: every triple gives a valid DNS subdomain (at most 253 characters), every string a
// valid label value (at most 63), and triples that join alike with '-' still get distinct names.
func FuzzTaskName(f *testing.F) {
	f.Add("upgrade", "workers", "worker-1", uint8(0))
	f.Add("a-b", "c", "n", uint8(1))
	f.Add("op", "install-0123456789abcdef", strings.Repeat("n", 253), uint8(2))
	f.Add("p", "g", "x-0123456789abcdef", uint8(3))
	f.Add("", "", "", uint8(0))
	f.Add("Op", "G_1", "Worker.1.", uint8(4))
	f.Fuzz(func(t *testing.T, owner, group, node string, cut uint8) {
		name := TaskName(owner, group, node)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Fatalf("TaskName(%q, %q, %q) = %q: %v", owner, group, node, name, errs)
		}
		if again := TaskName(owner, group, node); again != name {
			t.Fatalf("not deterministic: %q then %q", name, again)
		}
		for _, s := range []string{owner, group, node, name} {
			if v := LabelValue(s); len(validation.IsValidLabelValue(v)) > 0 {
				t.Fatalf("LabelValue(%q) = %q is not a label value", s, v)
			}
		}
		// Split the same join at two other dashes: a different triple must get a different name.
		join := owner + "-" + group + "-" + node
		var dashes []int
		for i := range len(join) {
			if join[i] == '-' {
				dashes = append(dashes, i)
			}
		}
		n := len(dashes)
		if n < 2 {
			return
		}
		i := int(cut) % n
		j := (i + 1 + int(cut)/n%(n-1)) % n
		if i > j {
			i, j = j, i
		}
		if i == j {
			return
		}
		o2, g2, n2 := join[:dashes[i]], join[dashes[i]+1:dashes[j]], join[dashes[j]+1:]
		if o2 == owner && g2 == group && n2 == node {
			return
		}
		if other := TaskName(o2, g2, n2); other == name {
			t.Fatalf("(%q, %q, %q) and (%q, %q, %q) share the name %q", owner, group, node, o2, g2, n2, name)
		}
		if a, b := LabelValue(owner), LabelValue(o2); owner != o2 && a == b {
			t.Fatalf("LabelValue(%q) == LabelValue(%q) == %q", owner, o2, a)
		}
	})
}
