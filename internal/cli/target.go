package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/clustertarget"
)

func newTargetCommand(o *Options) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "target",
		Short: "Show the cluster as it is against the ClusterTarget, and what would run next",
		Long: `The ClusterTarget (one, named cluster) says what the cluster should be: its
Kubernetes version and certificate policy. nodeops shows what the cluster is and
generates, one at a time, the NodeOperations that get it there.

'target' prints the observed versions against the desired ones, every node's
versions, the next certificate expiry, the conditions, the operations generated
so far, and the plan of the operation that would be generated next.`,
		Example: `  kubectl nodeops target
  kubectl nodeops target set --version v1.37.2
  kubectl nodeops target set --version v1.37.2 --path v1.36.4
  kubectl nodeops target set --version v1.37.2 --binary-source https://mirror.example/k8s --ignore-preflight-errors CoreDNSMigration
  kubectl nodeops target set --rotate-certificates
  kubectl nodeops target set --rotate-certificate-authorities`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := validateOutput(output, "json", "yaml"); err != nil {
				return err
			}
			c, err := o.NewClient()
			if err != nil {
				return err
			}
			return o.runTarget(cmd.Context(), c, output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: json or yaml (the ClusterTarget itself)")
	cmd.AddCommand(newTargetSetCommand(o))
	return cmd
}

func getTarget(ctx context.Context, c Client) (*nodeopsv1.ClusterTarget, error) {
	ct := &nodeopsv1.ClusterTarget{}
	if err := c.Get(ctx, client.ObjectKey{Name: nodeopsv1.ClusterTargetName}, ct); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("no ClusterTarget: the manager creates it from kube-system/kubeadm-config once it runs")
		}
		return nil, fmt.Errorf("getting clustertarget %s: %w", nodeopsv1.ClusterTargetName, err)
	}
	return ct, nil
}

func (o *Options) runTarget(ctx context.Context, c Client, output string) error {
	ct, err := getTarget(ctx, c)
	if err != nil {
		return err
	}
	if output != "" {
		return o.print(ct, output)
	}
	writeTarget(o.Out, ct, o.Now())
	next := clustertarget.Next(ct, o.Now())
	if next == nil {
		fmt.Fprintf(o.Out, "\nNext: nothing to generate (%s)\n", upToDateMessage(ct))
		return nil
	}
	op := clustertarget.Operation(ct, next)
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	p, err := buildPlan(op, nodes.Items)
	if err != nil {
		return err
	}
	if op.Spec.Upgrade != nil {
		p.ClusterVersion, p.VersionCheck = checkClusterVersion(ctx, c, op.Spec.Upgrade.KubernetesVersion)
	}
	when := "Next"
	if ct.Spec.Paused {
		when = "Next, once resumed (spec.paused is true)"
	}
	fmt.Fprintf(o.Out, "\n%s: NodeOperation %s (%s)\n", when, next.Name, next.Reason)
	writePlan(o.Out, op, p, o.colour())
	return nil
}

func upToDateMessage(ct *nodeopsv1.ClusterTarget) string {
	for _, c := range ct.Status.Conditions {
		if c.Type == nodeopsv1.ConditionUpToDate {
			return c.Message
		}
	}
	return "not observed yet"
}

