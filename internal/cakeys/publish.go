package cakeys

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/host"
)

// The cluster-wide objects a rotation changes or waits for.
const (
	// ClusterInfoNamespace and ClusterInfoName: the kubeconfig joining nodes discover the cluster
	// with (kubeadm join); the controller-manager's bootstrap signer signs it again when it changes.
	ClusterInfoNamespace = "kube-public"
	ClusterInfoName      = "cluster-info"
	// RootCAConfigMap is what the controller-manager writes into every namespace from its --root-ca-file.
	RootCAConfigMap = "kube-root-ca.crt"
	// RestartedForAnnotation on a restarted workload's pod template records which rotation step
	// restarted it, in the same write as the restart: a resumed run reads it and restarts nothing twice
	// (rule 16).
	RestartedForAnnotation = "nodeops.io/restarted-for-certificate-authorities"
	// restartedAtAnnotation is kubectl rollout restart's own.
	restartedAtAnnotation = "kubectl.kubernetes.io/restartedAt"
)

// InClusterClient is a kube-system workload that reads the cluster CA once, at start, from its
// ServiceAccount's kube-root-ca.crt: it must restart to trust a new one. Absent ones are skipped.
type InClusterClient struct {
	Kind string // DaemonSet or Deployment
	Name string
}

// InClusterClients are those kubeadm installs: kube-proxy and CoreDNS.
var InClusterClients = []InClusterClient{{Kind: "DaemonSet", Name: "kube-proxy"}, {Kind: "Deployment", Name: "coredns"}}

// PublishedClusterCA is what the cluster must publish at this step of operation's rotation, read on
// the control plane that runs it: with trust OldAndNew the bundle trust-both wrote (ca-bundle.crt, the
// controller-managers' --root-ca-file), which must hold the staged new authority; with NewOnly ca.crt,
// which phase re-issue made the new authority and phase complete pointed the controller-manager back at.
func PublishedClusterCA(files host.Files, operation string, trust v1alpha1.CATrust) ([]byte, error) {
	cluster := trustBundles[v1alpha1.AuthorityCluster]
	stagedCA, stagedErr := files.ReadFile(staged(pairs[v1alpha1.AuthorityCluster].Cert))
	if got := Operation(files); got != "" && got != operation {
		return nil, fmt.Errorf("%s holds the authorities of operation %q, not %q", v1alpha1.StagingDirectory, got, operation)
	}
	switch trust {
	case v1alpha1.TrustOldAndNew:
		if stagedErr != nil {
			return nil, fmt.Errorf("this node holds no new cluster authority of operation %s (%w): publish runs on a control plane after phase prepare", operation, stagedErr)
		}
		bundle, err := files.ReadFile(pki(cluster.bundle))
		if err != nil {
			return nil, fmt.Errorf("%w: phase trust-both (trustCertificateAuthorities OldAndNew) has not run on this control plane", err)
		}
		blocks, err := pemBlocks(bundle, pki(cluster.bundle))
		if err != nil {
			return nil, err
		}
		newBlocks, err := pemBlocks(stagedCA, staged("ca.crt"))
		if err != nil {
			return nil, err
		}
		if len(blocks) < 2 || !subset(newBlocks, blocks) {
			return nil, fmt.Errorf("%s holds %s, not the old and the new cluster authority", pki(cluster.bundle), strings.Join(Trusted(bundle), ", "))
		}
		return bundle, nil
	case v1alpha1.TrustNewOnly:
		if files.Exists(pki(cluster.bundle)) {
			return nil, fmt.Errorf("%s is still there: phase complete (trustCertificateAuthorities NewOnly) has not run on this control plane", pki(cluster.bundle))
		}
		ca, err := files.ReadFile(pki(cluster.old))
		if err != nil {
			return nil, err
		}
		if _, err := pemBlocks(ca, pki(cluster.old)); err != nil {
			return nil, err
		}
		if stagedErr == nil && !samePEM(stagedCA, ca) {
			return nil, fmt.Errorf("%s is not the rotation's new cluster authority: phase re-issue has not run on this control plane", pki(cluster.old))
		}
		if stagedErr != nil && !errors.Is(stagedErr, fs.ErrNotExist) {
			return nil, stagedErr
		}
		return ca, nil
	}
	return nil, fmt.Errorf("trust %q: want OldAndNew or NewOnly", trust)
}

