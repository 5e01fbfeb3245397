package commands

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/cakeys"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/objname"
)

// CAServer publishes where the agent serves a rotation's staged authorities (cakeys.Server).
type CAServer interface {
	Publish() (v1alpha1.CertificateAuthorityServer, error)
}

// runGenerateCertificateAuthorities makes the new authorities in the staging directory and publishes
// the agent's server for them; the keys stay on the node (rule 15): the result holds fingerprints only.
func runGenerateCertificateAuthorities(_ context.Context, env *Env, c *v1alpha1.GenerateCertificateAuthoritiesCommand) (Result, error) {
	if env.DryRun {
		// The dry-run host reports each file the run would write; no key is made to be thrown away.
		pairs, err := cakeys.Pairs(c.Authorities, c.ServiceAccountKey)
		if err != nil {
			return Result{}, err
		}
		for _, p := range pairs {
			env.printf("dry run: would create %s/%s and %s/%s (mode 0600): new %s, self-signed (new issuer); nothing trusts it yet\n",
				v1alpha1.StagingDirectory, p.Cert, v1alpha1.StagingDirectory, p.Key, p.Name)
		}
		return Result{Message: "dry run: would generate " + strings.Join(names(pairs), ", ")}, nil
	}
	if env.CAServer == nil {
		return Result{}, errors.New("generateCertificateAuthorities: this agent serves no certificate authorities to the other control planes: start it with --ca-server-address")
	}
	g, err := cakeys.Generate(env.Host.Files, env.Operation, c.Authorities, c.ServiceAccountKey, time.Now())
	if err != nil {
		return Result{}, err
	}
	for _, l := range g.Lines {
		env.printf("%s\n", l)
	}
	srv, err := env.CAServer.Publish()
	if err != nil {
		return Result{}, err
	}
	msg := "generated " + listOrNone(g.Made)
	if len(g.Kept) > 0 {
		msg += ", kept " + strings.Join(g.Kept, ", ") + " from an earlier run"
	}
	return Result{Message: msg + "; serving them at " + srv.Address, CAServer: &srv}, nil
}

// runCopyCertificateAuthorities fetches the new authorities from the generating agent of the same
// operation into this node's staging directory.
func runCopyCertificateAuthorities(ctx context.Context, env *Env, c *v1alpha1.CopyCertificateAuthoritiesCommand) (Result, error) {
	if env.Client == nil {
		return Result{}, errors.New("copyCertificateAuthorities needs the agent's client")
	}
	src, node, err := generatingServer(ctx, env.Client, env.Operation)
	if err != nil && env.DryRun {
		// A DryRun's generateCertificateAuthorities made nothing and serves nothing: say what the
		// copy would take from the node it ran on.
		node, err = generatingNode(ctx, env.Client, env.Operation)
	}
	if err != nil {
		return Result{}, err
	}
	if env.DryRun {
		pairs, err := cakeys.Pairs(c.Authorities, c.ServiceAccountKey)
		if err != nil {
			return Result{}, err
		}
		for _, p := range pairs {
			env.printf("dry run: would copy %s/%s and %s/%s (mode 0600) from node %s: the new %s, self-signed (new issuer)\n",
				v1alpha1.StagingDirectory, p.Cert, v1alpha1.StagingDirectory, p.Key, node, p.Name)
		}
		return Result{Message: "dry run: would copy " + strings.Join(names(pairs), ", ") + " from node " + node}, nil
	}
	if env.ServiceAccountToken == nil {
		return Result{}, errors.New("copyCertificateAuthorities needs the agent's ServiceAccount token")
	}
	token, err := env.ServiceAccountToken()
	if err != nil {
		return Result{}, fmt.Errorf("reading the agent's ServiceAccount token: %w", err)
	}
	files, err := cakeys.Fetch(ctx, *src, env.Operation, c.Authorities, c.ServiceAccountKey, token)
	if err != nil {
		return Result{}, err
	}
	g, err := cakeys.Write(env.Host.Files, env.Operation, c.Authorities, c.ServiceAccountKey, files)
	if err != nil {
		return Result{}, err
	}
	for _, l := range g.Lines {
		env.printf("%s\n", l)
	}
	return Result{Message: "copied " + listOrNone(g.Made) + " from node " + node}, nil
}