func writeTarget(w io.Writer, ct *nodeopsv1.ClusterTarget, now time.Time) {
	st := &ct.Status
	phase := string(st.Phase)
	if phase == "" {
		phase = "(not observed yet)"
	}
	fmt.Fprintf(w, "ClusterTarget %s: %s\n", ct.Name, phase)
	if st.ObservedGeneration != ct.Generation {
		fmt.Fprintf(w, "  (the manager has not yet acted on the latest spec: generation %d, observed %d)\n", ct.Generation, st.ObservedGeneration)
	}
	observed := st.KubernetesVersion
	if observed == "" {
		observed = "unknown"
	}
	fmt.Fprintf(w, "  kubernetes version   %s, target %s", observed, ct.Spec.KubernetesVersion)
	if len(st.UpgradePath) > 0 {
		fmt.Fprintf(w, " (steps: %s)", strings.Join(st.UpgradePath, " -> "))
	}
	fmt.Fprintln(w)
	c := ct.Spec.Certificates
	rb := "720h0m0s"
	if c.RenewBefore != nil {
		rb = c.RenewBefore.Duration.String()
	}
	if st.NextCertificateExpiry != nil {
		fmt.Fprintf(w, "  next cert expiry     %s (in %s)\n", st.NextCertificateExpiry.UTC().Format(time.RFC3339), duration.HumanDuration(st.NextCertificateExpiry.Sub(now)))
	} else {
		fmt.Fprintln(w, "  next cert expiry     unknown (no control plane's agent has read its certificates yet)")
	}
	if st.NextCertificateAuthorityExpiry != nil {
		fmt.Fprintf(w, "  next CA expiry       %s (in %s; a renewal keeps it, a rotation replaces it)\n", st.NextCertificateAuthorityExpiry.UTC().Format(time.RFC3339), duration.HumanDuration(st.NextCertificateAuthorityExpiry.Sub(now)))
	}
	fmt.Fprintf(w, "  certificates         autoRenew %v, renewBefore %s, rotationCount %d (acted on %d)\n", c.AutoRenew, rb, c.RotationCount, st.LastRotationCount)
	ca := ct.Spec.CertificateAuthorities
	completion := ca.Completion
	if completion == "" {
		completion = nodeopsv1.CompletionManual
	}
	fmt.Fprintf(w, "  CA rotation          rotationCount %d (acted on %d), authorities %s, serviceAccountKey %v, completion %s\n",
		ca.RotationCount, st.LastCertificateAuthorityRotationCount, strings.Join(nodeopsv1.OrAllAuthorities(ca.Authorities), ","), ca.ServiceAccountKey, completion)
	for i := len(st.Operations) - 1; i >= 0; i-- {
		if g := st.Operations[i]; g.Kind == nodeopsv1.GeneratedRotateCertificateAuthorities {
			fmt.Fprintf(w, "  last CA rotation     %s, %s\n", g.Name, generatedPhase(g))
			break
		}
	}
	mode := ct.Spec.ExecutionMode
	if mode == "" {
		mode = nodeopsv1.ExecutionAuto
	}
	fmt.Fprintf(w, "  generates            %s operations, paused %v\n", mode, ct.Spec.Paused)

	if len(st.Nodes) > 0 {
		fmt.Fprintln(w, "\nNodes:")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  NAME\tROLE\tKUBELET\tSTATIC PODS")
		for _, n := range st.Nodes {
			role := "worker"
			if n.ControlPlane {
				role = "control-plane"
			}
			comps := make([]string, 0, len(n.StaticPods))
			for comp, v := range n.StaticPods {
				comps = append(comps, comp+" "+v)
			}
			sort.Strings(comps)
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", n.Name, role, dash(n.KubeletVersion), dash(strings.Join(comps, ", ")))
		}
		_ = tw.Flush()
	}
	if len(st.Certificates) > 0 {
		fmt.Fprintln(w, "\nCertificates:")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  NODE\tFIRST EXPIRY\tCERTIFICATES\tREAD BY")
		for _, n := range st.Certificates {
			var first time.Time
			for _, c := range n.Certificates {
				if first.IsZero() || c.NotAfter.Time.Before(first) {
					first = c.NotAfter.Time
				}
			}
			by := "its agent (kubeadm certs check-expiration)"
			if n.Task != "" {
				by = "task " + n.Task
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", n.Node, first.UTC().Format(time.RFC3339), len(n.Certificates), by)
		}
		_ = tw.Flush()
	}
	if len(st.Conditions) > 0 {
		fmt.Fprintln(w, "\nConditions:")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  TYPE\tSTATUS\tREASON\tMESSAGE")
		for _, c := range st.Conditions {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, c.Message)
		}
		_ = tw.Flush()
	}
	if len(st.Operations) > 0 {
		fmt.Fprintln(w, "\nOperations generated:")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  NAME\tKIND\tPHASE\tREASON")
		for _, g := range st.Operations {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", g.Name, g.Kind, generatedPhase(g), dash(g.Reason))
		}
		_ = tw.Flush()
	}
}

