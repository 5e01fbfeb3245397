package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/gate"
)

// DefaultBinarySource serves official Kubernetes release binaries in the layout BinarySource expects.
const DefaultBinarySource = "https://dl.k8s.io/release"

var versionPattern = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`)

// operationFlags are the flags shared by `upgrade`, `renew-certs` and their `plan` shortcuts.
type operationFlags struct {
	dryRun         bool
	controlled     bool
	selector       string
	maxUnavailable string
	name           string
	generateName   string

	binarySource  string
	packageSource string
	insecureHTTP  bool
	kubeadmOnly   bool
	ignore        []string

	certificates []string
	ignoreAll    bool
}

func (f *operationFlags) addCommon(fs *pflag.FlagSet) {
	fs.BoolVar(&f.dryRun, "dry-run", false, "Create the operation in DryRun mode: every command runs in its dry-run form (kubeadm --dry-run, server-side dry-run evictions, no file written). To see the plan without running anything, use 'plan'")
	fs.BoolVar(&f.controlled, "controlled", false, "Create the operation in Controlled mode: every command waits for 'kubectl nodeops approve'")
	fs.StringVarP(&f.selector, "selector", "l", "", "Only nodes matching this label selector, e.g. 'pool=blue,zone in (a,b)'")
	fs.StringVar(&f.maxUnavailable, "max-unavailable", "", "Nodes busy or failed at once, a number or a percentage such as 20% (default 1); control planes go one at a time regardless")
	fs.StringVar(&f.name, "name", "", "Name of the operation (default: generated from --generate-name)")
	fs.StringVar(&f.generateName, "generate-name", "", "Prefix for a generated name (default: the kind of operation, such as upgrade-v1-37-2-)")
}

func (f *operationFlags) addUpgrade(fs *pflag.FlagSet) {
	fs.StringVar(&f.binarySource, "binary-source", DefaultBinarySource, "Base URL of the kubelet and kubectl binaries: {url}/{version}/bin/linux/{arch}/{name}, with {name}.sha256 beside each")
	fs.BoolVar(&f.insecureHTTP, "insecure-http", false, "Allow a plain http --binary-source (binarySource.insecureHTTP): anyone on the network path can change the binaries and their .sha256 files")
	fs.StringVar(&f.packageSource, "package-source", nodeopsv1.PackageSourceBinaries, "How kubeadm, kubelet and kubectl reach the nodes: binaries (from --binary-source), or apt, dnf, yum, zypper or auto (each node's OS family) to install and hold their packages from the nodes' own sources")
	fs.BoolVar(&f.kubeadmOnly, "kubeadm-only", false, "Upgrade with kubeadm only: leave the kubelet and kubectl binaries and the kubelet alone")
	fs.StringSliceVar(&f.ignore, "ignore-preflight-errors", nil, "kubeadm preflight errors to ignore (comma-separated), by check name such as Swap or Port-6443")
	fs.BoolVar(&f.ignoreAll, "allow-ignore-all-preflight-errors", false, "Allow --ignore-preflight-errors=all, which ignores every kubeadm preflight check")
}

func (f *operationFlags) addRenew(fs *pflag.FlagSet) {
	fs.StringSliceVar(&f.certificates, "certificates", nil, "Certificates to renew, such as apiserver,etcd-server (default all)")
}

// upgradeOperation builds the NodeOperation `upgrade VERSION` would create.
func (f *operationFlags) upgradeOperation(version string) (*nodeopsv1.NodeOperation, error) {
	if !versionPattern.MatchString(version) {
		return nil, fmt.Errorf("version %q must look like v1.37.2", version)
	}
	u := &nodeopsv1.UpgradeOperation{KubernetesVersion: version, IgnorePreflightErrors: f.ignore, AllowIgnoreAllPreflightErrors: f.ignoreAll}
	switch f.packageSource {
	case "", nodeopsv1.PackageSourceBinaries:
	case "apt", "dnf", "yum", "zypper", "auto":
		u.PackageSource = f.packageSource
	default:
		return nil, fmt.Errorf("--package-source %q must be binaries, apt, dnf, yum, zypper or auto", f.packageSource)
	}
	if f.kubeadmOnly {
		no := false
		u.UpgradeKubeletAndKubectl = &no
	} else if u.PackageSource == "" {
		if f.binarySource == "" {
			return nil, fmt.Errorf("--binary-source is required unless --kubeadm-only")
		}
		if strings.HasPrefix(f.binarySource, "http://") && !f.insecureHTTP {
			return nil, fmt.Errorf("--binary-source %s is plain http: use https, or pass --insecure-http to allow it", f.binarySource)
		}
		u.BinarySource = &nodeopsv1.BinarySource{BaseURL: f.binarySource, InsecureHTTP: f.insecureHTTP}
	}
	op := &nodeopsv1.NodeOperation{Spec: nodeopsv1.NodeOperationSpec{Upgrade: u}}
	return op, f.finish(op, "upgrade-"+strings.ReplaceAll(version, ".", "-")+"-")
}

// renewOperation builds the NodeOperation `renew-certs` would create.
func (f *operationFlags) renewOperation() (*nodeopsv1.NodeOperation, error) {
	op := &nodeopsv1.NodeOperation{Spec: nodeopsv1.NodeOperationSpec{
		RenewCertificates: &nodeopsv1.RenewCertificatesOperation{Certificates: f.certificates},
	}}
	return op, f.finish(op, "renew-certs-")
}

func (f *operationFlags) finish(op *nodeopsv1.NodeOperation, defaultPrefix string) error {
	switch {
	case f.dryRun && f.controlled:
		return fmt.Errorf("--dry-run and --controlled cannot be combined")
	case f.dryRun:
		op.Spec.ExecutionMode = nodeopsv1.ExecutionDryRun
	case f.controlled:
		op.Spec.ExecutionMode = nodeopsv1.ExecutionControlled
	default:
		op.Spec.ExecutionMode = nodeopsv1.ExecutionAuto
	}
	if f.selector != "" {
		sel, err := parseSelector(f.selector)
		if err != nil {
			return fmt.Errorf("--selector %q: %w", f.selector, err)
		}
		op.Spec.NodeSelector = sel
	}
	if f.maxUnavailable != "" {
		mu := intstr.Parse(f.maxUnavailable)
		if _, err := intstr.GetScaledValueFromIntOrPercent(&mu, 100, false); err != nil {
			return fmt.Errorf("--max-unavailable %q: %w", f.maxUnavailable, err)
		}
		op.Spec.MaxUnavailable = &mu
	}
	switch {
	case f.name != "" && f.generateName != "":
		return fmt.Errorf("--name and --generate-name cannot be combined")
	case f.name != "":
		if errs := validation.IsDNS1123Subdomain(f.name); len(errs) > 0 {
			return fmt.Errorf("--name %q: %s", f.name, strings.Join(errs, "; "))
		}
		op.Name = f.name
	case f.generateName != "":
		op.GenerateName = f.generateName
	default:
		op.GenerateName = defaultPrefix
	}
	return nil
}

// createFlags are what create commands add to operationFlags.
type createFlags struct {
	operationFlags
	watch  bool
	output string
}

func (f *createFlags) add(fs *pflag.FlagSet) {
	f.addCommon(fs)
	fs.BoolVarP(&f.watch, "watch", "w", false, "Follow the operation live once created, as 'watch' does (same exit codes)")
	fs.StringVarP(&f.output, "output", "o", "", "Print the created operation as json or yaml")
}

func newUpgradeCommand(o *Options) *cobra.Command {
	f := &createFlags{}
	cmd := &cobra.Command{
		Use:   "upgrade VERSION",
		Short: "Upgrade the kubeadm cluster to VERSION (creates a NodeOperation)",
		Long: `Create a NodeOperation that upgrades the cluster with kubeadm: the first
