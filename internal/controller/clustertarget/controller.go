// Package clustertarget is the ClusterTarget controller: it observes the cluster's versions and
// certificate expiry into the one ClusterTarget's status and generates, one at a time, the
// NodeOperations (upgrades, certificate renewals) that bring the cluster to its spec.
//
// It writes only the ClusterTarget (its status, and the object once at install, never over a person's
// edit) and the NodeOperations it generates; it creates no NodeTask and deletes nothing it generated.
package clustertarget

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/controller/skeleton"
	"github.com/nodeops/nodeops/internal/kubeadmconfig"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/statuswrite"
)

// +kubebuilder:rbac:groups=nodeops.io,resources=clustertargets,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=nodeops.io,resources=clustertargets/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=nodeops.io,resources=clustertargets/finalizers,verbs=update
// +kubebuilder:rbac:groups=nodeops.io,resources=nodeoperations,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=nodeops.io,resources=nodetasks,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch,namespace=kube-system
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch,namespace=kube-system

const kind = "ClusterTarget"

// KubeadmConfig is where kubeadm keeps the cluster's configuration.
var KubeadmConfig = types.NamespacedName{Namespace: "kube-system", Name: "kubeadm-config"}

// Reconciler reconciles the ClusterTarget.
type Reconciler struct {
	// Client reads nodes, tasks, operations and the ClusterTarget from the manager's cache and writes.
	Client client.Client
	// System reads kube-system's kubeadm-config and control-plane mirror pods, from a cache of
	// those alone (see SetupWithManager).
	System client.Reader
	// NodesInterval batches status writes that only change status.nodes (nodes joining, a
	// kubelet restarting onto a new version while nothing else moves): at most one per interval,
	// so that creating thousands of nodes does not rewrite a large status thousands of times.
	NodesInterval time.Duration
	// Now is the clock; the machine's when nil.
	Now clock.Func

	status statuswrite.Throttle
}

func (r *Reconciler) now() time.Time { return r.Now.Now() }

type scope struct {
	ct     *v1alpha1.ClusterTarget
	before *v1alpha1.ClusterTargetStatus
	in     input
	d      decision
}

// Reconcile follows the skeleton: get, observe, decide, write status, act. No finalizer: the
// generated operations carry an owner reference and nothing needs undoing.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if req.Name != v1alpha1.ClusterTargetName {
		return ctrl.Result{}, nil
	}
	ct := &v1alpha1.ClusterTarget{}
	if err := r.Client.Get(ctx, req.NamespacedName, ct); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !ct.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	s := &scope{ct: ct, before: ct.Status.DeepCopy()}
	return skeleton.Run(ctx, s, skeleton.Steps[*scope]{
		Observe:     r.observe,
		Decide:      func(s *scope) { s.d = decide(&s.in) },
		WriteStatus: r.writeStatus,
		Act:         r.act,
	})
}