// generatingServer is the server the operation's generating task published, and its node.
func generatingServer(ctx context.Context, c client.Client, operation string) (*v1alpha1.CertificateAuthorityServer, string, error) {
	tasks := &v1alpha1.NodeTaskList{}
	if err := c.List(ctx, tasks, client.MatchingLabels{v1alpha1.LabelOperation: operation}); err != nil {
		return nil, "", fmt.Errorf("listing the tasks of operation %s: %w", operation, err)
	}
	for _, t := range tasks.Items {
		if t.Spec.Operation != operation || t.Status.CertificateAuthorityServer == nil {
			continue
		}
		for _, cmd := range t.Spec.Commands {
			if cmd.GenerateCertificateAuthorities != nil {
				return t.Status.CertificateAuthorityServer.DeepCopy(), t.Spec.NodeName, nil
			}
		}
	}
	return nil, "", fmt.Errorf("no task of operation %s has generated the new authorities yet (generateCertificateAuthorities publishes its server in status.certificateAuthorityServer)", operation)
}

// generatingNode is the node of the operation's generateCertificateAuthorities task, published
// server or not (a DryRun's publishes none).
func generatingNode(ctx context.Context, c client.Client, operation string) (string, error) {
	tasks := &v1alpha1.NodeTaskList{}
	if err := c.List(ctx, tasks, client.MatchingLabels{v1alpha1.LabelOperation: operation}); err != nil {
		return "", fmt.Errorf("listing the tasks of operation %s: %w", operation, err)
	}
	for _, t := range tasks.Items {
		for _, cmd := range t.Spec.Commands {
			if t.Spec.Operation == operation && cmd.GenerateCertificateAuthorities != nil {
				return t.Spec.NodeName, nil
			}
		}
	}
	return "", fmt.Errorf("operation %s has no generateCertificateAuthorities task", operation)
}

func names(pairs []cakeys.Pair) []string {
	out := make([]string, len(pairs))
	for i, p := range pairs {
		out[i] = p.Name
	}
	return out
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "nothing"
	}
	return strings.Join(s, ", ")
}

// runTrustCertificateAuthorities, with trust OldAndNew (phase trust-both), makes the node trust the old
// and the new authorities wherever a bundle is accepted (cakeys.TrustBoth); with NewOnly (phase
// complete) the new alone (cakeys.TrustNewOnly). A control plane takes the authorities from its own
// files; a worker, which has no staging directory, takes the cluster authority from kube-root-ca.crt,
// which the control planes' controller-managers publish from their --root-ca-file. It restarts
// nothing: the plan's next commands do.
func runTrustCertificateAuthorities(ctx context.Context, env *Env, c *v1alpha1.TrustCertificateAuthoritiesCommand) (Result, error) {
	if env.DryRun && cakeys.Unprepared(env.Host.Files) {
		step := "trust-both"
		if c.Trust == v1alpha1.TrustNewOnly {
			step = "complete"
		}
		return unpreparedDryRun(env, step, c.Authorities, c.ServiceAccountKey)
	}
	in := cakeys.TrustInput{Operation: env.Operation, Authorities: c.Authorities, ServiceAccountKey: c.ServiceAccountKey}
	apply, waitFor, what := cakeys.TrustBoth, cakeys.ErrNoNewAuthority, "the old and the new authorities"
	cp, err := cakeys.IsControlPlane(env.Host.Files, env.Operation)
	switch c.Trust {
	case v1alpha1.TrustOldAndNew:
	case v1alpha1.TrustNewOnly:
		apply, waitFor, what = cakeys.TrustNewOnly, cakeys.ErrOldStillPublished, "the new authorities alone"
		// Once complete ran, a control plane's staging directory is gone: it is a control plane
		// because it runs static pods.
		cp, err = isControlPlaneForCompletion(env)
	default:
		return Result{}, fmt.Errorf("trustCertificateAuthorities: trust %q: want OldAndNew or NewOnly", c.Trust)
	}
	if err != nil {
		return Result{}, err
	}
	var changes []cakeys.Change
	if cp || !slices.Contains(v1alpha1.OrAllAuthorities(c.Authorities), v1alpha1.AuthorityCluster) {
		changes, err = apply(env.Host.Files, in)
	} else {
		changes, err = trustOnWorker(ctx, env, in, apply, waitFor)
	}
	for _, ch := range changes {
		env.printf("%s\n", ch)
	}
	if err != nil {
		return Result{}, err
	}
	if len(changes) == 0 {
		return Result{Message: "the node trusts " + what + " already; nothing changed"}, nil
	}
	return Result{Message: fmt.Sprintf("the node trusts %s: %d files changed", what, len(changes))}, nil
}

