package clustertarget

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/schedule"
)

// Condition reasons of a ClusterTarget.
const (
	ReasonUpToDate                 = "UpToDate"
	ReasonOperationRunning         = "OperationRunning"
	ReasonOperationBlocked         = "OperationBlocked"
	ReasonOperationFailed          = "OperationFailed"
	ReasonOperationCreated         = "OperationCreated"
	ReasonPaused                   = "Paused"
	ReasonUpgradeDue               = "UpgradeDue"
	ReasonRotationRequested        = "RotationRequested"
	ReasonCertificatesExpiring     = "CertificatesExpiring"
	ReasonRenewBeforeUnsatisfiable = "RenewBeforeUnsatisfiable"
	ReasonRenewalDidNotMoveExpiry  = "RenewalDidNotMoveExpiry"
	ReasonAwaitingObservedVersion  = "AwaitingObservedVersion"
	ReasonNodesBehind              = "NodesBehind"
	ReasonDryRunSucceeded          = "DryRunSucceeded"
	ReasonNoKubeadmConfig          = "NoKubeadmConfig"
	ReasonInvalidVersion           = "InvalidVersion"
	ReasonInvalidSpec              = "InvalidSpec"
	ReasonNothingToDo              = "NothingToDo"
	ReasonWaitingForWindow         = "WaitingForWindow"
	ReasonInvalidWindows           = "InvalidWindows"
	ReasonReconfigureDue           = "ReconfigureDue"
	ReasonInvalidConfiguration     = "InvalidConfiguration"
	// ReasonCARotationRequested: certificateAuthorities.rotationCount was raised.
	ReasonCARotationRequested = "CertificateAuthorityRotationRequested"
	// ReasonRotationAwaitingApproval: a generated rotation (completion Manual) waits at the gate
	// complete-rotation for a person to check the cluster and approve phase complete.
	ReasonRotationAwaitingApproval = "RotationAwaitingApproval"
	// ReasonRotationUnfinished: the last rotation generated ended without succeeding, so the
	// cluster may trust both the old and the new authorities: nothing but another rotation is
	// generated (no kubeadm upgrade between trust-both and complete).
	ReasonRotationUnfinished = "RotationUnfinished"
	// ReasonOtherOperationRunning: a NodeOperation the ClusterTarget did not generate holds what it
	// would generate (a rotation made by hand holds everything; an upgrade, renewal or reconfigure
	// made by hand holds a rotation).
	ReasonOtherOperationRunning = "OtherOperationRunning"
)

// opView is what decide needs of a generated NodeOperation that exists.
type opView struct {
	Phase v1alpha1.OperationPhase
	// Reason of its Blocked or Failed condition, when it has one.
	Reason, Message string
	Mode            v1alpha1.ExecutionMode
	Completion      *metav1.Time
	// RotationPhase is, for a rotation, the phase of its first group not yet succeeded.
	RotationPhase string
	// AwaitingApproval: a rotation waits at the gate complete-rotation.
	AwaitingApproval bool
}

// input is everything decide reads: the ClusterTarget and what observe found.
type input struct {
	ct  *v1alpha1.ClusterTarget
	now time.Time
	// clusterVersion is kubeadm-config's; versionProblem says why it is unknown.
	clusterVersion string
	versionProblem string
	nodes          []v1alpha1.ObservedNode
	certs          []v1alpha1.ObservedCertificates
	drift          []v1alpha1.ObservedDrift
	// reconfigure names what kube-system's kubeadm-config and kubelet-config lack of spec.controlPlane
	// and spec.kubelet; reconfigureProblem says why that is unknown.
	reconfigure        []string
	reconfigureProblem string
	// ops are the NodeOperations the ClusterTarget controls, by name.
	ops map[string]opView
	// opOrder lists ops by creation, for adopting operations missing from the history.
	opOrder []string
	// opKinds and opVersions describe ops found that the history lacks.
	opKinds    map[string]v1alpha1.GeneratedOperationKind
	opVersions map[string]string
	// others are the unfinished NodeOperations the ClusterTarget does not control (made by hand),
	// one name per kind; custom operations are not counted.
	others map[v1alpha1.GeneratedOperationKind]string
}