// generatedPhase is a generated operation's phase, with a rotation's phase (prepare, trust-both,
// re-issue, complete) while it has one.
func generatedPhase(g nodeopsv1.GeneratedOperation) string {
	if g.RotationPhase != "" {
		return dash(string(g.Phase)) + " (" + g.RotationPhase + ")"
	}
	return dash(string(g.Phase))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

type targetSetFlags struct {
	version      string
	path         []string
	rotate       bool
	rotateCAs    bool
	binarySource string
	insecureHTTP bool
	ignore       []string
	ignoreAll    bool
	// ignoreSet: --ignore-preflight-errors was given (possibly empty, to clear the list).
	ignoreSet bool
}

func newTargetSetCommand(o *Options) *cobra.Command {
	f := &targetSetFlags{}
	cmd := &cobra.Command{
		Use:   "set (--version VERSION [--path VERSION,...] | --rotate-certificates | --rotate-certificate-authorities) [--binary-source URL] [--ignore-preflight-errors CHECK,...]",
		Short: "Change the ClusterTarget: the target version, or one more certificate renewal or CA rotation",
		Long: `Patch the ClusterTarget, rereading it when someone else changed it in between.

  --version              the Kubernetes version the cluster should run. kubeadm upgrades
                         one minor version at a time; for a target more than one minor
                         ahead name each intermediate version with --path.
  --rotate-certificates  raises spec.certificates.rotationCount by one: the manager
                         renews the control planes' certificates once.
  --rotate-certificate-authorities
                         raises spec.certificateAuthorities.rotationCount by one: the
                         manager generates one rotateCertificateAuthorities operation,
                         which replaces the cluster's CAs (prepare, trust-both,
                         re-issue, complete) as spec.certificateAuthorities says
                         (authorities, serviceAccountKey, completion). With completion
                         Manual (the default) it waits before phase complete until
                         'kubectl nodeops approve OP --gate complete-rotation'. It goes
                         before an upgrade or renewal asked at the same time, waits for
                         one running, and nothing else is generated until it ends.

How the generated upgrades run, set alongside --version:
  --binary-source        spec.upgrade.binarySource.baseURL, where kubeadm, kubelet and
                         kubectl of every version on the way are downloaded from
                         (https; plain http only with --insecure-http).
  --ignore-preflight-errors
                         spec.upgrade.ignorePreflightErrors, passed to kubeadm.`,
		Example: `  kubectl nodeops target set --version v1.37.2
  kubectl nodeops target set --version v1.37.2 --path v1.36.4
  kubectl nodeops target set --version v1.37.2 --binary-source https://mirror.example/k8s --ignore-preflight-errors CoreDNSMigration
  kubectl nodeops target set --rotate-certificates
  kubectl nodeops target set --rotate-certificate-authorities`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.ignoreSet = cmd.Flags().Changed("ignore-preflight-errors")
			if f.version == "" && (len(f.path) > 0 || f.binarySource != "" || f.ignoreSet || f.ignoreAll) {
				return fmt.Errorf("--path, --binary-source and --ignore-preflight-errors go with --version")
			}
			if strings.HasPrefix(f.binarySource, "http://") && !f.insecureHTTP {
				return fmt.Errorf("--binary-source %s is plain http: use https, or pass --insecure-http to allow it", f.binarySource)
			}
			if f.version == "" && !f.rotate && !f.rotateCAs {
				return fmt.Errorf("give --version VERSION, --rotate-certificates or --rotate-certificate-authorities")
			}
			c, err := o.NewClient()
			if err != nil {
				return err
			}
			return o.runTargetSet(cmd.Context(), c, f)
		},
	}
	cmd.Flags().StringVar(&f.version, "version", "", "Kubernetes version the cluster should run, for example v1.37.2")
	cmd.Flags().StringSliceVar(&f.path, "path", nil, "Versions of the intermediate minor steps, for example v1.36.4")
	cmd.Flags().BoolVar(&f.rotate, "rotate-certificates", false, "Renew the control planes' certificates once more")
	cmd.Flags().BoolVar(&f.rotateCAs, "rotate-certificate-authorities", false, "Rotate the cluster's certificate authorities once more (spec.certificateAuthorities.rotationCount + 1)")
	cmd.Flags().StringVar(&f.binarySource, "binary-source", "", "Base URL of kubeadm, kubelet and kubectl for the generated upgrades: {url}/{version}/bin/linux/{arch}/{name}, with {name}.sha256 beside each")
	cmd.Flags().BoolVar(&f.insecureHTTP, "insecure-http", false, "Allow a plain http --binary-source (binarySource.insecureHTTP): anyone on the network path can change the binaries and their .sha256 files")
	cmd.Flags().StringSliceVar(&f.ignore, "ignore-preflight-errors", nil, "kubeadm preflight errors the generated upgrades ignore (comma-separated), by check name such as Swap or Port-6443")
	cmd.Flags().BoolVar(&f.ignoreAll, "allow-ignore-all-preflight-errors", false, "Allow --ignore-preflight-errors=all, which ignores every kubeadm preflight check")
	return cmd
}

