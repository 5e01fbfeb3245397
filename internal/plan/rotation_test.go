package plan

import (
	"reflect"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// The rotation expands into its four phases, in order, each a set of groups: control planes one at a
// time (maxUnavailable 1), workers under the operation's maxUnavailable (nil: the operation's).
func TestExpandRotation(t *testing.T) {
	type group struct {
		name     string
		workers  bool
		filter   v1alpha1.NodeFilter
		commands []string
	}
	want := []group{
		{GroupCAPrepareGenerate, false, v1alpha1.NodeFilterHead, []string{"generateCertificateAuthorities"}},
		{GroupCAPrepareCopy, false, v1alpha1.NodeFilterTail, []string{"copyCertificateAuthorities"}},
		{GroupCATrustBothControlPlanes, false, v1alpha1.NodeFilterAll, []string{"trustCertificateAuthorities", "restartStaticPods", "restartService", "waitNodeReady"}},
		{GroupCATrustBothCluster, false, v1alpha1.NodeFilterHead, []string{"publishCertificateAuthorities"}},
		{GroupCATrustBothWorkers, true, v1alpha1.NodeFilterAll, []string{"trustCertificateAuthorities", "restartService", "waitNodeReady"}},
		{GroupCAReissueControlPlanes, false, v1alpha1.NodeFilterAll, []string{"reissueCertificates", "restartStaticPods", "restartService", "waitNodeReady"}},
		{GroupCAReissueWorkers, true, v1alpha1.NodeFilterAll, []string{"reissueCertificates", "restartService", "waitNodeReady"}},
		{GroupCACompleteControlPlanes, false, v1alpha1.NodeFilterAll, []string{"trustCertificateAuthorities", "restartStaticPods", "restartService", "waitNodeReady"}},
		{GroupCACompleteWorkers, true, v1alpha1.NodeFilterAll, []string{"trustCertificateAuthorities", "restartService", "waitNodeReady"}},
		{GroupCACompleteCluster, false, v1alpha1.NodeFilterHead, []string{"publishCertificateAuthorities"}},
	}
	spec := v1alpha1.NodeOperationSpec{RotateCertificateAuthorities: &v1alpha1.RotateCertificateAuthoritiesOperation{
		Authorities: []string{"cluster", "etcd"}, ServiceAccountKey: true}}
	groups, err := Expand(&spec)
	if err != nil {
		t.Fatal(err)
	}
	// The preflight comes first: the kubelet restarts need a known init system.
	if groups[0].Name != GroupPreflight {
		t.Fatalf("first group %s, want the preflight", groups[0].Name)
	}
	groups = groups[1:]
	if len(groups) != len(want) {
		t.Fatalf("%d groups, want %d", len(groups), len(want))
	}
	for i, w := range want {
		g := groups[i]
		if g.Name != w.name || g.NodeFilter != w.filter || !reflect.DeepEqual(kinds(g.Commands), w.commands) {
			t.Errorf("group %d: %s %s %v, want %s %s %v", i, g.Name, g.NodeFilter, kinds(g.Commands), w.name, w.filter, w.commands)
		}
		if w.workers {
			if !reflect.DeepEqual(g.NodeSelector, workers()) || g.MaxUnavailable != nil {
				t.Errorf("group %s: selector %v maxUnavailable %v, want the workers under the operation's maxUnavailable", g.Name, g.NodeSelector, g.MaxUnavailable)
			}
		} else if !reflect.DeepEqual(g.NodeSelector, controlPlanes()) || g.MaxUnavailable == nil || g.MaxUnavailable.IntValue() != 1 {
			t.Errorf("group %s: selector %v maxUnavailable %v, want control planes one at a time", g.Name, g.NodeSelector, g.MaxUnavailable)
		}
		// Every command carries the operation's authorities and service-account choice.
		for _, c := range g.Commands {
			var auth []string
			sa := true
			switch {
			case c.GenerateCertificateAuthorities != nil:
				auth, sa = c.GenerateCertificateAuthorities.Authorities, c.GenerateCertificateAuthorities.ServiceAccountKey
			case c.CopyCertificateAuthorities != nil:
				auth, sa = c.CopyCertificateAuthorities.Authorities, c.CopyCertificateAuthorities.ServiceAccountKey
			case c.TrustCertificateAuthorities != nil:
				auth, sa = c.TrustCertificateAuthorities.Authorities, c.TrustCertificateAuthorities.ServiceAccountKey
			case c.ReissueCertificates != nil:
				auth, sa = c.ReissueCertificates.Authorities, c.ReissueCertificates.ServiceAccountKey
			case c.PublishCertificateAuthorities != nil:
				auth = c.PublishCertificateAuthorities.Authorities
			default:
				continue
			}
			if !reflect.DeepEqual(auth, []string{"cluster", "etcd"}) || !sa {
				t.Errorf("group %s %s: authorities %v serviceAccountKey %v", g.Name, c.Kind(), auth, sa)
			}
		}
	}
	// trust-both trusts old and new; complete only the new.
	if got := groups[2].Commands[0].TrustCertificateAuthorities.Trust; got != v1alpha1.TrustOldAndNew {
		t.Errorf("trust-both trusts %s", got)
	}
	if got := groups[7].Commands[0].TrustCertificateAuthorities.Trust; got != v1alpha1.TrustNewOnly {
		t.Errorf("complete trusts %s", got)
	}
}

// completion Manual (the default) holds phase complete at an approval gate; Auto does not.
func TestExpandRotationCompletion(t *testing.T) {
	for _, tt := range []struct {
		completion v1alpha1.RotationCompletion
		gated      bool
	}{{"", true}, {v1alpha1.CompletionManual, true}, {v1alpha1.CompletionAuto, false}} {
		groups := expandRotation(&v1alpha1.RotateCertificateAuthoritiesOperation{Completion: tt.completion})
		for _, g := range groups {
			gated := len(g.Gates) == 1 && g.Gates[0].Name == GateCompleteRotation && g.Gates[0].Approval != nil
			if g.Name == GroupCACompleteControlPlanes {
				if gated != tt.gated {
					t.Errorf("completion %q: complete gated %v, want %v", tt.completion, gated, tt.gated)
				}
			} else if len(g.Gates) > 0 {
				t.Errorf("completion %q: group %s has gates %v", tt.completion, g.Name, g.Gates)
			}
		}
	}
}

// Each group has its own commands: changing one group's never changes another's.
func TestExpandRotationSharesNothing(t *testing.T) {
	groups := expandRotation(&v1alpha1.RotateCertificateAuthoritiesOperation{Authorities: []string{"etcd"}})
	groups[2].Commands[0].TrustCertificateAuthorities.Authorities[0] = "changed"
	if groups[4].Commands[0].TrustCertificateAuthorities.Authorities[0] != "etcd" {
		t.Fatal("two groups share a command's authorities")
	}
}

// Every group of a rotation belongs to one of its four phases, in the phases' order; no other
// group does.
func TestRotationPhaseOf(t *testing.T) {
	order := map[string]int{RotationPrepare: 1, RotationTrustBoth: 2, RotationReissue: 3, RotationComplete: 4}
	last := 0
	for _, g := range expandRotation(&v1alpha1.RotateCertificateAuthoritiesOperation{}) {
		n := order[RotationPhaseOf(g.Name)]
		if n == 0 || n < last {
			t.Errorf("group %s: phase %q after phase %d", g.Name, RotationPhaseOf(g.Name), last)
		}
		last = n
	}
	if last != 4 {
		t.Errorf("the last group is in phase %d, want complete", last)
	}
	if p := RotationPhaseOf(GroupFirstControlPlane); p != "" {
		t.Errorf("an upgrade's group is in rotation phase %q", p)
	}
}