// observe reads the cluster version, every node's versions, the control planes' static pod
// versions, the certificate readings of tasks, the operations the ClusterTarget controls, and the
// unfinished built-in operations made by hand.
func (r *Reconciler) observe(ctx context.Context, s *scope) error {
	s.in = input{ct: s.ct, now: r.now(), ops: map[string]opView{},
		opKinds: map[string]v1alpha1.GeneratedOperationKind{}, opVersions: map[string]string{},
		others: map[v1alpha1.GeneratedOperationKind]string{}}
	v, problem, err := ClusterVersion(ctx, r.System)
	if err != nil {
		return err
	}
	s.in.clusterVersion, s.in.versionProblem = v, problem
	if s.in.reconfigure, s.in.reconfigureProblem, err = ReconfigurePending(ctx, r.System, s.ct); err != nil {
		return err
	}

	// Read-only lists (no deep copy): observe copies what it keeps.
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	var pods corev1.PodList
	if err := r.System.List(ctx, &pods, client.InNamespace(KubeadmConfig.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list kube-system pods: %w", err)
	}
	s.in.nodes = observeNodes(nodes.Items, pods.Items)

	var tasks v1alpha1.NodeTaskList
	if err := r.Client.List(ctx, &tasks, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list tasks: %w", err)
	}
	ca, err := readCAValidity(ctx, r.System)
	if err != nil {
		return err
	}
	s.in.certs = observeCertificates(nodes.Items, tasks.Items, ca)
	s.in.drift = observeDrift(nodes.Items)

	var ops v1alpha1.NodeOperationList
	if err := r.Client.List(ctx, &ops); err != nil {
		return fmt.Errorf("list operations: %w", err)
	}
	sort.Slice(ops.Items, func(i, j int) bool {
		a, b := ops.Items[i].CreationTimestamp, ops.Items[j].CreationTimestamp
		return a.Before(&b) || a.Equal(&b) && ops.Items[i].Name < ops.Items[j].Name
	})
	for i := range ops.Items {
		op := &ops.Items[i]
		k, builtIn := kindOf(op)
		if skeleton.ControllerUID(op, kind) != s.ct.UID {
			if builtIn && !op.Status.Phase.Finished() && s.in.others[k] == "" {
				s.in.others[k] = op.Name
			}
			continue
		}
		s.in.ops[op.Name] = viewOf(op)
		s.in.opOrder = append(s.in.opOrder, op.Name)
		s.in.opKinds[op.Name] = k
		if op.Spec.Upgrade != nil {
			s.in.opVersions[op.Name] = op.Spec.Upgrade.KubernetesVersion
		}
	}
	return nil
}

// ClusterVersion reads kubeadm-config's kubernetesVersion; when it is unknown, problem says why.
func ClusterVersion(ctx context.Context, c client.Reader) (v, problem string, err error) {
	var cm corev1.ConfigMap
	if err := c.Get(ctx, KubeadmConfig, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return "", "kube-system/kubeadm-config not found: the cluster's version is unknown", nil
		}
		return "", "", fmt.Errorf("read kube-system/kubeadm-config: %w", err)
	}
	v, perr := plan.KubeadmConfigVersion(cm.Data["ClusterConfiguration"])
	if perr != nil {
		return "", "kube-system/kubeadm-config: " + perr.Error(), nil
	}
	return v, "", nil
}

// KubeletConfig is where kubeadm keeps the kubelet's configuration for every node.
var KubeletConfig = types.NamespacedName{Namespace: "kube-system", Name: "kubelet-config"}

// ReconfigurePending names what kubeadm-config and kubelet-config lack of the ClusterTarget's
// controlPlane and kubelet sections (empty when they hold them, or the target has none); problem
// says why it cannot tell (a ConfigMap missing, a ClusterConfiguration kubeadm no longer writes).
func ReconfigurePending(ctx context.Context, c client.Reader, ct *v1alpha1.ClusterTarget) (pending []string, problem string, err error) {
	check := func(key types.NamespacedName, field string, patch func(string) (string, error)) (bool, string, error) {
		var cm corev1.ConfigMap
		if err := c.Get(ctx, key, &cm); err != nil {
			if apierrors.IsNotFound(err) {
				return false, fmt.Sprintf("kube-system/%s not found", key.Name), nil
			}
			return false, "", fmt.Errorf("read kube-system/%s: %w", key.Name, err)
		}
		text, ok := cm.Data[field]
		if !ok {
			return false, fmt.Sprintf("kube-system/%s has no %s", key.Name, field), nil
		}
		patched, perr := patch(text)
		if perr != nil {
			return false, fmt.Sprintf("kube-system/%s: %v", key.Name, perr), nil
		}
		return patched != text, "", nil
	}
	if p := ct.Spec.ControlPlane; p != nil {
		differs, problem, err := check(KubeadmConfig, "ClusterConfiguration", func(s string) (string, error) { return kubeadmconfig.PatchClusterConfiguration(s, p) })
		if err != nil || problem != "" {
			return nil, problem, err
		}
		if differs {
			pending = append(pending, "kubeadm-config ("+strings.Join(p.Sections(), ", ")+")")
		}
	}
	if k := ct.Spec.Kubelet; k != nil {
		differs, problem, err := check(KubeletConfig, "kubelet", func(s string) (string, error) { return kubeadmconfig.PatchKubeletConfiguration(s, k.Configuration) })
		if err != nil || problem != "" {
			return nil, problem, err
		}
		if differs {
			pending = append(pending, "kubelet-config")
		}
	}
	return pending, "", nil
}

