package clustertarget_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/clustertarget"
	"github.com/nodeops/nodeops/internal/testutil"
)

// A ClusterTarget's upgrade with a packageSource generates upgrades that install packages with it,
// from its repository; a binarySource beside a package manager, or a repository without one, is
// refused at admission, naming the field.
func TestUpgradeWithPackageSource(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.0")
	f.waitCondition(v1alpha1.ConditionUpToDate, metav1.ConditionTrue, clustertarget.ReasonUpToDate)
	repo := &v1alpha1.PackageRepository{Name: "kubernetes", URL: "https://pkgs.example/deb/", Trusted: true}
	f.edit(func(ct *v1alpha1.ClusterTarget) {
		ct.Spec.Upgrade.BinarySource = nil
		ct.Spec.Upgrade.PackageSource = "zypper"
		ct.Spec.Upgrade.PackageRepository = repo.DeepCopy()
		ct.Spec.KubernetesVersion = "v1.37.2"
	})
	if ct := f.target(); len(ct.Status.Conditions) > 0 {
		t.Logf("conditions after the edit: %+v", ct.Status.Conditions)
	}
	ops := f.waitOperations("cluster-upgrade-v1.37.2-1")
	u := ops[0].Spec.Upgrade
	if u == nil || u.PackageSource != "zypper" || u.PackageRepository == nil || u.PackageRepository.URL != repo.URL || u.BinarySource != nil {
		t.Fatalf("generated upgrade %+v", ops[0].Spec.Upgrade)
	}

	for _, tt := range []struct {
		name  string
		patch func(*v1alpha1.ClusterUpgrade)
		want  []string
	}{
		{"binarySource with apt", func(u *v1alpha1.ClusterUpgrade) {
			u.PackageSource, u.BinarySource = "apt", &v1alpha1.BinarySource{BaseURL: "https://binaries.example"}
		}, []string{"spec.upgrade.binarySource", "binarySource serves packageSource binaries only"}},
		{"repository with binaries", func(u *v1alpha1.ClusterUpgrade) {
			u.PackageSource, u.BinarySource, u.PackageRepository = "binaries", &v1alpha1.BinarySource{BaseURL: "https://binaries.example"}, repo.DeepCopy()
		}, []string{"spec.upgrade.packageRepository", "packageRepository needs packageSource apt, dnf, yum, zypper or auto"}},
		{"an unknown package manager", func(u *v1alpha1.ClusterUpgrade) { u.PackageSource = "pacman" }, []string{"spec.upgrade.packageSource", "pacman"}},
	} {
		// Retried on conflicts only: the controller writes status meanwhile.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			ct := f.target()
			tt.patch(&ct.Spec.Upgrade)
			return f.c.Update(f.ctx, ct)
		})
		if err == nil {
			t.Errorf("%s: admitted", tt.name)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v lacks %q", tt.name, err, w)
			}
		}
	}
}

// annotateDrift writes a drift reading into node's nodeops.io/drift, as its agent would.
func (f *fixture) annotateDrift(node string, r v1alpha1.DriftReading) {
	f.t.Helper()
	value := v1alpha1.EncodeDrift(r)
	f.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n corev1.Node
		if err := f.c.Get(f.ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[v1alpha1.AnnotationDrift] = value
		return f.c.Update(f.ctx, &n)
	}))
}

// The agents' drift readings show per node in status; a worker's report about control-plane
// components is dropped (only the manager's view of the node's role counts, as for certificates),
// its kubelet's kept; a reading that says the agent could not compare is shown as a problem, and
// drift generates no operation.
func TestDriftReadings(t *testing.T) {
	f := newFixture(t)
	f.reset("v1.37.2")
	apiserver := v1alpha1.ComponentDrift{Component: v1alpha1.DriftKubeAPIServer, Reason: "flag --audit-log-maxage=7, kubeadm's has none"}
	kubelet := v1alpha1.ComponentDrift{Component: v1alpha1.DriftKubelet, Reason: "maxPods=120, kubeadm's 110"}
	f.annotateDrift("w-1", v1alpha1.DriftReading{Components: []v1alpha1.ComponentDrift{apiserver, kubelet}})
	f.annotateDrift("cp-1", v1alpha1.DriftReading{Components: []v1alpha1.ComponentDrift{apiserver}})
	shows := func(what string, want string) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, what, func() error {
			ct := f.target()
			var got []string
			for _, d := range ct.Status.Drift {
				s := fmt.Sprintf("%s drifted=%t problem=%q", d.Node, d.Drifted, d.Problem)
				for _, c := range d.Components {
					s += " " + c.Component + ": " + c.Reason
				}
				got = append(got, s)
			}
			if g := strings.Join(got, " | ") + fmt.Sprintf(" (%d drifted)", ct.Status.DriftedNodes); g != want {
				return fmt.Errorf("status drift %s, want %s", g, want)
			}
			return nil
		})
	}
	shows("cp-1's and w-1's readings, w-1's control-plane part dropped",
		`cp-1 drifted=true problem="" kube-apiserver: flag --audit-log-maxage=7, kubeadm's has none | w-1 drifted=true problem="" kubelet: maxPods=120, kubeadm's 110 (2 drifted)`)

	f.annotateDrift("w-1", v1alpha1.DriftReading{Components: []v1alpha1.ComponentDrift{apiserver}})
	f.annotateDrift("cp-1", v1alpha1.DriftReading{Error: "kubeadm upgrade node phase control-plane --dry-run: exit status 1"})
	shows("w-1's control-plane report alone is no drift; cp-1 could not compare",
		`cp-1 drifted=false problem="kubeadm upgrade node phase control-plane --dry-run: exit status 1" | w-1 drifted=false problem="" (0 drifted)`)

	f.annotateDrift("cp-1", v1alpha1.DriftReading{})
	shows("cp-1 fixed", `cp-1 drifted=false problem="" | w-1 drifted=false problem="" (0 drifted)`)
	f.stillOperations()
}