control-plane node runs 'kubeadm upgrade apply', the other control-plane nodes
'kubeadm upgrade node' one at a time, then the workers are cordoned, drained,
upgraded and uncordoned, --max-unavailable at a time. The kubelet and kubectl
binaries are replaced and the kubelet restarted unless --kubeadm-only.

One minor version at a time: v1.36.x -> v1.37.y. Run 'kubectl nodeops plan upgrade
VERSION' first to see the groups, nodes and commands.`,
		Example: `  # See what it would do, then run it in DryRun mode and follow it
  kubectl nodeops plan upgrade v1.37.2
  kubectl nodeops upgrade v1.37.2 --dry-run --watch

  # Workers of one pool, three at a time, each command approved by hand
  kubectl nodeops upgrade v1.37.2 -l pool=blue --max-unavailable 3 --controlled

  # Binaries from a mirror, with a fixed name
  kubectl nodeops upgrade v1.37.2 --binary-source https://mirror.example/k8s --name upgrade-37`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			op, err := f.upgradeOperation(args[0])
			if err != nil {
				return err
			}
			return o.create(cmd.Context(), op, f)
		},
	}
	f.add(cmd.Flags())
	f.addUpgrade(cmd.Flags())
	return cmd
}

func newRenewCertsCommand(o *Options) *cobra.Command {
	f := &createFlags{}
	cmd := &cobra.Command{
		Use:   "renew-certs",
		Short: "Renew kubeadm certificates on the control-plane nodes (creates a NodeOperation)",
		Long: `Create a NodeOperation that renews kubeadm certificates ('kubeadm certs renew')
on every control-plane node, one node at a time, then restarts the control-plane
static pods so they load the new certificates.`,
		Example: `  kubectl nodeops renew-certs --watch

  # Only the API server's serving certificate, each step approved by hand
  kubectl nodeops renew-certs --certificates apiserver --controlled

  # Everything in dry-run form
  kubectl nodeops renew-certs --dry-run -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			op, err := f.renewOperation()
			if err != nil {
				return err
			}
			return o.create(cmd.Context(), op, f)
		},
	}
	f.add(cmd.Flags())
	f.addRenew(cmd.Flags())
	return cmd
}

func (o *Options) create(ctx context.Context, op *nodeopsv1.NodeOperation, f *createFlags) error {
	if err := validateOutput(f.output, "json", "yaml"); err != nil {
		return err
	}
	// The API server cannot compile user CEL without a webhook: refuse it here, naming the field.
	if err := gate.Validate(&op.Spec); err != nil {
		return err
	}
	c, err := o.NewClient()
	if err != nil {
		return err
	}
	if err := c.Create(ctx, op); err != nil {
		return fmt.Errorf("creating nodeoperation: %w", err)
	}
	if f.output != "" {
		if err := o.print(op, f.output); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(o.Out, "nodeoperation/%s created (%s, %s)\n", op.Name, operationKind(op), op.Spec.ExecutionMode)
	}
	if !f.watch {
		if f.output == "" {
			fmt.Fprintf(o.Out, "Follow it with: kubectl nodeops watch %s\n", op.Name)
		}
		return nil
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	return o.runWatch(ctx, c, op.Name, 0)
}

// parseSelector turns kubectl's -l syntax (=, ==, !=, in, notin, key, !key) into a LabelSelector.
func parseSelector(s string) (*metav1.LabelSelector, error) {
	parsed, err := labels.Parse(s)
	if err != nil {
		return nil, err
	}
	reqs, _ := parsed.Requirements()
	sel := &metav1.LabelSelector{}
	for _, r := range reqs {
		values := r.Values().List()
		var op metav1.LabelSelectorOperator
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals:
			if sel.MatchLabels == nil {
				sel.MatchLabels = map[string]string{}
			}
			sel.MatchLabels[r.Key()] = values[0]
			continue
		case selection.NotEquals, selection.NotIn:
			op = metav1.LabelSelectorOpNotIn
		case selection.In:
			op = metav1.LabelSelectorOpIn
		case selection.Exists:
			op = metav1.LabelSelectorOpExists
		case selection.DoesNotExist:
			op = metav1.LabelSelectorOpDoesNotExist
		default:
			return nil, fmt.Errorf("operator %q is not supported in a node selector", r.Operator())
		}
		sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{Key: r.Key(), Operator: op, Values: values})
	}
	return sel, nil
}
