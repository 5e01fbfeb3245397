package commands

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/cakeys"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/testutil"
)

// publishCluster is an API server with what kubeadm puts in a cluster for publish to change: the
// cluster-info ConfigMap trusting the old cluster CA, kube-proxy and CoreDNS, a namespace with a
// legacy service-account token Secret. The test plays the controller-manager (kube-root-ca.crt,
// the token Secrets' ca.crt) and the workload controllers (rollout status).
type publishCluster struct {
	c  client.Client
	ns string
}

func (pc publishCluster) create(t *testing.T, ctx context.Context, oldCA []byte) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[""] = &clientcmdapi.Cluster{Server: "https://10.0.0.1:6443", CertificateAuthorityData: oldCA}
	kc, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"k8s-app": "x"}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	for _, o := range []client.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: cakeys.ClusterInfoNamespace, Name: cakeys.ClusterInfoName},
			Data: map[string]string{"kubeconfig": string(kc)}},
		&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy"},
			Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "coredns"},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pc.ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: pc.ns, Name: "legacy"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: pc.ns, Name: "legacy-token",
			Annotations: map[string]string{corev1.ServiceAccountNameKey: "legacy"}},
			Type: corev1.SecretTypeServiceAccountToken, Data: map[string][]byte{"token": []byte("x"), "ca.crt": oldCA}},
	} {
		if err := pc.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, o := range []client.Object{
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: cakeys.ClusterInfoNamespace, Name: cakeys.ClusterInfoName}},
			&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy"}},
			&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "coredns"}},
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pc.ns}},
		} {
			_ = pc.c.Delete(ctx, o)
		}
	})
	pc.controllerManagerPublishes(t, ctx, oldCA)
}

// controllerManagerPublishes plays the controller-manager after a restart with --root-ca-file=ca:
// every namespace's kube-root-ca.crt and every token Secret's ca.crt hold ca.
func (pc publishCluster) controllerManagerPublishes(t *testing.T, ctx context.Context, ca []byte) {
	t.Helper()
	nss := &corev1.NamespaceList{}
	if err := pc.c.List(ctx, nss); err != nil {
		t.Fatal(err)
	}
	for _, ns := range nss.Items {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: cakeys.RootCAConfigMap}}
		if err := pc.c.Get(ctx, client.ObjectKeyFromObject(cm), cm); err != nil {
			cm.Data = map[string]string{"ca.crt": string(ca)}
			if err := pc.c.Create(ctx, cm); err != nil {
				t.Fatal(err)
			}
			continue
		}
		cm.Data = map[string]string{"ca.crt": string(ca)}
		if err := pc.c.Update(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}
	s := &corev1.Secret{}
	if err := pc.c.Get(ctx, client.ObjectKey{Namespace: pc.ns, Name: "legacy-token"}, s); err != nil {
		t.Fatal(err)
	}
	s.Data["ca.crt"] = ca
	if err := pc.c.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
}

// rollsOut plays the DaemonSet or Deployment controller: every pod of the current template runs.
func (pc publishCluster) rollsOut(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	key := client.ObjectKey{Namespace: "kube-system", Name: name}
	if name == "kube-proxy" {
		ds := &appsv1.DaemonSet{}
		if err := pc.c.Get(ctx, key, ds); err != nil {
			t.Fatal(err)
		}
		ds.Status = appsv1.DaemonSetStatus{ObservedGeneration: ds.Generation, DesiredNumberScheduled: 3, CurrentNumberScheduled: 3,
			UpdatedNumberScheduled: 3, NumberAvailable: 3, NumberReady: 3}
		if err := pc.c.Status().Update(ctx, ds); err != nil {
			t.Fatal(err)
		}
		return
	}
	d := &appsv1.Deployment{}
	if err := pc.c.Get(ctx, key, d); err != nil {
		t.Fatal(err)
	}
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 2, UpdatedReplicas: 2, AvailableReplicas: 2, ReadyReplicas: 2}
	if err := pc.c.Status().Update(ctx, d); err != nil {
		t.Fatal(err)
	}
}