// decision is the new status and, at most, one operation to create.
type decision struct {
	status v1alpha1.ClusterTargetStatus
	// create is the history entry whose operation act creates, or nil.
	create *v1alpha1.GeneratedOperation
	// recheck asks for a reconcile at that time (the moment certificates fall within renewBefore,
	// or a maintenance window opens).
	recheck time.Time
	// windowRecheck is when the next maintenance window opens, while generation waits for one.
	windowRecheck time.Time
}

// verdict is decide's conclusion before it becomes conditions.
type verdict struct {
	phase               v1alpha1.ClusterTargetPhase
	upToDate            bool
	reason, message     string
	reconciling, stalls bool
}

// decide is pure: from the observations and the history it computes the status and the one
// operation to generate, if any. Rules, in order: an operation recorded for a raised count
// (certificates' or certificate authorities' rotationCount) but not yet created is created as
// recorded; an unfinished generated operation is waited for (Blocked when it is), and so is a
// rotation made by hand; a certificate authority rotation is generated once per raise of
// certificateAuthorities.rotationCount, before anything else due, once no upgrade, renewal or
// reconfigure made by hand runs; while the last rotation generated ended without succeeding
// nothing else is generated; then an upgrade comes before a reconfigure (kubeadm upgrade keeps the
// configuration), and both before a renewal (kubeadm upgrade renews the certificates anyway); a
// renewal is generated once per raise of certificates.rotationCount; an automatic renewal once
// certificates fall within renewBefore, unless the last renewal left them there; a failed, aborted
// or deleted attempt is tried again only after the spec changed.
//
// A rotation goes first, and nothing else runs from its prepare to its complete, because kubeadm
// upgrade (and a renewal or reconfigure, which rewrite the same kubeconfigs, certificates and
// manifests from ca.crt) between trust-both and complete would undo the bundles and sign with an
// authority about to go (docs/how-to/rotate-cas.md); going first, it is what a person asks for
// when a key leaked or an authority nears its end, it re-issues every certificate (so a renewal
// due is then often met), and the upgrade after it renews from the new authorities.
func decide(in *input) decision {
	ct := in.ct
	st := v1alpha1.ClusterTargetStatus{
		ObservedGeneration: ct.Generation,
		Conditions:         append([]metav1.Condition(nil), ct.Status.Conditions...),
		KubernetesVersion:  in.clusterVersion,
		Nodes:              in.nodes,
		Certificates:       in.certs,
		Drift:              in.drift,
		DriftedNodes:       driftedNodes(in.drift),
		LastRotationCount:  ct.Status.LastRotationCount,
	}
	st.NextCertificateExpiry = nextExpiry(in.certs)
	st.NextCertificateAuthorityExpiry = nextAuthorityExpiry(in.certs)
	st.Operations = history(ct.Status.Operations, in)
	// The count is also in the names of the rotations generated, so a lost status never rotates twice.
	st.LastCertificateAuthorityRotationCount = max(ct.Status.LastCertificateAuthorityRotationCount, rotationCountIn(st.Operations))
	if in.clusterVersion != "" {
		// Shown while a step runs too; due reports the error when there is one.
		st.UpgradePath, _ = plan.UpgradeSteps(in.clusterVersion, ct.Spec.KubernetesVersion, ct.Spec.Upgrade.Path)
	}
	d := decision{}
	v := func() verdict {
		if u := unsent(st.Operations); u != nil {
			// Its count is recorded as acted on: only creating it as recorded keeps the raise
			// from being lost, paused or not (the decision was made before the pause).
			d.create = u
			return verdict{phase: v1alpha1.ClusterProgressing, reason: ReasonOperationCreated, reconciling: true,
				message: fmt.Sprintf("generated NodeOperation %s (recorded before it was created): %s", u.Name, u.Reason)}
		}
		if a := active(st.Operations); a != nil {
			if a.Phase == v1alpha1.OperationBlocked {
				next := "retry or skip its failed task, or abort it"
				if a.Reason == v1alpha1.ReasonNodeHeldByFailedTask {
					next = "retry or skip the other owner's failed task that holds its node (its Blocked condition names it), or abort it"
				}
				return verdict{phase: v1alpha1.ClusterBlocked, reason: ReasonOperationBlocked, stalls: true,
					message: fmt.Sprintf("NodeOperation %s is Blocked (%s): %s", a.Name, a.Reason, next)}
			}
			if a.Kind == v1alpha1.GeneratedRotateCertificateAuthorities && in.ops[a.Name].AwaitingApproval {
				return verdict{phase: v1alpha1.ClusterProgressing, reason: ReasonRotationAwaitingApproval, reconciling: true, message: fmt.Sprintf(
					"NodeOperation %s re-issued every certificate and waits for approval before phase complete drops the old authorities: check the cluster, then kubectl nodeops approve %s --gate %s",
					a.Name, a.Name, plan.GateCompleteRotation)}
			}
			msg := fmt.Sprintf("NodeOperation %s is %s", a.Name, phaseOf(a))
			if a.RotationPhase != "" {
				msg += ", in phase " + a.RotationPhase
			}
			return verdict{phase: v1alpha1.ClusterProgressing, reason: ReasonOperationRunning, reconciling: true, message: msg}
		}
		if name := in.others[v1alpha1.GeneratedRotateCertificateAuthorities]; name != "" {
			return verdict{phase: v1alpha1.ClusterWaiting, reason: ReasonOtherOperationRunning, message: fmt.Sprintf(
				"NodeOperation %s, not generated by the ClusterTarget, rotates the certificate authorities: nothing is generated until it ends (no kubeadm upgrade between trust-both and complete)", name)}
		}
		next, v := due(in, &st)
		if next == nil {
			return v
		}
		if ct.Spec.Paused {
			return verdict{phase: v1alpha1.ClusterPaused, reason: ReasonPaused,
				message: fmt.Sprintf("paused: would generate NodeOperation %s (%s)", next.Name, v.message)}
		}
		if held, w := outsideWindows(ct, in.now); held {
			d.windowRecheck = w.next
			return verdict{phase: v1alpha1.ClusterWaiting, reason: w.reason, stalls: w.stalls,
				message: fmt.Sprintf("would generate NodeOperation %s (%s): %s", next.Name, v.message, w.message)}
		}
		if next.Kind == v1alpha1.GeneratedRenewCertificates && ct.Spec.Certificates.RotationCount > st.LastRotationCount {
			st.LastRotationCount = ct.Spec.Certificates.RotationCount
		}
		if next.Kind == v1alpha1.GeneratedRotateCertificateAuthorities {
			st.LastCertificateAuthorityRotationCount = ct.Spec.CertificateAuthorities.RotationCount
		}
		st.Operations = append(st.Operations, *next)
		d.create = &st.Operations[len(st.Operations)-1]
		return verdict{phase: v1alpha1.ClusterProgressing, reason: ReasonOperationCreated, reconciling: true,
			message: fmt.Sprintf("generated NodeOperation %s: %s", next.Name, v.message)}
	}()
	if len(st.UpgradePath) == 0 {
		st.UpgradePath = nil
	}
	if len(st.Operations) == 0 {
		st.Operations = nil
	}
	st.Phase = v.phase
	setConditions(&st, ct.Generation, v)
	if !in.now.IsZero() && ct.Spec.Certificates.AutoRenew && st.NextCertificateExpiry != nil {
		if at := st.NextCertificateExpiry.Add(-renewBefore(ct)); at.After(in.now) {
			d.recheck = at
		}
	}
	if !d.windowRecheck.IsZero() && (d.recheck.IsZero() || d.windowRecheck.Before(d.recheck)) {
		d.recheck = d.windowRecheck
	}
	d.status = st
	return d
}

