package plan

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/yaml"
)

// ReasonUnsupportedVersionSkew is the reason an upgrade is refused by the version policy.
const ReasonUnsupportedVersionSkew = "UnsupportedVersionSkew"

// VersionSkewError says why an upgrade from Current to Requested is refused.
type VersionSkewError struct {
	Current, Requested string
	Why                string
}

func (e *VersionSkewError) Error() string {
	return fmt.Sprintf("cannot upgrade the cluster from %s to %s: %s", e.Current, e.Requested, e.Why)
}

// Reason is the condition reason for the refusal.
func (e *VersionSkewError) Reason() string { return ReasonUnsupportedVersionSkew }

// CheckUpgradeVersion applies kubeadm's version policy: the requested version has the current
// major version and either the current minor (a patch upgrade, never lower) or the next one.
// It returns a *VersionSkewError when the upgrade is refused, another error when a version does not parse.
func CheckUpgradeVersion(current, requested string) error {
	cur, err := version.ParseSemantic(current)
	if err != nil {
		return fmt.Errorf("parse current version %q: %w", current, err)
	}
	req, err := version.ParseSemantic(requested)
	if err != nil {
		return fmt.Errorf("parse requested version %q: %w", requested, err)
	}
	refuse := func(why string, args ...any) error {
		return &VersionSkewError{Current: current, Requested: requested, Why: fmt.Sprintf(why, args...)}
	}
	switch {
	case req.Major() != cur.Major():
		return refuse("the major version cannot change")
	case req.LessThan(cur):
		return refuse("downgrades are not supported")
	case req.Minor() > cur.Minor()+1:
		return refuse("it skips minor version %d.%d; upgrade one minor version at a time", cur.Major(), cur.Minor()+1)
	}
	return nil
}

// KubeadmConfigVersion reads kubernetesVersion from the ClusterConfiguration document kept in
// kube-system/kubeadm-config (data key "ClusterConfiguration").
func KubeadmConfigVersion(clusterConfiguration string) (string, error) {
	var cfg struct {
		KubernetesVersion string `json:"kubernetesVersion"`
	}
	if err := yaml.Unmarshal([]byte(clusterConfiguration), &cfg); err != nil {
		return "", fmt.Errorf("parse ClusterConfiguration: %w", err)
	}
	if cfg.KubernetesVersion == "" {
		return "", fmt.Errorf("ClusterConfiguration has no kubernetesVersion")
	}
	return cfg.KubernetesVersion, nil
}