// unpreparedDryRun prints, in a DryRun on a control plane where prepare staged nothing (a whole
// rotation's DryRun), every file step would change (cakeys.UnpreparedDryRun).
func unpreparedDryRun(env *Env, step string, authorities []string, serviceAccountKey bool) (Result, error) {
	lines, err := cakeys.UnpreparedDryRun(env.Host.Files, step, authorities, serviceAccountKey)
	if err != nil {
		return Result{}, err
	}
	env.printf("dry run: prepare staged nothing (it ran as a dry run too); %s would change:\n", step)
	for _, l := range lines {
		env.printf("dry run: would change %s\n", l)
	}
	return Result{Message: fmt.Sprintf("dry run: %s would change %d files once prepare staged the new authorities", step, len(lines))}, nil
}

// isControlPlaneForCompletion: the node holds the operation's staging directory or runs static pods.
func isControlPlaneForCompletion(env *Env) (bool, error) {
	if cp, err := cakeys.IsControlPlane(env.Host.Files, env.Operation); cp || err == nil {
		return cp, err
	} else if got := cakeys.Operation(env.Host.Files); got != "" {
		return false, err
	}
	return true, nil
}

// publishedCAWait bounds how long a worker waits for kube-root-ca.crt to hold the new cluster authority.
const publishedCAWait = 3 * time.Minute

// trustOnWorker waits until the cluster publishes what the step needs in the agent's namespace's
// kube-root-ca.crt (the new cluster authority beside the old, or alone: apply answers waitFor until
// then), then applies it.
func trustOnWorker(ctx context.Context, env *Env, in cakeys.TrustInput, apply func(host.Files, cakeys.TrustInput) ([]cakeys.Change, error), waitFor error) ([]cakeys.Change, error) {
	if env.Client == nil {
		return nil, errors.New("trustCertificateAuthorities on a worker needs the agent's client to read kube-root-ca.crt")
	}
	ctx, cancel := context.WithTimeout(ctx, publishedCAWait)
	defer cancel()
	key := client.ObjectKey{Namespace: env.Namespace, Name: rootCAConfigMap}
	for {
		cm := &corev1.ConfigMap{}
		last := env.Client.Get(ctx, key, cm)
		if last == nil {
			in.NewClusterCA = []byte(cm.Data["ca.crt"])
			changes, err := apply(env.Host.Files, in)
			if !errors.Is(err, waitFor) {
				return changes, err
			}
			if env.DryRun {
				env.printf("dry run: %v\n", err)
				return nil, nil
			}
			last = err
		}
		if err := clock.Sleep(ctx, env.poll()); err != nil {
			if last == nil {
				return nil, fmt.Errorf("waiting for ConfigMap %s to hold the new cluster authority: %w", key, err)
			}
			return nil, fmt.Errorf("waiting for ConfigMap %s to hold the new cluster authority: %w (last: %w)", key, err, last)
		}
	}
}

// rootCAConfigMap is the ConfigMap the controller-manager writes into every namespace from its --root-ca-file.
const rootCAConfigMap = "kube-root-ca.crt"