// PublishInput is one publish step of a rotation.
type PublishInput struct {
	Operation string
	Trust     v1alpha1.CATrust
	// CA is the cluster authorities to publish (PublishedClusterCA).
	CA []byte
	// DryRun: c makes server-side dry runs; nothing is waited for.
	DryRun bool
	Poll   time.Duration
	Out    io.Writer
	// Note shows what the step waits for (the task's status); nil: only in Out.
	Note func(string)
}

func (in PublishInput) record() string { return in.Operation + "/" + string(in.Trust) }

func (in PublishInput) printf(format string, args ...any) {
	if in.Out != nil {
		_, _ = fmt.Fprintf(in.Out, format, args...)
	}
}

func (in PublishInput) note(msg string) {
	in.printf("%s\n", msg)
	if in.Note != nil {
		in.Note(msg)
	}
}

// Publish makes a rotation's cluster-wide changes, each once: cluster-info's kubeconfig trusts in.CA
// (written only when it does not yet); then it waits until every namespace's kube-root-ca.crt and
// every legacy service-account token Secret's ca.crt hold exactly in.CA (the controller-managers
// write both from their --root-ca-file, as kubeadm's manual procedure says to wait for); then it
// restarts the in-cluster clients that read the CA once, each restart carrying its record
// (RestartedForAnnotation) so that a resumed run waits for the rollout instead of restarting again.
// It returns what it changed.
func Publish(ctx context.Context, c client.Client, in PublishInput) ([]string, error) {
	want, err := pemBlocks(in.CA, "the cluster authorities to publish")
	if err != nil {
		return nil, err
	}
	var changed []string
	did, err := publishClusterInfo(ctx, c, in)
	if err != nil {
		return nil, err
	}
	if did {
		changed = append(changed, ClusterInfoNamespace+"/"+ClusterInfoName)
	}
	if err := waitPublished(ctx, c, in, want); err != nil {
		return changed, err
	}
	for _, w := range InClusterClients {
		did, err := restart(ctx, c, in, w)
		if err != nil {
			return changed, err
		}
		if did {
			changed = append(changed, "kube-system/"+w.Name)
		}
	}
	return changed, nil
}

// publishClusterInfo makes cluster-info's kubeconfig trust in.CA; a kubeconfig trusting an authority
// that is neither in in.CA nor in the node's old bundle is not this cluster's rotation and is refused.
func publishClusterInfo(ctx context.Context, c client.Client, in PublishInput) (bool, error) {
	cm := &corev1.ConfigMap{}
	key := client.ObjectKey{Namespace: ClusterInfoNamespace, Name: ClusterInfoName}
	if err := c.Get(ctx, key, cm); err != nil {
		if apierrors.IsNotFound(err) {
			in.printf("%s: not there (a cluster not made by kubeadm init): nothing to publish\n", key)
			return false, nil
		}
		return false, fmt.Errorf("reading %s: %w", key, err)
	}
	cfg, err := clientcmd.Load([]byte(cm.Data["kubeconfig"]))
	if err != nil {
		return false, fmt.Errorf("%s kubeconfig: %w", key, err)
	}
	want, _ := pemBlocks(in.CA, "")
	var before []string
	for name, cl := range cfg.Clusters {
		if samePEM(cl.CertificateAuthorityData, in.CA) {
			continue
		}
		blocks, err := pemBlocks(cl.CertificateAuthorityData, key.String()+" cluster "+name)
		if err != nil {
			return false, err
		}
		// It must trust some authority of the rotation: else it is another cluster's kubeconfig.
		if !intersects(blocks, want) {
			return false, fmt.Errorf("%s cluster %s trusts %s, none of %s: refusing to replace it", key, name, strings.Join(Trusted(cl.CertificateAuthorityData), ", "), strings.Join(Trusted(in.CA), ", "))
		}
		before = append(before, Trusted(cl.CertificateAuthorityData)...)
		cl.CertificateAuthorityData = in.CA
	}
	if len(before) == 0 {
		in.printf("%s: trusts %s already; unchanged\n", key, strings.Join(Trusted(in.CA), ", "))
		return false, nil
	}
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		return false, err
	}
	cm.Data["kubeconfig"] = string(out)
	in.printf("%s: trusts %s; after: %s\n", key, strings.Join(before, ", "), strings.Join(Trusted(in.CA), ", "))
	// An update, so that a concurrent change fails it rather than being lost.
	if err := c.Update(ctx, cm); err != nil {
		return false, fmt.Errorf("writing %s: %w", key, err)
	}
	if in.DryRun {
		in.printf("dry run: would write %s (the API server accepted it in a dry run)\n", key)
	}
	return true, nil
}