// windowState is why a ClusterTarget generates nothing now because of its windows.
type windowState struct {
	reason, message string
	next            time.Time
	stalls          bool
}

// outsideWindows reports whether the target's windows are all closed at now (or cannot be
// evaluated, which holds too: a window never lets work go on by default).
func outsideWindows(ct *v1alpha1.ClusterTarget, now time.Time) (bool, windowState) {
	if len(ct.Spec.Windows) == 0 || now.IsZero() {
		return false, windowState{}
	}
	ws, err := schedule.Compile("spec.windows", ct.Spec.Windows)
	if err != nil {
		return true, windowState{reason: ReasonInvalidWindows, message: err.Error(), stalls: true}
	}
	open, next := ws.At(now)
	if open {
		return false, windowState{}
	}
	when := "no window opens within a year"
	if !next.IsZero() {
		when = "next opens at " + next.UTC().Format(time.RFC3339)
	}
	return true, windowState{reason: ReasonWaitingForWindow, next: next,
		message: fmt.Sprintf("outside its maintenance windows (%s): %s", schedule.DescribeAll(ct.Spec.Windows), when)}
}

// due is the operation to generate next, or nil and the verdict on why nothing is.
func due(in *input, st *v1alpha1.ClusterTargetStatus) (*v1alpha1.GeneratedOperation, verdict) {
	ct := in.ct
	target := ct.Spec.KubernetesVersion
	if in.clusterVersion == "" {
		return nil, verdict{phase: v1alpha1.ClusterWaiting, reason: ReasonNoKubeadmConfig, stalls: true, message: in.versionProblem}
	}
	if n := ct.Spec.CertificateAuthorities.RotationCount; n > st.LastCertificateAuthorityRotationCount {
		why := fmt.Sprintf("certificateAuthorities.rotationCount raised to %d", n)
		for _, k := range []v1alpha1.GeneratedOperationKind{v1alpha1.GeneratedUpgrade, v1alpha1.GeneratedReconfigure, v1alpha1.GeneratedRenewCertificates} {
			if name := in.others[k]; name != "" {
				return nil, verdict{phase: v1alpha1.ClusterWaiting, reason: ReasonOtherOperationRunning, message: fmt.Sprintf(
					"%s: the rotation waits for NodeOperation %s, not generated by the ClusterTarget, to end", why, name)}
			}
		}
		return attempt(in, st.Operations, fmt.Sprintf("%s%d", caRotationPrefix, n), v1alpha1.GeneratedRotateCertificateAuthorities, "", ReasonCARotationRequested, why)
	}
	if r := lastOf(st.Operations, v1alpha1.GeneratedRotateCertificateAuthorities); r != nil && r.Phase != v1alpha1.OperationSucceeded && r.ExecutionMode != v1alpha1.ExecutionDryRun {
		where := ""
		if r.RotationPhase != "" {
			where = " in phase " + r.RotationPhase
		}
		return nil, verdict{phase: v1alpha1.ClusterWaiting, reason: ReasonRotationUnfinished, stalls: true, message: fmt.Sprintf(
			"%s ended %s%s: the cluster may trust both the old and the new authorities, and no upgrade, reconfigure or renewal may run before a rotation completes; finish or back out by hand (docs/how-to/rotate-cas.md#backing-out-before-phase-4), then raise spec.certificateAuthorities.rotationCount to rotate again",
			r.Name, r.Phase, where)}
	}
	steps, err := plan.UpgradeSteps(in.clusterVersion, target, ct.Spec.Upgrade.Path)
	if err != nil {
		reason := ReasonInvalidVersion
		var skew *plan.VersionSkewError
		if errors.As(err, &skew) {
			reason = skew.Reason()
		}
		msg := err.Error()
		if !strings.Contains(msg, in.clusterVersion) || !strings.Contains(msg, target) {
			msg = fmt.Sprintf("cannot go from %s to %s: %s", in.clusterVersion, target, msg)
		}
		return nil, verdict{phase: v1alpha1.ClusterWaiting, reason: reason, stalls: true, message: msg + "; nothing was run"}
	}
	if len(steps) > 0 {
		step := steps[0]
		u := ct.Spec.Upgrade
		binaries := u.PackageSource == "" || u.PackageSource == v1alpha1.PackageSourceBinaries
		if (u.UpgradeKubeletAndKubectl == nil || *u.UpgradeKubeletAndKubectl) && u.BinarySource == nil && binaries {
			return nil, verdict{phase: v1alpha1.ClusterWaiting, reason: ReasonInvalidSpec, stalls: true,
				message: "spec.upgrade.binarySource is required to upgrade to " + step + " while spec.upgrade.upgradeKubeletAndKubectl is true and spec.upgrade.packageSource is binaries"}
		}
		why := fmt.Sprintf("upgrade %s -> %s", in.clusterVersion, step)
		if len(steps) > 1 {
			why += fmt.Sprintf(" (step 1 of %d to %s)", len(steps), target)
		}
		return attempt(in, st.Operations, "cluster-upgrade-"+step, v1alpha1.GeneratedUpgrade, step, ReasonUpgradeDue, why)
	}
	if behind := nodesBehind(in.nodes, target, ct.Spec.Upgrade); len(behind) > 0 {
		shown := behind
		if len(behind) > 3 {
			shown = append(behind[:3:3], fmt.Sprintf("%d more", len(behind)-3))
		}
		msg := fmt.Sprintf("the cluster is at %s but %d nodes (%s) are not", target, len(behind), strings.Join(shown, ", "))
		if last := lastOf(st.Operations, v1alpha1.GeneratedUpgrade); last != nil && last.KubernetesVersion == target && last.Phase == v1alpha1.OperationSucceeded {
			return nil, verdict{phase: v1alpha1.ClusterProgressing, reason: ReasonAwaitingObservedVersion, reconciling: true,
				message: msg + " yet, after " + last.Name + " succeeded"}
		}
		return nil, verdict{phase: v1alpha1.ClusterWaiting, reason: ReasonNodesBehind,
			message: msg + "; nodeops generates upgrades when the cluster version is behind, not for single nodes"}
	}
	if in.reconfigureProblem != "" {
		return nil, verdict{phase: v1alpha1.ClusterWaiting, reason: ReasonInvalidConfiguration, stalls: true, message: in.reconfigureProblem + "; nothing was run"}
	}
	if len(in.reconfigure) > 0 {
		// Named by what it asks for, so a changed spec is a new operation and a met one is never repeated.
		return attempt(in, st.Operations, "cluster-reconfigure-"+ReconfigureHash(ct), v1alpha1.GeneratedReconfigure, "",
			ReasonReconfigureDue, "reconfigure: kube-system's "+strings.Join(in.reconfigure, " and ")+" must change")
	}
	if n := ct.Spec.Certificates.RotationCount; n > st.LastRotationCount {
		return attempt(in, st.Operations, fmt.Sprintf("cluster-rotate-certificates-%d", n), v1alpha1.GeneratedRenewCertificates, "",
			ReasonRotationRequested, fmt.Sprintf("rotationCount raised to %d", n))
	}
	if exp := st.NextCertificateExpiry; ct.Spec.Certificates.AutoRenew && exp != nil && exp.Sub(in.now) < renewBefore(ct) {
		rb := renewBefore(ct)
		prefix := "cluster-renew-certificates-expiring-" + exp.UTC().Format("20060102")
		if last := lastOf(st.Operations, v1alpha1.GeneratedRenewCertificates); last != nil && last.Phase == v1alpha1.OperationSucceeded &&
			last.CompletionTime != nil && strings.HasPrefix(last.Name, prefix+"-") {
			// Generated for this very expiry, succeeded, and the readings did not move: renewing
			// again would do the same, so say so instead of looping.
			return nil, verdict{phase: v1alpha1.ClusterWaiting, reason: ReasonRenewalDidNotMoveExpiry, stalls: true, message: fmt.Sprintf(
				"%s succeeded at %s but the certificates observed (node %s) still expire at %s, as before it ran; check that node's agent and `kubeadm certs check-expiration` there, then change the spec to try again",
				last.Name, last.CompletionTime.UTC().Format(time.RFC3339), earliestNode(in.certs, exp), exp.UTC().Format(time.RFC3339))}
		}
		if last := lastOf(st.Operations, v1alpha1.GeneratedRenewCertificates); last != nil && last.Phase == v1alpha1.OperationSucceeded &&
			last.CompletionTime != nil && exp.Sub(last.CompletionTime.Time) < rb {
			return nil, verdict{phase: v1alpha1.ClusterWaiting, reason: ReasonRenewBeforeUnsatisfiable, stalls: true, message: fmt.Sprintf(
				"after %s succeeded at %s the certificates observed expire at %s, still within renewBefore %s: renewing again cannot satisfy it; lower spec.certificates.renewBefore",
				last.Name, last.CompletionTime.UTC().Format(time.RFC3339), exp.UTC().Format(time.RFC3339), rb)}
		}
		return attempt(in, st.Operations, "cluster-renew-certificates-expiring-"+exp.UTC().Format("20060102"), v1alpha1.GeneratedRenewCertificates, "",
			ReasonCertificatesExpiring, fmt.Sprintf("certificates expire at %s, within renewBefore %s", exp.UTC().Format(time.RFC3339), rb))
	}
	msg := "the cluster is at " + target + " and no renewal is due"
	if ct.Spec.ControlPlane != nil || ct.Spec.Kubelet != nil {
		msg = "the cluster is at " + target + ", its kubeadm configuration holds spec.controlPlane and spec.kubelet, and no renewal is due"
	}
	return nil, verdict{phase: v1alpha1.ClusterUpToDate, upToDate: true, reason: ReasonUpToDate, message: msg}
}

