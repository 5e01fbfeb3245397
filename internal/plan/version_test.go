package plan

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckUpgradeVersion(t *testing.T) {
	tests := []struct {
		current, requested string
		refused, bad       bool
	}{
		{current: "v1.36.3", requested: "v1.37.2"},
		{current: "v1.37.0", requested: "v1.37.2"},
		{current: "v1.37.2", requested: "v1.37.2"},
		{current: "v1.35.4", requested: "v1.37.2", refused: true},
		{current: "v1.37.2", requested: "v1.36.3", refused: true},
		{current: "v1.37.2", requested: "v1.37.1", refused: true},
		{current: "v1.37.2", requested: "v2.0.0", refused: true},
		{current: "garbage", requested: "v1.37.2", bad: true},
		{current: "v1.37.2", requested: "1.x", bad: true},
	}
	for _, tt := range tests {
		err := CheckUpgradeVersion(tt.current, tt.requested)
		var skew *VersionSkewError
		switch {
		case tt.refused:
			if !errors.As(err, &skew) {
				t.Errorf("%s -> %s: got %v, want a VersionSkewError", tt.current, tt.requested, err)
				continue
			}
			if skew.Reason() != ReasonUnsupportedVersionSkew || !strings.Contains(err.Error(), tt.current) || !strings.Contains(err.Error(), tt.requested) {
				t.Errorf("%s -> %s: message %q must name both versions", tt.current, tt.requested, err)
			}
		case tt.bad:
			if err == nil || errors.As(err, &skew) {
				t.Errorf("%s -> %s: got %v, want a parse error", tt.current, tt.requested, err)
			}
		default:
			if err != nil {
				t.Errorf("%s -> %s: %v", tt.current, tt.requested, err)
			}
		}
	}
}

func TestKubeadmConfigVersion(t *testing.T) {
	got, err := KubeadmConfigVersion("apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: v1.36.3\nnetworking:\n  podSubnet: 10.244.0.0/16\n")
	if err != nil || got != "v1.36.3" {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := KubeadmConfigVersion("kind: ClusterConfiguration\n"); err == nil {
		t.Fatal("a configuration without kubernetesVersion was accepted")
	}
	if _, err := KubeadmConfigVersion(":\n\t- nope"); err == nil {
		t.Fatal("invalid YAML was accepted")
	}
}
