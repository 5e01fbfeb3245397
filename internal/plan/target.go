package plan

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/version"
)

// UpgradeSteps is the chain of versions, one kubeadm upgrade each, from current to target: empty
// when current is target, [target] for a patch or the next minor, and for a target further ahead
// each intermediate minor's version taken from path (versions of minors at or below current's are
// passed already and ignored). nodeops does not guess an intermediate patch: vX.Y.0 is rarely what
// an operator wants, and the latest patch of a minor is known only to the internet, so a minor that
// path does not name is refused. Every step obeys CheckUpgradeVersion; a refusal is a
// *VersionSkewError naming current and target, a version that does not parse another error.
func UpgradeSteps(current, target string, path []string) ([]string, error) {
	cur, err := version.ParseSemantic(current)
	if err != nil {
		return nil, fmt.Errorf("parse current version %q: %w", current, err)
	}
	tgt, err := version.ParseSemantic(target)
	if err != nil {
		return nil, fmt.Errorf("parse target version %q: %w", target, err)
	}
	if cur.EqualTo(tgt) {
		return nil, nil
	}
	if tgt.Major() != cur.Major() || tgt.LessThan(cur) {
		return nil, CheckUpgradeVersion(current, target)
	}
	via := map[uint]string{}
	for _, p := range path {
		v, err := version.ParseSemantic(p)
		if err != nil {
			return nil, fmt.Errorf("parse spec.upgrade.path version %q: %w", p, err)
		}
		if v.Major() == cur.Major() && v.Minor() > cur.Minor() && v.Minor() < tgt.Minor() {
			if other, ok := via[v.Minor()]; ok && other != p {
				return nil, &VersionSkewError{Current: current, Requested: target, Why: fmt.Sprintf("spec.upgrade.path names two versions of minor %d.%d: %s and %s", v.Major(), v.Minor(), other, p)}
			}
			via[v.Minor()] = p
		}
	}
	var steps []string
	from := current
	for minor := cur.Minor() + 1; minor < tgt.Minor(); minor++ {
		step, ok := via[minor]
		if !ok {
			return nil, &VersionSkewError{Current: current, Requested: target, Why: fmt.Sprintf(
				"kubeadm upgrades one minor version at a time and no v%d.%d version is named: add the v%d.%d patch to go through to spec.upgrade.path", cur.Major(), minor, cur.Major(), minor)}
		}
		steps = append(steps, step)
		from = step
	}
	if err := CheckUpgradeVersion(from, target); err != nil {
		return nil, err
	}
	return append(steps, target), nil
}