// ReconfigureHash names what the ClusterTarget's controlPlane and kubelet sections ask for.
func ReconfigureHash(ct *v1alpha1.ClusterTarget) string {
	b, _ := json.Marshal([]any{ct.Spec.ControlPlane, ct.Spec.Kubelet})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:10]
}

// kindOf is what op does, as a generated operation's kind; false for a custom operation (counted as
// a renewal when the ClusterTarget generated it, as before rotations and reconfigures existed).
func kindOf(op *v1alpha1.NodeOperation) (v1alpha1.GeneratedOperationKind, bool) {
	switch {
	case op.Spec.Upgrade != nil:
		return v1alpha1.GeneratedUpgrade, true
	case op.Spec.Reconfigure != nil:
		return v1alpha1.GeneratedReconfigure, true
	case op.Spec.RotateCertificateAuthorities != nil:
		return v1alpha1.GeneratedRotateCertificateAuthorities, true
	case op.Spec.RenewCertificates != nil:
		return v1alpha1.GeneratedRenewCertificates, true
	}
	return v1alpha1.GeneratedRenewCertificates, false
}

// rotationPhase is the phase of a rotation's first group not yet succeeded; "" for another
// operation, or a rotation whose groups all succeeded or are not yet listed.
func rotationPhase(op *v1alpha1.NodeOperation) string {
	if op.Spec.RotateCertificateAuthorities == nil {
		return ""
	}
	for _, g := range op.Status.Groups {
		if g.Phase != v1alpha1.GroupSucceeded {
			return plan.RotationPhaseOf(g.Name)
		}
	}
	return ""
}

// reasonWaitingForGate is the NodeOperation controller's Progressing reason while a gate holds
// its current group (nodeoperation.ReasonWaitingForGate).
const reasonWaitingForGate = "WaitingForGate"

// awaitingApproval reports whether a rotation waits at its gate complete-rotation.
func awaitingApproval(op *v1alpha1.NodeOperation) bool {
	c := meta.FindStatusCondition(op.Status.Conditions, v1alpha1.ConditionProgressing)
	if op.Spec.RotateCertificateAuthorities == nil || c == nil || c.Status != metav1.ConditionTrue || c.Reason != reasonWaitingForGate {
		return false
	}
	for _, g := range op.Status.Gates {
		if g.Group == plan.GroupCACompleteControlPlanes && g.Name == plan.GateCompleteRotation && g.State == v1alpha1.GateWaiting {
			return true
		}
	}
	return false
}

func viewOf(op *v1alpha1.NodeOperation) opView {
	v := opView{Phase: op.Status.Phase, Mode: op.Spec.ExecutionMode, Completion: op.Status.CompletionTime,
		RotationPhase: rotationPhase(op), AwaitingApproval: awaitingApproval(op)}
	for _, t := range []string{v1alpha1.ConditionBlocked, v1alpha1.ConditionFailed} {
		if c := meta.FindStatusCondition(op.Status.Conditions, t); c != nil && c.Status == metav1.ConditionTrue {
			v.Reason, v.Message = c.Reason, c.Message
			break
		}
	}
	if v.Completion != nil {
		// Seconds, as the history keeps it: a status round trip must compare equal.
		t := metav1.NewTime(v.Completion.Rfc3339Copy().Time)
		v.Completion = &t
	}
	return v
}

// mirrorAnnotation marks a mirror pod, the API server's copy of a static pod.
const mirrorAnnotation = "kubernetes.io/config.mirror"