// attempt is the next attempt of the operation named prefix-<n>, or nil and why there is none:
// a succeeded attempt is not repeated (but a dry run is, once the mode is no longer DryRun); a
// failed, aborted or deleted one is repeated only after the spec changed since it was generated.
func attempt(in *input, hist []v1alpha1.GeneratedOperation, prefix string, kind v1alpha1.GeneratedOperationKind, ver, reason, why string) (*v1alpha1.GeneratedOperation, verdict) {
	ct := in.ct
	n, last := 0, (*v1alpha1.GeneratedOperation)(nil)
	for i := range hist {
		if strings.HasPrefix(hist[i].Name, prefix+"-") {
			n++
			last = &hist[i]
		}
	}
	next := &v1alpha1.GeneratedOperation{Name: fmt.Sprintf("%s-%d", prefix, n+1), Kind: kind,
		Reason: reason, KubernetesVersion: ver, Generation: ct.Generation, ExecutionMode: mode(ct)}
	if last == nil {
		return next, verdict{message: why}
	}
	switch {
	case last.Phase == v1alpha1.OperationSucceeded && last.ExecutionMode == v1alpha1.ExecutionDryRun && mode(ct) != v1alpha1.ExecutionDryRun:
		return next, verdict{message: why + ", for real after the dry run " + last.Name}
	case last.Phase == v1alpha1.OperationSucceeded && last.ExecutionMode == v1alpha1.ExecutionDryRun:
		return nil, verdict{phase: v1alpha1.ClusterWaiting, reason: ReasonDryRunSucceeded,
			message: fmt.Sprintf("the dry run %s succeeded (%s); set spec.executionMode to Auto or Controlled to run it", last.Name, why)}
	case last.Phase == v1alpha1.OperationSucceeded:
		return nil, verdict{phase: v1alpha1.ClusterProgressing, reason: ReasonAwaitingObservedVersion, reconciling: true,
			message: fmt.Sprintf("%s succeeded; waiting to observe its result (%s)", last.Name, why)}
	case ct.Generation > last.Generation:
		return next, verdict{message: fmt.Sprintf("%s, again after %s ended %s and the spec changed", why, last.Name, last.Phase)}
	}
	return nil, verdict{phase: v1alpha1.ClusterWaiting, reason: ReasonOperationFailed, stalls: true, message: fmt.Sprintf(
		"%s ended %s (%s); change the spec (for example pause and resume) to try again", last.Name, last.Phase, last.Reason)}
}

