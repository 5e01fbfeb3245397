package nodeprofile

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func TestBuildRuntimeClass(t *testing.T) {
	p := testProfile()
	tol := []corev1.Toleration{{Key: "wasm", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	rc := BuildRuntimeClass(p, v1alpha1.RuntimeClassSpec{Name: "wasmedge", Handler: "wasmedge", Tolerations: tol})
	if rc.Name != "wasmedge" || rc.Handler != "wasmedge" {
		t.Errorf("rc = %s handler %s", rc.Name, rc.Handler)
	}
	if got := rc.Scheduling.NodeSelector; len(got) != 1 || got["nodeops.io/profile.wasm"] != "provisioned" {
		t.Errorf("nodeSelector = %v", got)
	}
	if len(rc.Scheduling.Tolerations) != 1 || rc.Scheduling.Tolerations[0].Key != "wasm" {
		t.Errorf("tolerations = %v", rc.Scheduling.Tolerations)
	}
	if ref := metav1.GetControllerOf(rc); ref == nil || ref.UID != p.UID {
		t.Errorf("not owned by the profile: %v", ref)
	}
}

func TestPlanRuntimeClasses(t *testing.T) {
	p := testProfile()
	p.Spec.RuntimeClasses = []v1alpha1.RuntimeClassSpec{
		{Name: "keep", Handler: "keep"},
		{Name: "new", Handler: "new"},
		{Name: "handler", Handler: "h2"},
		{Name: "tolerate", Handler: "t", Tolerations: []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists}}},
		{Name: "foreign", Handler: "f"},
	}
	owned := func(name, handler string) nodev1.RuntimeClass {
		return *BuildRuntimeClass(p, v1alpha1.RuntimeClassSpec{Name: name, Handler: handler})
	}
	foreign := nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "foreign"}, Handler: "f"}
	unrelated := nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "runc"}, Handler: "runc"}
	existing := []nodev1.RuntimeClass{owned("keep", "keep"), owned("handler", "h1"), owned("tolerate", "t"), owned("stale", "s"), foreign, unrelated}

	ch := PlanRuntimeClasses(p, existing, false)
	names := func(rcs []*nodev1.RuntimeClass) []string {
		var out []string
		for _, rc := range rcs {
			out = append(out, rc.Name)
		}
		return out
	}
	check := func(what string, got []string, want ...string) {
		t.Helper()
		if len(got) != len(want) {
			t.Errorf("%s = %v, want %v", what, got, want)
			return
		}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("%s = %v, want %v", what, got, want)
			}
		}
	}
	check("create", names(ch.Create), "new")
	check("recreate", names(ch.Recreate), "handler")
	check("update", names(ch.Update), "tolerate")
	check("delete", ch.Delete, "stale")
	if len(ch.Conflicts) != 1 {
		t.Errorf("conflicts = %v", ch.Conflicts)
	}

	gone := PlanRuntimeClasses(p, existing, true)
	check("delete while deleting", gone.Delete, "handler", "keep", "stale", "tolerate")
	if len(gone.Create)+len(gone.Update)+len(gone.Recreate)+len(gone.Conflicts) != 0 {
		t.Errorf("a deleted profile creates nothing: %+v", gone)
	}
}