// observeNodes is every node's kubelet version and, on control planes, the version (image tag)
// of each static pod's mirror pod, sorted by node name.
func observeNodes(nodes []corev1.Node, pods []corev1.Pod) []v1alpha1.ObservedNode {
	static := map[string]map[string]string{}
	for i := range pods {
		p := &pods[i]
		comp := p.Labels["component"]
		if _, mirror := p.Annotations[mirrorAnnotation]; !mirror || comp == "" || p.Spec.NodeName == "" || len(p.Spec.Containers) == 0 {
			continue
		}
		if static[p.Spec.NodeName] == nil {
			static[p.Spec.NodeName] = map[string]string{}
		}
		static[p.Spec.NodeName][comp] = imageTag(p.Spec.Containers[0].Image)
	}
	out := make([]v1alpha1.ObservedNode, 0, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		_, cp := n.Labels[plan.LabelControlPlane]
		out = append(out, v1alpha1.ObservedNode{Name: n.Name, KubeletVersion: n.Status.NodeInfo.KubeletVersion, ControlPlane: cp, StaticPods: static[n.Name]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	if len(out) == 0 {
		return nil
	}
	return out
}

// imageTag is the tag of an image reference, without a digest: registry.k8s.io/kube-apiserver:v1.37.2 -> v1.37.2.
func imageTag(image string) string {
	image, _, _ = strings.Cut(image, "@")
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		return ""
	}
	return image[i+1:]
}

// observeCertificates is, per control plane, its certificates' expiry: what its agent last read
// into the node's annotation (v1alpha1.AnnotationCertificates), or what its newest succeeded task
// that reported any (renewals and upgrades do) says, whichever expires later: renewing only moves
// expiry later, and the agent reads again only on its slow interval, so right after a renewal
// the task's reading is the newer one. Only nodes the manager sees labelled control plane count:
// any agent may annotate its own Node, but no kubelet or agent may give its Node that label. A
// reading that ca shows impossible is kept with its problem and counts for nothing. Sorted by node.
func observeCertificates(nodes []corev1.Node, tasks []v1alpha1.NodeTask, ca caValidity) []v1alpha1.ObservedCertificates {
	controlPlane := map[string]bool{}
	for i := range nodes {
		if _, cp := nodes[i].Labels[plan.LabelControlPlane]; cp {
			controlPlane[nodes[i].Name] = true
		}
	}
	newest := map[string]*v1alpha1.NodeTask{}
	for i := range tasks {
		t := &tasks[i]
		if t.Status.Phase != v1alpha1.TaskSucceeded || len(t.Status.Certificates) == 0 || !controlPlane[t.Spec.NodeName] {
			continue
		}
		if o := newest[t.Spec.NodeName]; o == nil || completion(o).Before(completion(t)) || completion(o).Equal(completion(t)) && o.Name < t.Name {
			newest[t.Spec.NodeName] = t
		}
	}
	byNode := map[string]v1alpha1.ObservedCertificates{}
	for node, t := range newest {
		byNode[node] = v1alpha1.ObservedCertificates{Node: node, Task: t.Name, Certificates: sortedCertificates(t.Status.Certificates)}
	}
	for i := range nodes {
		n := &nodes[i]
		value, ok := n.Annotations[v1alpha1.AnnotationCertificates]
		if !ok || !controlPlane[n.Name] {
			continue
		}
		certs, err := v1alpha1.DecodeCertificates(value)
		if err != nil || len(certs) == 0 {
			continue // an unreadable reading is no reading; the agent writes a good one at its next check
		}
		// The authorities are the agent's reading alone (tasks report leaves), whichever leaves win.
		leaves, authorities := v1alpha1.SplitCertificateAuthorities(certs)
		read := v1alpha1.ObservedCertificates{Node: n.Name, Certificates: sortedCertificates(leaves)}
		if len(authorities) > 0 {
			read.CertificateAuthorities = sortedCertificates(authorities)
		}
		if fromTask, ok := byNode[n.Name]; ok && (len(leaves) == 0 || firstExpiry(fromTask.Certificates).After(firstExpiry(read.Certificates).Time)) {
			fromTask.CertificateAuthorities = read.CertificateAuthorities
			byNode[n.Name] = fromTask
			continue
		}
		if len(leaves) == 0 {
			continue
		}
		byNode[n.Name] = read
	}
	out := make([]v1alpha1.ObservedCertificates, 0, len(byNode))
	for _, o := range byNode {
		o.Problem = ca.check(o.Certificates)
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	if len(out) == 0 {
		return nil
	}
	return out
}

// observeDrift is, per node whose agent has recorded one, its drift reading
// (v1alpha1.AnnotationDrift), sorted by node. As with certificates, only nodes the manager sees
// labelled control plane may report on static pods: any agent may annotate its own Node, but no
// kubelet or agent may give its Node that label, so a worker's report of control-plane components
// is dropped and only its kubelet's counts (agents confined to their own node, rule 10).
func observeDrift(nodes []corev1.Node) []v1alpha1.ObservedDrift {
	var out []v1alpha1.ObservedDrift
	for i := range nodes {
		n := &nodes[i]
		value, ok := n.Annotations[v1alpha1.AnnotationDrift]
		if !ok {
			continue
		}
		_, controlPlane := n.Labels[plan.LabelControlPlane]
		o := v1alpha1.ObservedDrift{Node: n.Name}
		reading, err := v1alpha1.DecodeDrift(value)
		switch {
		case err != nil:
			o.Problem = err.Error()
		case reading.Error != "":
			o.Problem = reading.Error
		}
		for _, c := range reading.Components {
			if c.Component != v1alpha1.DriftKubelet && !controlPlane {
				continue
			}
			o.Components = append(o.Components, c)
		}
		o.Drifted = len(o.Components) > 0
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// RootCAConfigMap is the cluster CA bundle the controller-manager publishes in every namespace
// (from kubeadm's ca.crt); kube-system's copy bounds what a reading of leaf certificates can say.
const RootCAConfigMap = "kube-root-ca.crt"

// caValidity is when the cluster's CAs are valid: from the earliest notBefore to the latest
// notAfter of the bundle (two CAs while one is rotated); zero when the bundle is unknown.
type caValidity struct {
	notBefore, notAfter time.Time
}

// clusterCASigned are the certificates `kubeadm certs check-expiration` lists that the cluster CA
// signs; etcd's and the front proxy's have CAs of their own, which no object publishes.
var clusterCASigned = map[string]bool{
	"admin.conf": true, "super-admin.conf": true, "apiserver": true, "apiserver-kubelet-client": true,
	"controller-manager.conf": true, "scheduler.conf": true,
}

// check says why a reading cannot be true, or "": a leaf certificate lives within its CA's
// validity (kubeadm issues it while the CA is valid, and a chain is valid only while its CA is).
func (ca caValidity) check(certs []v1alpha1.CertificateExpiry) string {
	if ca.notAfter.IsZero() {
		return ""
	}
	for _, c := range certs {
		if !clusterCASigned[c.Name] {
			continue
		}
		// A minute either way: readings are rounded to seconds, kubeadm's text output to minutes.
		if c.NotAfter.Time.After(ca.notAfter.Add(time.Minute)) || c.NotAfter.Time.Before(ca.notBefore.Add(-time.Minute)) {
			return fmt.Sprintf("out of range: %s expires at %s, outside the cluster CA's validity %s to %s (kube-system/%s); this reading counts for nothing",
				c.Name, c.NotAfter.UTC().Format(time.RFC3339), ca.notBefore.UTC().Format(time.RFC3339), ca.notAfter.UTC().Format(time.RFC3339), RootCAConfigMap)
		}
	}
	return ""
}

// readCAValidity reads the cluster CA bundle; zero when it is missing or unreadable (the
// controller-manager publishes it), which leaves readings unchecked.
func readCAValidity(ctx context.Context, c client.Reader) (caValidity, error) {
	var cm corev1.ConfigMap
	err := c.Get(ctx, types.NamespacedName{Namespace: KubeadmConfig.Namespace, Name: RootCAConfigMap}, &cm)
	if apierrors.IsNotFound(err) {
		return caValidity{}, nil
	}
	if err != nil {
		return caValidity{}, fmt.Errorf("read kube-system/%s: %w", RootCAConfigMap, err)
	}
	var v caValidity
	rest := []byte(cm.Data["ca.crt"])
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return v, nil
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil || !cert.IsCA {
			continue
		}
		if v.notBefore.IsZero() || cert.NotBefore.Before(v.notBefore) {
			v.notBefore = cert.NotBefore
		}
		if cert.NotAfter.After(v.notAfter) {
			v.notAfter = cert.NotAfter
		}
	}
}

// sortedCertificates copies a reading, whole seconds, sorted by name.
func sortedCertificates(in []v1alpha1.CertificateExpiry) []v1alpha1.CertificateExpiry {
	certs := make([]v1alpha1.CertificateExpiry, len(in))
	for i, c := range in {
		certs[i] = v1alpha1.CertificateExpiry{Name: c.Name, NotAfter: metav1.NewTime(c.NotAfter.Rfc3339Copy().Time)}
	}
	sort.Slice(certs, func(i, j int) bool { return certs[i].Name < certs[j].Name })
	return certs
}

func completion(t *v1alpha1.NodeTask) time.Time {
	if t.Status.CompletionTime != nil {
		return t.Status.CompletionTime.Time
	}
	return t.CreationTimestamp.Time
}

// statusRule: the status records the operations generated, the intent act carries out, so it
// is written with a lock, never over a newer one from a stale cache.
var statusRule = statuswrite.Rule{Kind: kind, Lock: true, Owned: []string{
	v1alpha1.ConditionUpToDate, v1alpha1.ConditionReady, v1alpha1.ConditionProgressing,
	v1alpha1.ConditionReconciling, v1alpha1.ConditionBlocked, v1alpha1.ConditionStalled,
}}

// writeStatus writes the status only when it changed; a change of status.nodes alone waits for
// NodesInterval.
func (r *Reconciler) writeStatus(ctx context.Context, s *scope) (ctrl.Result, error) {
	if equality.Semantic.DeepEqual(s.before, &s.d.status) {
		return ctrl.Result{}, nil
	}
	orig := s.ct.DeepCopy()
	s.ct.Status = s.d.status
	wrote, res, err := statuswrite.Write(ctx, r.Client, statusRule, &r.status, statuswrite.Change{
		Orig: orig, Obj: s.ct, Urgent: !onlyNodes(s.before, &s.d.status), Interval: r.NodesInterval, Now: r.now(),
	})
	if wrote != statuswrite.Wrote {
		s.ct.Status = orig.Status
	}
	return res, err
}

// onlyNodes reports whether before and after differ in status.nodes alone.
func onlyNodes(before, after *v1alpha1.ClusterTargetStatus) bool {
	a, b := before.DeepCopy(), after.DeepCopy()
	a.Nodes, b.Nodes = nil, nil
	return equality.Semantic.DeepEqual(a, b)
}

// act creates the operation the status now records, and asks to look again when certificates
// fall within renewBefore.
func (r *Reconciler) act(ctx context.Context, s *scope) (ctrl.Result, error) {
	var result ctrl.Result
	if !s.d.recheck.IsZero() {
		result = skeleton.Within(result, min(s.d.recheck.Sub(r.now()), 12*time.Hour))
	}
	if s.d.create == nil {
		return result, nil
	}
	op := Operation(s.ct, s.d.create)
	if err := controllerutil.SetControllerReference(s.ct, op, r.Client.Scheme()); err != nil {
		return ctrl.Result{}, fmt.Errorf("own NodeOperation %s: %w", op.Name, err)
	}
	err := r.Client.Create(ctx, op)
	if apierrors.IsAlreadyExists(err) {
		var existing v1alpha1.NodeOperation
		if err := r.Client.Get(ctx, client.ObjectKeyFromObject(op), &existing); apierrors.IsNotFound(err) {
			// Created by an earlier reconcile and not in the cache yet: its event comes.
			return result, nil
		} else if err != nil {
			return ctrl.Result{}, fmt.Errorf("read NodeOperation %s: %w", op.Name, err)
		}
		if skeleton.ControllerUID(&existing, kind) != s.ct.UID {
			return ctrl.Result{}, reconcile.TerminalError(fmt.Errorf("NodeOperation %s exists and is not the ClusterTarget's: rename or delete it", op.Name))
		}
		return result, nil
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("create NodeOperation %s: %w", op.Name, err)
	}
	return result, nil
}

// Operation is the NodeOperation g stands for, built from the ClusterTarget's spec (without the
// owner reference act adds). The CLI builds it too, to show the plan of what would run next.
func Operation(ct *v1alpha1.ClusterTarget, g *v1alpha1.GeneratedOperation) *v1alpha1.NodeOperation {
	op := &v1alpha1.NodeOperation{
		ObjectMeta: metav1.ObjectMeta{Name: g.Name, Labels: map[string]string{LabelClusterTarget: ct.Name}},
		Spec:       v1alpha1.NodeOperationSpec{ExecutionMode: g.ExecutionMode, Scheduling: *ct.Spec.Scheduling.DeepCopy()},
	}
	u := ct.Spec.Upgrade
	switch g.Kind {
	case v1alpha1.GeneratedUpgrade:
		op.Spec.Upgrade = &v1alpha1.UpgradeOperation{
			KubernetesVersion:        g.KubernetesVersion,
			UpgradeKubeletAndKubectl: u.UpgradeKubeletAndKubectl,
			BinarySource:             u.BinarySource.DeepCopy(),
			PackageSource:            u.PackageSource,
			PackageRepository:        u.PackageRepository.DeepCopy(),
			IgnorePreflightErrors:    append([]string(nil), u.IgnorePreflightErrors...),
			// The target's consent to "all", or the generated operation is refused at admission.
			AllowIgnoreAllPreflightErrors: u.AllowIgnoreAllPreflightErrors,
			Drain:                         u.Drain.DeepCopy(),
		}
		if u.MaxUnavailable != nil {
			m := *u.MaxUnavailable
			op.Spec.MaxUnavailable = &m
		}
	case v1alpha1.GeneratedReconfigure:
		r := &v1alpha1.ReconfigureOperation{ClusterConfiguration: ct.Spec.ControlPlane.DeepCopy()}
		if k := ct.Spec.Kubelet; k != nil {
			r.KubeletConfiguration, r.Drain = k.Configuration, k.Drain.DeepCopy()
		}
		op.Spec.Reconfigure = r
		if u.MaxUnavailable != nil {
			m := *u.MaxUnavailable
			op.Spec.MaxUnavailable = &m
		}
	case v1alpha1.GeneratedRotateCertificateAuthorities:
		r := ct.Spec.CertificateAuthorities.RotateCertificateAuthoritiesOperation.DeepCopy()
		if r.Completion == "" {
			r.Completion = v1alpha1.CompletionManual // the API's default, for targets built without the API server
		}
		op.Spec.RotateCertificateAuthorities = r
		// Workers go under it, as in an upgrade's or a reconfigure's worker groups.
		if u.MaxUnavailable != nil {
			m := *u.MaxUnavailable
			op.Spec.MaxUnavailable = &m
		}
	default:
		op.Spec.RenewCertificates = &v1alpha1.RenewCertificatesOperation{}
	}
	return op
}

// LabelClusterTarget marks the operations a ClusterTarget generated.
const LabelClusterTarget = "nodeops.io/cluster-target"

// Next is what the ClusterTarget would generate next from its status and the cluster as it is,
// with the status that decision gives: for `kubectl nodeops target`. The operation is nil when
// nothing is due (or something runs already).
func Next(ct *v1alpha1.ClusterTarget, now time.Time) *v1alpha1.GeneratedOperation {
	in := &input{ct: ct.DeepCopy(), now: now, clusterVersion: ct.Status.KubernetesVersion, versionProblem: "the cluster's version is not observed yet",
		nodes: ct.Status.Nodes, certs: ct.Status.Certificates, ops: map[string]opView{}}
	in.ct.Spec.Paused = false
	for _, g := range ct.Status.Operations {
		if g.Phase != v1alpha1.OperationPhaseDeleted {
			in.ops[g.Name] = opView{Phase: g.Phase, Reason: g.Reason, Mode: g.ExecutionMode, Completion: g.CompletionTime}
		}
	}
	d := decide(in)
	return d.create
}