func intersects(a, b []*pem.Block) bool {
	for _, x := range a {
		if subset([]*pem.Block{x}, b) {
			return true
		}
	}
	return false
}

// waitPublished waits until every namespace's kube-root-ca.crt and every legacy service-account
// token Secret's ca.crt hold exactly the authorities of want. The controller-managers write both from
// their --root-ca-file (the token controller rewrites a Secret whose ca.crt differs from it), so
// nodeops writes neither: a rewrite would race the controller and be undone by it.
func waitPublished(ctx context.Context, c client.Client, in PublishInput, want []*pem.Block) error {
	for {
		behind, err := notPublished(ctx, c, want)
		if err != nil {
			return err
		}
		if len(behind) == 0 {
			in.printf("every namespace's %s and service-account token Secret holds %s\n", RootCAConfigMap, strings.Join(Trusted(in.CA), ", "))
			return nil
		}
		msg := fmt.Sprintf("waiting for the controller-managers to publish %s: %d not yet (%s)", strings.Join(Trusted(in.CA), ", "), len(behind), firstFew(behind))
		if in.DryRun {
			in.printf("dry run: %s; a run waits for them\n", msg)
			return nil
		}
		in.note(msg)
		poll := in.Poll
		if poll == 0 {
			poll = 2 * time.Second
		}
		if err := clock.Sleep(ctx, poll); err != nil {
			return fmt.Errorf("%s: %w", msg, err)
		}
	}
}

// notPublished names the ConfigMaps and Secrets that do not hold want yet.
func notPublished(ctx context.Context, c client.Client, want []*pem.Block) ([]string, error) {
	var behind []string
	holds := func(data string) bool {
		got, err := pemBlocks([]byte(data), "")
		return err == nil && subset(got, want) && subset(want, got)
	}
	nss := &corev1.NamespaceList{}
	if err := c.List(ctx, nss); err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	for _, ns := range nss.Items {
		if ns.Status.Phase == corev1.NamespaceTerminating {
			continue
		}
		cm := &corev1.ConfigMap{}
		err := c.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: RootCAConfigMap}, cm)
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading %s/%s: %w", ns.Name, RootCAConfigMap, err)
		}
		if err != nil || !holds(cm.Data["ca.crt"]) {
			behind = append(behind, "ConfigMap "+ns.Name+"/"+RootCAConfigMap)
		}
	}
	secrets := &corev1.SecretList{}
	if err := c.List(ctx, secrets, client.MatchingFields{"type": string(corev1.SecretTypeServiceAccountToken)}); err != nil {
		return nil, fmt.Errorf("listing service-account token Secrets: %w", err)
	}
	for _, s := range secrets.Items {
		if s.Type == corev1.SecretTypeServiceAccountToken && !holds(string(s.Data[corev1.ServiceAccountRootCAKey])) {
			behind = append(behind, "Secret "+s.Namespace+"/"+s.Name)
		}
	}
	sort.Strings(behind)
	return behind, nil
}

func firstFew(s []string) string {
	if len(s) > 3 {
		return strings.Join(s[:3], ", ") + fmt.Sprintf(" and %d more", len(s)-3)
	}
	return strings.Join(s, ", ")
}

// restart restarts w as kubectl rollout restart does, unless its pod template records that this step
// restarted it already, then waits for the rollout (not in a DryRun). It reports whether it wrote.
func restart(ctx context.Context, c client.Client, in PublishInput, w InClusterClient) (bool, error) {
	key := client.ObjectKey{Namespace: "kube-system", Name: w.Name}
	obj, tmpl := workload(w.Kind)
	if err := c.Get(ctx, key, obj); err != nil {
		if apierrors.IsNotFound(err) {
			in.printf("%s kube-system/%s: not there; nothing to restart\n", w.Kind, w.Name)
			return false, nil
		}
		return false, fmt.Errorf("reading %s %s: %w", w.Kind, key, err)
	}
	wrote := false
	if tmpl().Annotations[RestartedForAnnotation] == in.record() {
		in.printf("%s %s: restarted for %s already (annotation %s); not again\n", w.Kind, key, in.record(), RestartedForAnnotation)
	} else {
		base := obj.DeepCopyObject().(client.Object)
		t := tmpl()
		if t.Annotations == nil {
			t.Annotations = map[string]string{}
		}
		// The record and the restart are one write: no restart is ever made unrecorded.
		t.Annotations[RestartedForAnnotation] = in.record()
		t.Annotations[restartedAtAnnotation] = time.Now().UTC().Format(time.RFC3339)
		if err := c.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return false, fmt.Errorf("restarting %s %s: %w", w.Kind, key, err)
		}
		wrote = true
		if in.DryRun {
			in.printf("dry run: would restart %s %s so that its pods read %s (the API server accepted it in a dry run)\n", w.Kind, key, strings.Join(Trusted(in.CA), ", "))
			return true, nil
		}
		in.printf("%s %s: restarted so that its pods read %s\n", w.Kind, key, strings.Join(Trusted(in.CA), ", "))
	}
	if in.DryRun {
		return wrote, nil
	}
	return wrote, waitRollout(ctx, c, in, w, key)
}