// history merges the recorded history with the operations that exist: phases follow the
// operations; an entry seen before whose operation is gone is Deleted (never made again); an
// entry recorded but never seen (phase empty) is dropped, and decide records it again if it is
// still due; an operation the history lacks (status lost) is adopted.
func history(recorded []v1alpha1.GeneratedOperation, in *input) []v1alpha1.GeneratedOperation {
	out := make([]v1alpha1.GeneratedOperation, 0, len(recorded)+1)
	seen := map[string]bool{}
	for _, e := range recorded {
		seen[e.Name] = true
		o, ok := in.ops[e.Name]
		switch {
		case ok:
			e.Phase = o.Phase
			if e.Phase == "" {
				e.Phase = v1alpha1.OperationPending
			}
			if o.Reason != "" {
				e.Reason = o.Reason
			}
			if o.Mode != "" {
				e.ExecutionMode = o.Mode
			}
			e.CompletionTime = o.Completion
			e.RotationPhase = o.RotationPhase
		case e.Phase == "" && !countDriven(&e):
			// decide records it again while it is still due.
			continue
		case e.Phase == "":
			// Kept unseen: its count is recorded as acted on, so decide creates it as recorded.
		default:
			e.Phase = v1alpha1.OperationPhaseDeleted
		}
		out = append(out, e)
	}
	for _, name := range in.opOrder {
		if seen[name] {
			continue
		}
		o := in.ops[name]
		phase := o.Phase
		if phase == "" {
			phase = v1alpha1.OperationPending
		}
		out = append(out, v1alpha1.GeneratedOperation{Name: name, Kind: in.opKinds[name], Phase: phase, Reason: o.Reason,
			KubernetesVersion: in.opVersions[name], ExecutionMode: o.Mode, CompletionTime: o.Completion, RotationPhase: o.RotationPhase})
	}
	return out
}