// template is the workload's pod template annotations and its resourceVersion.
func (pc publishCluster) template(t *testing.T, ctx context.Context, name string) (map[string]string, string) {
	t.Helper()
	key := client.ObjectKey{Namespace: "kube-system", Name: name}
	if name == "kube-proxy" {
		ds := &appsv1.DaemonSet{}
		if err := pc.c.Get(ctx, key, ds); err != nil {
			t.Fatal(err)
		}
		return ds.Spec.Template.Annotations, ds.ResourceVersion
	}
	d := &appsv1.Deployment{}
	if err := pc.c.Get(ctx, key, d); err != nil {
		t.Fatal(err)
	}
	return d.Spec.Template.Annotations, d.ResourceVersion
}

func (pc publishCluster) clusterInfo(t *testing.T, ctx context.Context) ([]string, string) {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := pc.c.Get(ctx, client.ObjectKey{Namespace: cakeys.ClusterInfoNamespace, Name: cakeys.ClusterInfoName}, cm); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.Load([]byte(cm.Data["kubeconfig"]))
	if err != nil {
		t.Fatal(err)
	}
	return cakeys.Trusted(cfg.Clusters[""].CertificateAuthorityData), cm.ResourceVersion
}

// notes collects what a command shows it waits for.
type notes struct {
	mu  sync.Mutex
	all []string
}

func (n *notes) add(s string) { n.mu.Lock(); n.all = append(n.all, s); n.mu.Unlock() }

func (n *notes) has(sub string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range n.all {
		if strings.Contains(s, sub) {
			return nil
		}
	}
	return fmt.Errorf("no note %q yet (%d notes)", sub, len(n.all))
}