// runPublishCertificateAuthorities makes the rotation's cluster-wide changes (cakeys.Publish) with the
// host's admin.conf, as kubeadmUpdateConfig does: the agent's own ServiceAccount stays confined to its
// node (rule 10) and gains no right; the step runs on a control plane, whose disk holds kubeadm's
// cluster-admin credentials already.
func runPublishCertificateAuthorities(ctx context.Context, env *Env, c *v1alpha1.PublishCertificateAuthoritiesCommand) (Result, error) {
	if !slices.Contains(v1alpha1.OrAllAuthorities(c.Authorities), v1alpha1.AuthorityCluster) {
		return Result{Message: "the rotation keeps the cluster authority: nothing to publish"}, nil
	}
	if env.DryRun && c.Trust == v1alpha1.TrustOldAndNew && cakeys.Unprepared(env.Host.Files) {
		env.printf("dry run: prepare staged nothing (it ran as a dry run too), so no new cluster authority exists to publish: would write kube-public/cluster-info's certificate-authority-data as the old and the new cluster authority, wait until every namespace's kube-root-ca.crt and every token Secret's ca.crt hold both, and restart kube-proxy and CoreDNS\n")
		return Result{Message: "dry run: would change cluster-info and restart kube-proxy and CoreDNS once prepare staged the new cluster authority"}, nil
	}
	ca, err := cakeys.PublishedClusterCA(env.Host.Files, env.Operation, c.Trust)
	if err != nil {
		return Result{}, err
	}
	cl, err := adminClient(env)
	if err != nil {
		return Result{}, err
	}
	changed, err := cakeys.Publish(ctx, cl, cakeys.PublishInput{Operation: env.Operation, Trust: c.Trust, CA: ca,
		DryRun: env.DryRun, Poll: env.poll(), Out: env.Out, Note: env.Note})
	if err != nil {
		return Result{}, err
	}
	msg := "the cluster publishes " + strings.Join(cakeys.Trusted(ca), ", ")
	if env.DryRun {
		return Result{Message: "dry run: would change " + listOrNone(changed) + "; " + msg + " once the controller-managers do"}, nil
	}
	return Result{Message: msg + "; changed " + listOrNone(changed)}, nil
}

// runReissueCertificates (phase re-issue) issues the node's certificates again from the new
// authorities. A control plane signs them itself with the staged authorities, which then replace the
// old in /etc/kubernetes/pki (cakeys.Reissue); a worker, which holds no authority's key, asks the
// cluster for its kubelet's client certificate with the kubelet's own credentials
// (reissueKubeletClient). No key is printed: each line names a file and its old and new issuer.
func runReissueCertificates(ctx context.Context, env *Env, c *v1alpha1.ReissueCertificatesCommand) (Result, error) {
	if env.DryRun && cakeys.Unprepared(env.Host.Files) {
		return unpreparedDryRun(env, "re-issue", c.Authorities, c.ServiceAccountKey)
	}
	cp, err := cakeys.IsControlPlane(env.Host.Files, env.Operation)
	if err != nil {
		return Result{}, err
	}
	var steps []cakeys.Step
	switch {
	case cp:
		steps, err = cakeys.Reissue(env.Host.Files, cakeys.ReissueInput{Operation: env.Operation, Authorities: c.Authorities,
			ServiceAccountKey: c.ServiceAccountKey, Now: time.Now(), NodeName: env.NodeName}, env.DryRun)
	case slices.Contains(v1alpha1.OrAllAuthorities(c.Authorities), v1alpha1.AuthorityCluster):
		if env.DryRun && cakeys.WorkerUntrusted(env.Host.Files) {
			lines, err := cakeys.UnpreparedWorkerDryRun(env.Host.Files, env.NodeName)
			if err != nil {
				return Result{}, err
			}
			env.printf("dry run: trust-both wrote nothing (it ran as a dry run too); re-issue would change:\n")
			for _, l := range lines {
				env.printf("dry run: would change %s\n", l)
			}
			return Result{Message: fmt.Sprintf("dry run: re-issue would change %d files once trust-both made the node trust the new authority", len(lines))}, nil
		}
		steps, err = reissueKubeletClient(ctx, env)
	default:
		return Result{Message: "a worker holds no certificate of the " + strings.Join(c.Authorities, ", ") + " authorities; nothing to re-issue"}, nil
	}
	if err != nil {
		return Result{}, err
	}
	counts := map[string]int{}
	for _, s := range steps {
		if env.DryRun {
			env.printf("dry run: would change %s\n", s)
		} else {
			env.printf("%s\n", s)
		}
		counts[s.State]++
	}
	msg := fmt.Sprintf("%d certificates issued by the new authorities, %d installed as an interrupted run recorded them, %d kept (issued by them already)",
		counts["issue"], counts["install"], counts["kept"])
	if counts["replace"] > 0 {
		msg = fmt.Sprintf("%d authority files replaced by the new; ", counts["replace"]) + msg
	}
	return Result{Message: msg}, nil
}

