package agent

import (
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// TestSchemeHasEveryKindTheAgentWrites: the agent's client is built with Scheme, and a kind it lacks
// fails at run time only ("no kind is registered"): the certificate authority server's TokenReview
// did, refusing every copyCertificateAuthorities of a rotation on nodeops-local.
func TestSchemeHasEveryKindTheAgentWrites(t *testing.T) {
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range []runtime.Object{&authenticationv1.TokenReview{}, &corev1.Node{}, &corev1.Pod{}, &corev1.ConfigMap{},
		&coordinationv1.Lease{}, &v1alpha1.NodeTask{}} {
		if _, _, err := s.ObjectKinds(obj); err != nil {
			t.Errorf("%T: %v", obj, err)
		}
	}
}