// publishCertificateAuthorities, on a real API server: a DryRun changes nothing; a run makes
// cluster-info trust old and new, restarts nothing until every kube-root-ca.crt and token Secret
// holds both, then restarts kube-proxy and CoreDNS and waits for their rollouts; cut while
// kube-proxy rolls out, the resumed run restarts kube-proxy no second time; a further run writes
// nothing. Phase complete's run (NewOnly) then publishes the new CA alone.
func TestPublishCertificateAuthoritiesOnAnAPIServer(t *testing.T) {
	env, err := testutil.Start("nodetasks")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	op := "rot-" + rand.String(5)

	// The first control plane after trust-both: ca-bundle.crt (old and new) and the staged new CA.
	root := t.TempDir()
	oldCA := oldPKI(t, root, true)
	files := host.NewLocal(root).Files
	if _, err := cakeys.Generate(files, op, nil, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := cakeys.TrustBoth(files, cakeys.TrustInput{Operation: op}); err != nil {
		t.Fatal(err)
	}
	newCA := hostRead(t, root, v1alpha1.StagingDirectory+"/ca.crt")
	bundle := hostRead(t, root, cakeys.PKIDirectory+"/ca-bundle.crt")
	kubeconfig, err := env.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	admin, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, adminConf), admin, 0o600); err != nil {
		t.Fatal(err)
	}
	pc := publishCluster{c: env.Client, ns: "pub-" + rand.String(5)}
	pc.create(t, ctx, oldCA)

	run := func(ctx context.Context, trust v1alpha1.CATrust, dryRun bool, n *notes) (Result, string, error) {
		out := &bytes.Buffer{}
		e := &Env{NodeName: "cp-1", Operation: op, DryRun: dryRun, Host: host.NewLocal(root), Out: out, Poll: 20 * time.Millisecond}
		if n != nil {
			e.Note = n.add
		}
		res, err := Run(ctx, e, &v1alpha1.Command{PublishCertificateAuthorities: &v1alpha1.PublishCertificateAuthoritiesCommand{Trust: trust}})
		return res, out.String(), err
	}
	oldTrusted, infoRV := pc.clusterInfo(t, ctx)
	_, proxyRV := pc.template(t, ctx, "kube-proxy")
	_, dnsRV := pc.template(t, ctx, "coredns")

	// DryRun: it says what would change and changes nothing.
	res, out, err := run(ctx, v1alpha1.TrustOldAndNew, true, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, w := range []string{"dry run: would write kube-public/cluster-info", "dry run: would restart DaemonSet kube-system/kube-proxy", "dry run: would restart Deployment kube-system/coredns", "waiting for the controller-managers"} {
		if !strings.Contains(out, w) {
			t.Errorf("dry run output lacks %q:\n%s", w, out)
		}
	}
	if !strings.HasPrefix(res.Message, "dry run") {
		t.Errorf("message %q", res.Message)
	}
	if got, rv := pc.clusterInfo(t, ctx); rv != infoRV || strings.Join(got, ",") != strings.Join(oldTrusted, ",") {
		t.Errorf("the dry run changed cluster-info: %v", got)
	}
	if _, rv := pc.template(t, ctx, "kube-proxy"); rv != proxyRV {
		t.Error("the dry run changed kube-proxy")
	}
	if _, rv := pc.template(t, ctx, "coredns"); rv != dnsRV {
		t.Error("the dry run changed coredns")
	}

	// The run: cluster-info first, then it waits for the controller-managers.
	n := &notes{}
	cut, cutRun := context.WithCancel(ctx)
	defer cutRun()
	done := make(chan error, 1)
	var firstOut string
	go func() {
		_, out, err := run(cut, v1alpha1.TrustOldAndNew, false, n)
		firstOut = out
		done <- err
	}()
	testutil.Eventually(t, 30*time.Second, "publish waits for kube-root-ca.crt", func() error { return n.has("waiting for the controller-managers") })
	if got, _ := pc.clusterInfo(t, ctx); strings.Join(got, ",") != strings.Join(cakeys.Trusted(bundle), ",") {
		t.Errorf("cluster-info trusts %v, want the old and the new %v", got, cakeys.Trusted(bundle))
	}
	if a, _ := pc.template(t, ctx, "kube-proxy"); a[cakeys.RestartedForAnnotation] != "" {
		t.Fatal("kube-proxy restarted before every kube-root-ca.crt held the new CA")
	}
	pc.controllerManagerPublishes(t, ctx, bundle)
	var proxyRestartedAt string
	testutil.Eventually(t, 30*time.Second, "kube-proxy restarted", func() error {
		a, _ := pc.template(t, ctx, "kube-proxy")
		if a[cakeys.RestartedForAnnotation] != op+"/OldAndNew" {
			return fmt.Errorf("annotations %v", a)
		}
		proxyRestartedAt = a["kubectl.kubernetes.io/restartedAt"]
		return nil
	})
	testutil.Eventually(t, 30*time.Second, "publish waits for kube-proxy's rollout", func() error { return n.has("waiting for DaemonSet kube-system/kube-proxy to roll out") })
	// Cut here: the agent restarts while kube-proxy rolls out.
	cutRun()
	if err := <-done; err == nil {
		t.Fatalf("the cut run succeeded:\n%s", firstOut)
	}
	if a, _ := pc.template(t, ctx, "coredns"); a[cakeys.RestartedForAnnotation] != "" {
		t.Fatal("coredns restarted before kube-proxy rolled out")
	}
	// A restart's time has a resolution of a second: mark this one, so that a second restart shows.
	proxyRestartedAt = "2000-01-01T00:00:00Z"
	ds := &appsv1.DaemonSet{}
	if err := pc.c.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "kube-proxy"}, ds); err != nil {
		t.Fatal(err)
	}
	ds.Spec.Template.Annotations["kubectl.kubernetes.io/restartedAt"] = proxyRestartedAt
	if err := pc.c.Update(ctx, ds); err != nil {
		t.Fatal(err)
	}
	pc.rollsOut(t, ctx, "kube-proxy")
	_, proxyRV = pc.template(t, ctx, "kube-proxy")

	// The resumed run: kube-proxy is not restarted again; CoreDNS is, then rolls out.
	n2 := &notes{}
	done2 := make(chan error, 1)
	var out2 string
	var res2 Result
	go func() {
		var err error
		res2, out2, err = run(ctx, v1alpha1.TrustOldAndNew, false, n2)
		done2 <- err
	}()
	testutil.Eventually(t, 30*time.Second, "publish waits for CoreDNS's rollout", func() error { return n2.has("waiting for Deployment kube-system/coredns to roll out") })
	pc.rollsOut(t, ctx, "coredns")
	if err := <-done2; err != nil {
		t.Fatalf("resumed run: %v\n%s", err, out2)
	}
	if a, rv := pc.template(t, ctx, "kube-proxy"); rv != proxyRV || a["kubectl.kubernetes.io/restartedAt"] != proxyRestartedAt {
		t.Errorf("the resumed run restarted kube-proxy a second time (%v)\n%s", a, out2)
	}
	if !strings.Contains(out2, "restarted for "+op+"/OldAndNew already") {
		t.Errorf("the resumed run does not say it read the record:\n%s", out2)
	}
	if !strings.Contains(res2.Message, "changed kube-system/coredns") {
		t.Errorf("message %q", res2.Message)
	}

	// Run again: nothing is written.
	_, infoRV = pc.clusterInfo(t, ctx)
	_, proxyRV = pc.template(t, ctx, "kube-proxy")
	_, dnsRV = pc.template(t, ctx, "coredns")
	res, out, err = run(ctx, v1alpha1.TrustOldAndNew, false, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, rv := pc.clusterInfo(t, ctx); rv != infoRV {
		t.Error("a third run wrote cluster-info")
	}
	if _, rv := pc.template(t, ctx, "kube-proxy"); rv != proxyRV {
		t.Error("a third run wrote kube-proxy")
	}
	if _, rv := pc.template(t, ctx, "coredns"); rv != dnsRV {
		t.Error("a third run wrote coredns")
	}
	if !strings.HasSuffix(res.Message, "changed nothing") {
		t.Errorf("message %q", res.Message)
	}

	// Phase complete on this control plane (as TrustNewOnly leaves it): ca.crt is the new CA, the
	// bundle and the staging directory are gone. Publish NewOnly: cluster-info and the wait for the
	// new CA alone, and one more restart each.
	if err := os.WriteFile(filepath.Join(root, cakeys.PKIDirectory, "ca.crt"), newCA, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{cakeys.PKIDirectory + "/ca-bundle.crt", v1alpha1.StagingDirectory} {
		if err := os.RemoveAll(filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	n3 := &notes{}
	done3 := make(chan error, 1)
	var out3 string
	go func() {
		var err error
		_, out3, err = run(ctx, v1alpha1.TrustNewOnly, false, n3)
		done3 <- err
	}()
	testutil.Eventually(t, 30*time.Second, "publish NewOnly waits for kube-root-ca.crt", func() error { return n3.has("waiting for the controller-managers") })
	if got, _ := pc.clusterInfo(t, ctx); strings.Join(got, ",") != strings.Join(cakeys.Trusted(newCA), ",") {
		t.Errorf("cluster-info trusts %v, want the new CA alone", got)
	}
	pc.controllerManagerPublishes(t, ctx, newCA)
	for _, name := range []string{"kube-proxy", "coredns"} {
		testutil.Eventually(t, 30*time.Second, name+" restarted for NewOnly", func() error {
			if a, _ := pc.template(t, ctx, name); a[cakeys.RestartedForAnnotation] != op+"/NewOnly" {
				return fmt.Errorf("annotations %v", a)
			}
			return nil
		})
		pc.rollsOut(t, ctx, name)
	}
	if err := <-done3; err != nil {
		t.Fatalf("publish NewOnly: %v\n%s", err, out3)
	}
	// Rule 15: what the runs print, and so what the agent records, holds no key.
	for _, o := range []string{out, firstOut, out2, out3} {
		if strings.Contains(o, "PRIVATE KEY") {
			t.Errorf("a key in publish's output:\n%s", o)
		}
	}
}

func hostRead(t *testing.T, root, p string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, p))
	if err != nil {
		t.Fatal(err)
	}
	return data
}