// kubeletClientSigner is the signer of kubelets' client certificates, which the controller-manager's
// csrapproving controller approves for a node renewing its own (the kubelet's rotation uses it).
const kubeletClientSigner = "kubernetes.io/kube-apiserver-client-kubelet"

// reissueKubeletClient asks the cluster for a new kubelet client certificate as the kubelet's own
// rotation does: a CertificateSigningRequest made with the kubelet's current credentials (from
// kubelet.conf), for the same node, which the csrapproving controller approves as a node's renewal of
// its own client certificate and the controller-manager signs with the new ca.crt. The request's key is
// recorded on the host before the request is made and the request is named after it, so a resumed
// run waits for the same request rather than making another.
func reissueKubeletClient(ctx context.Context, env *Env) ([]cakeys.Step, error) {
	req, step, err := cakeys.PrepareKubeletRequest(env.Host.Files, env.Operation, env.NodeName, env.DryRun)
	if err != nil {
		return nil, err
	}
	if step != nil {
		return []cakeys.Step{*step}, nil
	}
	if env.DryRun {
		return []cakeys.Step{{Path: req.Target.Path, State: "issue", Before: req.Before, Serial: "new",
			After: fmt.Sprintf("the cluster's signer %s, which must sign with the new %s (CertificateSigningRequest %s as %s)",
				kubeletClientSigner, cakeys.Trusted(pemOf(req.NewCA))[0], req.Name, req.CommonName)}}, nil
	}
	rc, err := cakeys.KubeletRESTConfig(env.Host.Files)
	if err != nil {
		return nil, err
	}
	// One request per poll: client-go's limiter adds nothing but a refusal near the deadline.
	rc.QPS = -1
	kc, err := client.New(rc, client.Options{})
	if err != nil {
		return nil, fmt.Errorf("a client with the kubelet's credentials: %w", err)
	}
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: req.Name, Labels: map[string]string{
			v1alpha1.LabelOperation: objname.LabelValue(env.Operation), v1alpha1.LabelNode: objname.LabelValue(env.NodeName)}},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: req.Request, SignerName: kubeletClientSigner,
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}},
	}
	if err := kc.Create(ctx, csr); apierrors.IsAlreadyExists(err) {
		if err := kc.Get(ctx, client.ObjectKey{Name: req.Name}, csr); err != nil {
			return nil, fmt.Errorf("reading CertificateSigningRequest %s: %w", req.Name, err)
		}
		if !req.SamePublicKey(csr.Spec.Request) {
			return nil, fmt.Errorf("CertificateSigningRequest %s exists for another key: not this run's request", req.Name)
		}
	} else if err != nil {
		return nil, fmt.Errorf("asking for a new kubelet client certificate (CertificateSigningRequest %s) with the kubelet's credentials: %w", req.Name, err)
	}
	if env.Note != nil {
		env.Note("waiting for CertificateSigningRequest " + req.Name + " to be approved and signed")
	}
	for {
		for _, c := range csr.Status.Conditions {
			if (c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed) && c.Status == corev1.ConditionTrue {
				return nil, fmt.Errorf("CertificateSigningRequest %s %s: %s", req.Name, c.Reason, c.Message)
			}
		}
		if len(csr.Status.Certificate) > 0 {
			s, err := req.Complete(env.Host.Files, csr.Status.Certificate)
			if err != nil {
				return nil, err
			}
			return []cakeys.Step{s}, nil
		}
		err := clock.Sleep(ctx, env.poll())
		if err == nil {
			err = kc.Get(ctx, client.ObjectKey{Name: req.Name}, csr)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("waiting for CertificateSigningRequest %s to be approved and signed (the controller-manager's csrapproving controller approves a node's own client certificate; a run again waits for the same request): %w", req.Name, ctx.Err())
		}
		if err != nil {
			return nil, fmt.Errorf("reading CertificateSigningRequest %s: %w", req.Name, err)
		}
	}
}

func pemOf(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}
