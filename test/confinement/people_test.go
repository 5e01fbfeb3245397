package confinement

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/config"
	"github.com/nodeops/nodeops/internal/testutil"
)

// TestPeopleRoles installs config/rbac/people.yaml, binds each role to a user and asks the API
// server's RBAC what each may do. Aggregation into view is the controller-manager's and is not
// run here; the labels are checked instead.
func TestPeopleRoles(t *testing.T) {
	ctx := context.Background()
	objs, err := config.Manifests(os.DirFS(filepath.Join("..", "..", "config", "rbac")), "people.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if err := admin.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		agg := ""
		for k := range o.GetLabels() {
			if strings.HasPrefix(k, "rbac.authorization.k8s.io/aggregate-to-") {
				agg += k + " "
			}
		}
		if want := map[string]string{"nodeops-viewer": "rbac.authorization.k8s.io/aggregate-to-view "}[o.GetName()]; o.GetKind() == "ClusterRole" && agg != want {
			t.Errorf("ClusterRole %s is aggregated by %q, want %q", o.GetName(), agg, want)
		}
		if o.GetKind() == "ClusterRole" {
			bind(t, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "test-" + o.GetName()},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: o.GetName()},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: o.GetName()}},
			})
		}
	}
	bind(t, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test-nodeops-viewer", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "nodeops-viewer"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "nodeops-viewer"}},
	})

	type check struct {
		user, verb, resource, sub, namespace string
		allowed                              bool
	}
	checks := []check{
		{"nodeops-viewer", "list", "nodeoperations", "", "", true},
		{"nodeops-viewer", "watch", "nodetasks", "", "", true},
		{"nodeops-viewer", "get", "pods", "log", ns, true},
		{"nodeops-viewer", "get", "pods", "log", "default", false},
		{"nodeops-viewer", "patch", "nodetasks", "", "", false},
		{"nodeops-viewer", "get", "clustertargets", "", "", true},
		{"nodeops-viewer", "get", "secrets", "", ns, false},
		{"nodeops-operator", "patch", "nodetasks", "", "", true},
		{"nodeops-operator", "patch", "nodeoperations", "", "", true},
		{"nodeops-operator", "update", "nodetasks", "status", "", false},
		{"nodeops-operator", "patch", "nodetasks", "status", "", false},
		{"nodeops-operator", "create", "nodeoperations", "", "", false},
		{"nodeops-operator", "patch", "nodeprofiles", "", "", false},
		{"nodeops-operator", "patch", "clustertargets", "", "", false},
		{"nodeops-admin", "create", "nodeoperations", "", "", true},
		{"nodeops-admin", "update", "nodeprofiles", "", "", true},
		{"nodeops-admin", "delete", "nodeoperations", "", "", true},
		{"nodeops-admin", "patch", "clustertargets", "", "", true},
		{"nodeops-admin", "create", "nodetasks", "", "", false},
		{"nodeops-admin", "delete", "nodetasks", "", "", false},
		{"nodeops-admin", "patch", "nodetasks", "status", "", false},
		{"nodeops-admin", "get", "secrets", "", ns, false},
	}
	for _, c := range checks {
		group := "nodeops.io"
		if c.resource == "pods" || c.resource == "secrets" {
			group = ""
		}
		what := fmt.Sprintf("%s: %s %s/%s in %q", c.user, c.verb, c.resource, c.sub, c.namespace)
		testutil.Eventually(t, 10*time.Second, what, func() error {
			r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{User: c.user, ResourceAttributes: &authorizationv1.ResourceAttributes{
					Group: group, Resource: c.resource, Subresource: c.sub, Verb: c.verb, Namespace: c.namespace}},
			}, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			if r.Status.Allowed != c.allowed {
				return fmt.Errorf("allowed %v, want %v", r.Status.Allowed, c.allowed)
			}
			return nil
		})
	}
}

func bind(t *testing.T, b client.Object) {
	t.Helper()
	if err := admin.Create(context.Background(), b); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}