// caRotationPrefix starts the name of every certificate authority rotation generated:
// cluster-rotate-certificate-authorities-<rotationCount>-<attempt>.
const caRotationPrefix = "cluster-rotate-certificate-authorities-"

// countDriven reports whether g was generated for a raise of a rotationCount, which decide records
// as acted on with it: such an entry is never dropped, or the raise would be lost.
func countDriven(g *v1alpha1.GeneratedOperation) bool {
	return g.Kind == v1alpha1.GeneratedRotateCertificateAuthorities ||
		g.Kind == v1alpha1.GeneratedRenewCertificates && g.Reason == ReasonRotationRequested
}

// unsent is the history entry recorded but whose operation was never seen to exist, if any.
func unsent(hist []v1alpha1.GeneratedOperation) *v1alpha1.GeneratedOperation {
	for i := range hist {
		if hist[i].Phase == "" {
			return &hist[i]
		}
	}
	return nil
}

// rotationCountIn is the highest certificateAuthorities.rotationCount a rotation in hist was
// generated for, read from its name.
func rotationCountIn(hist []v1alpha1.GeneratedOperation) int32 {
	var n int32
	for _, g := range hist {
		rest, ok := strings.CutPrefix(g.Name, caRotationPrefix)
		if !ok || g.Kind != v1alpha1.GeneratedRotateCertificateAuthorities {
			continue
		}
		count, _, _ := strings.Cut(rest, "-")
		if c, err := strconv.ParseInt(count, 10, 32); err == nil && int32(c) > n {
			n = int32(c)
		}
	}
	return n
}