// workload is an empty object of kind and a function giving its pod template.
func workload(kind string) (client.Object, func() *corev1.PodTemplateSpec) {
	if kind == "DaemonSet" {
		ds := &appsv1.DaemonSet{}
		return ds, func() *corev1.PodTemplateSpec { return &ds.Spec.Template }
	}
	d := &appsv1.Deployment{}
	return d, func() *corev1.PodTemplateSpec { return &d.Spec.Template }
}

// waitRollout waits as kubectl rollout status does: the controller saw the new template, every pod
// is of it and available.
func waitRollout(ctx context.Context, c client.Client, in PublishInput, w InClusterClient, key client.ObjectKey) error {
	for {
		obj, _ := workload(w.Kind)
		if err := c.Get(ctx, key, obj); err != nil {
			return fmt.Errorf("reading %s %s: %w", w.Kind, key, err)
		}
		waiting, err := rolloutWaiting(obj)
		if err != nil {
			return fmt.Errorf("%s %s: %w", w.Kind, key, err)
		}
		if waiting == "" {
			in.printf("%s %s: rolled out\n", w.Kind, key)
			return nil
		}
		msg := fmt.Sprintf("waiting for %s %s to roll out: %s", w.Kind, key, waiting)
		in.note(msg)
		poll := in.Poll
		if poll == 0 {
			poll = 2 * time.Second
		}
		if err := clock.Sleep(ctx, poll); err != nil {
			return fmt.Errorf("%s: %w", msg, err)
		}
	}
}

// rolloutWaiting says what a rollout still waits for, "" when done.
func rolloutWaiting(obj client.Object) (string, error) {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		if o.Status.ObservedGeneration < o.Generation {
			return "the controller has not seen the restart yet", nil
		}
		for _, cond := range o.Status.Conditions {
			if cond.Type == appsv1.DeploymentProgressing && cond.Reason == "ProgressDeadlineExceeded" {
				return "", fmt.Errorf("rollout exceeded its progress deadline: %s", cond.Message)
			}
		}
		want := int32(1)
		if o.Spec.Replicas != nil {
			want = *o.Spec.Replicas
		}
		switch {
		case o.Status.UpdatedReplicas < want:
			return fmt.Sprintf("%d of %d pods restarted", o.Status.UpdatedReplicas, want), nil
		case o.Status.Replicas > o.Status.UpdatedReplicas:
			return fmt.Sprintf("%d old pods still running", o.Status.Replicas-o.Status.UpdatedReplicas), nil
		case o.Status.AvailableReplicas < o.Status.UpdatedReplicas:
			return fmt.Sprintf("%d of %d restarted pods available", o.Status.AvailableReplicas, o.Status.UpdatedReplicas), nil
		}
	case *appsv1.DaemonSet:
		if o.Spec.UpdateStrategy.Type == appsv1.OnDeleteDaemonSetStrategyType {
			return "", errors.New("its update strategy is OnDelete: a restart replaces no pod; delete its pods by hand (or set RollingUpdate) and retry")
		}
		if o.Status.ObservedGeneration < o.Generation {
			return "the controller has not seen the restart yet", nil
		}
		switch {
		case o.Status.UpdatedNumberScheduled < o.Status.DesiredNumberScheduled:
			return fmt.Sprintf("%d of %d pods restarted", o.Status.UpdatedNumberScheduled, o.Status.DesiredNumberScheduled), nil
		case o.Status.NumberAvailable < o.Status.DesiredNumberScheduled:
			return fmt.Sprintf("%d of %d pods available", o.Status.NumberAvailable, o.Status.DesiredNumberScheduled), nil
		}
	}
	return "", nil
}