func (o *Options) runTargetSet(ctx context.Context, c Client, f *targetSetFlags) error {
	var before, after nodeopsv1.ClusterTargetSpec
	// An optimistic lock, so that rotationCount+1 counts from what is there; a conflict rereads.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ct, err := getTarget(ctx, c)
		if err != nil {
			return err
		}
		orig := ct.DeepCopy()
		before = *orig.Spec.DeepCopy()
		if f.version != "" {
			ct.Spec.KubernetesVersion = f.version
			if f.path != nil {
				ct.Spec.Upgrade.Path = f.path
			}
			if f.binarySource != "" {
				if ct.Spec.Upgrade.BinarySource == nil {
					ct.Spec.Upgrade.BinarySource = &nodeopsv1.BinarySource{}
				}
				ct.Spec.Upgrade.BinarySource.BaseURL = f.binarySource
				ct.Spec.Upgrade.BinarySource.InsecureHTTP = f.insecureHTTP
			}
			if f.ignoreSet {
				ct.Spec.Upgrade.IgnorePreflightErrors = f.ignore
			}
			if f.ignoreAll {
				ct.Spec.Upgrade.AllowIgnoreAllPreflightErrors = true
			}
		}
		if f.rotate {
			ct.Spec.Certificates.RotationCount++
		}
		if f.rotateCAs {
			ct.Spec.CertificateAuthorities.RotationCount++
		}
		after = *ct.Spec.DeepCopy()
		return c.Patch(ctx, ct, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
	})
	if err != nil {
		return fmt.Errorf("updating clustertarget %s: %w", nodeopsv1.ClusterTargetName, err)
	}
	if f.version != "" {
		fmt.Fprintf(o.Out, "clustertarget %s: kubernetesVersion %s -> %s", nodeopsv1.ClusterTargetName, before.KubernetesVersion, after.KubernetesVersion)
		if len(after.Upgrade.Path) > 0 {
			fmt.Fprintf(o.Out, " (path %s)", strings.Join(after.Upgrade.Path, ", "))
		}
		fmt.Fprintln(o.Out)
		if f.binarySource != "" {
			fmt.Fprintf(o.Out, "clustertarget %s: upgrade binarySource %s\n", nodeopsv1.ClusterTargetName, after.Upgrade.BinarySource.BaseURL)
		}
		if f.ignoreSet {
			fmt.Fprintf(o.Out, "clustertarget %s: upgrade ignorePreflightErrors [%s]\n", nodeopsv1.ClusterTargetName, strings.Join(after.Upgrade.IgnorePreflightErrors, ","))
		}
	}
	if f.rotate {
		fmt.Fprintf(o.Out, "clustertarget %s: rotationCount %d -> %d (one renewal)\n", nodeopsv1.ClusterTargetName,
			before.Certificates.RotationCount, after.Certificates.RotationCount)
	}
	if f.rotateCAs {
		fmt.Fprintf(o.Out, "clustertarget %s: certificateAuthorities.rotationCount %d -> %d (one CA rotation)\n", nodeopsv1.ClusterTargetName,
			before.CertificateAuthorities.RotationCount, after.CertificateAuthorities.RotationCount)
	}
	fmt.Fprintln(o.Out, "See what happens next: kubectl nodeops target")
	return nil
}