// active is the generated operation not yet finished, if any (there is at most one).
func active(hist []v1alpha1.GeneratedOperation) *v1alpha1.GeneratedOperation {
	for i := range hist {
		if p := hist[i].Phase; p != v1alpha1.OperationPhaseDeleted && !p.Finished() {
			return &hist[i]
		}
	}
	return nil
}

func lastOf(hist []v1alpha1.GeneratedOperation, kind v1alpha1.GeneratedOperationKind) *v1alpha1.GeneratedOperation {
	for i := len(hist) - 1; i >= 0; i-- {
		if hist[i].Kind == kind {
			return &hist[i]
		}
	}
	return nil
}

func phaseOf(g *v1alpha1.GeneratedOperation) string {
	if g.Phase == "" {
		return string(v1alpha1.OperationPending)
	}
	return string(g.Phase)
}

func mode(ct *v1alpha1.ClusterTarget) v1alpha1.ExecutionMode {
	if ct.Spec.ExecutionMode == "" {
		return v1alpha1.ExecutionAuto
	}
	return ct.Spec.ExecutionMode
}

// defaultRenewBefore is the CRD's default, for objects built without the API server.
const defaultRenewBefore = 30 * 24 * time.Hour

func renewBefore(ct *v1alpha1.ClusterTarget) time.Duration {
	if rb := ct.Spec.Certificates.RenewBefore; rb != nil {
		return rb.Duration
	}
	return defaultRenewBefore
}

// nodesBehind names the nodes whose kubelet (when the upgrade replaces kubelets) or control plane
// static pods (etcd aside: it has its own versions) report a version other than target; a
// version not reported is not counted.
func nodesBehind(nodes []v1alpha1.ObservedNode, target string, u v1alpha1.ClusterUpgrade) []string {
	kubelets := u.UpgradeKubeletAndKubectl == nil || *u.UpgradeKubeletAndKubectl
	want, err := version.ParseSemantic(target)
	if err != nil {
		return nil
	}
	differs := func(v string) bool {
		got, err := version.ParseGeneric(v)
		return err == nil && !(got.Major() == want.Major() && got.Minor() == want.Minor() && got.Patch() == want.Patch())
	}
	var out []string
	for _, n := range nodes {
		bad := kubelets && n.KubeletVersion != "" && differs(n.KubeletVersion)
		for comp, v := range n.StaticPods {
			if comp != "etcd" && differs(v) {
				bad = true
			}
		}
		if bad {
			out = append(out, n.Name)
		}
	}
	return out
}

// nextExpiry is the earliest expiry of any certificate observed in a reading without a problem.
func nextExpiry(certs []v1alpha1.ObservedCertificates) *metav1.Time {
	var next *metav1.Time
	for _, n := range certs {
		if n.Problem != "" {
			continue
		}
		if first := firstExpiry(n.Certificates); first != nil && (next == nil || first.Before(next)) {
			next = first
		}
	}
	return next
}

// nextAuthorityExpiry is the earliest certificate authority expiry any control plane reports.
func nextAuthorityExpiry(certs []v1alpha1.ObservedCertificates) *metav1.Time {
	var next *metav1.Time
	for _, n := range certs {
		if first := firstExpiry(n.CertificateAuthorities); first != nil && (next == nil || first.Before(next)) {
			next = first
		}
	}
	return next
}

// earliestNode names the node whose counted reading expires at exp.
func earliestNode(certs []v1alpha1.ObservedCertificates, exp *metav1.Time) string {
	for _, n := range certs {
		if first := firstExpiry(n.Certificates); n.Problem == "" && first != nil && first.Equal(exp) {
			return n.Node
		}
	}
	return "unknown"
}

// firstExpiry is one reading's earliest notAfter; nil for a reading without certificates.
func firstExpiry(certs []v1alpha1.CertificateExpiry) *metav1.Time {
	var first *metav1.Time
	for i := range certs {
		if c := &certs[i]; first == nil || c.NotAfter.Before(first) {
			t := c.NotAfter
			first = &t
		}
	}
	return first
}

// setConditions writes every condition of the verdict; lastTransitionTime moves only when a
// status flips (meta.SetStatusCondition), so an unchanged verdict is an unchanged status.
func setConditions(st *v1alpha1.ClusterTargetStatus, gen int64, v verdict) {
	b := func(ok bool) metav1.ConditionStatus {
		if ok {
			return metav1.ConditionTrue
		}
		return metav1.ConditionFalse
	}
	set := func(t string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen})
	}
	upReason := v.reason
	if v.upToDate {
		upReason = ReasonUpToDate
	}
	set(v1alpha1.ConditionUpToDate, b(v.upToDate), upReason, v.message)
	set(v1alpha1.ConditionReady, b(v.upToDate), upReason, v.message)
	blocked := v.phase == v1alpha1.ClusterBlocked
	progressReason := v.reason
	if !v.reconciling && !blocked && v.phase != v1alpha1.ClusterPaused {
		progressReason = ReasonNothingToDo
	}
	set(v1alpha1.ConditionProgressing, b(v.reconciling), progressReason, v.message)
	set(v1alpha1.ConditionReconciling, b(v.reconciling), progressReason, v.message)
	blockedReason := v.reason
	if !blocked {
		blockedReason = "NotBlocked"
	}
	set(v1alpha1.ConditionBlocked, b(blocked), blockedReason, v.message)
	stalledReason := v.reason
	if !v.stalls {
		stalledReason = "NotStalled"
	}
	set(v1alpha1.ConditionStalled, b(v.stalls), stalledReason, v.message)
	sort.SliceStable(st.Conditions, func(i, j int) bool { return condOrder(st.Conditions[i].Type) < condOrder(st.Conditions[j].Type) })
}

func condOrder(t string) int {
	for i, c := range []string{v1alpha1.ConditionUpToDate, v1alpha1.ConditionReady, v1alpha1.ConditionProgressing,
		v1alpha1.ConditionReconciling, v1alpha1.ConditionBlocked, v1alpha1.ConditionStalled} {
		if c == t {
			return i
		}
	}
	return 99
}

// driftedNodes counts the nodes whose reading shows a drift.
func driftedNodes(drift []v1alpha1.ObservedDrift) int32 {
	var n int32
	for _, d := range drift {
		if d.Drifted {
			n++
		}
	}
	return n
}
