package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/gate"
	"github.com/nodeops/nodeops/internal/hook"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/schedule"
)

// Plan is what `plan` shows (and prints with -o json|yaml): the groups, their nodes in order and their commands.
type Plan struct {
	Operation      string                  `json:"operation"`
	Mode           nodeopsv1.ExecutionMode `json:"mode"`
	Nodes          string                  `json:"nodes"`
	ClusterVersion string                  `json:"clusterVersion,omitempty"`
	VersionCheck   string                  `json:"versionCheck,omitempty"`
	Groups         []PlanGroup             `json:"groups"`
}

// PlanGroup is one group of a Plan.
type PlanGroup struct {
	Name           string               `json:"name"`
	NodeFilter     nodeopsv1.NodeFilter `json:"nodeFilter"`
	MaxUnavailable int                  `json:"maxUnavailable"`
	Nodes          []string             `json:"nodes"`
	NotReady       []string             `json:"notReady,omitempty"`
	// Windows are the maintenance windows new nodes of the group start in; empty means always.
	Windows string `json:"windows,omitempty"`
	// Soak is how long a finished node (postNodeDelay) and the group before (postGroupDelay) hold it.
	Soak string `json:"soak,omitempty"`
	// Gates must all pass before each node of the group starts, once its windows allow it.
	Gates []string `json:"gates,omitempty"`
	// PauseBefore are the group's nodes the operation pauses before, once each, until a person resumes.
	PauseBefore []string `json:"pauseBefore,omitempty"`
	// Hooks run at the group's points (preNode, postNode; the operation's pre/postOperation on
	// the first and last group), in words.
	Hooks    []string      `json:"hooks,omitempty"`
	Commands []PlanCommand `json:"commands"`
}

// PlanCommand is one command of a PlanGroup.
type PlanCommand struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	Does string `json:"does"`
	// InsecureHTTP: the command downloads over plain http (insecureHTTP: true).
	InsecureHTTP bool `json:"insecureHTTP,omitempty"`
}

type planFlags struct {
	file   string
	output string
}

func newPlanCommand(o *Options) *cobra.Command {
	pf := &planFlags{}
	cmd := &cobra.Command{
		Use:   "plan (-f FILE | upgrade VERSION | renew-certs | reconfigure)",
		Short: "Show what an operation would do: groups, nodes in order, commands. Creates nothing",
		Long: `Expand an operation the way the manager will, against the cluster's nodes as they
are now, and show its groups in order, each with its nodes (sorted, as they will
be taken) and its commands. Nothing is created or changed; only nodes (and, for an
upgrade, kube-system/kubeadm-config for the version check) are read.

The operation comes from a file (-f, a NodeOperation manifest; - reads standard
input) or from the same shortcuts and flags as 'upgrade', 'renew-certs' and 'reconfigure'.`,
		Example: `  # A manifest you are about to apply
  kubectl nodeops plan -f rollout.yaml

  # The shortcuts take the same flags as the commands that create operations
  kubectl nodeops plan upgrade v1.37.2 --max-unavailable 25%
  kubectl nodeops plan renew-certs -l topology.kubernetes.io/zone=a

  # As data
  kubectl nodeops plan upgrade v1.37.2 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if pf.file == "" {
				return errors.New("give -f FILE, or a shortcut: 'plan upgrade VERSION', 'plan renew-certs' or 'plan reconfigure'")
			}
			op, err := readOperation(o.In, pf.file)
			if err != nil {
				return err
			}
			return o.runPlan(cmd.Context(), op, pf.output, "kubectl create -f "+pf.file)
		},
	}
	cmd.Flags().StringVarP(&pf.file, "filename", "f", "", "NodeOperation manifest to plan (- for standard input)")
	cmd.PersistentFlags().StringVarP(&pf.output, "output", "o", "", "Output format: json or yaml")

	of := &operationFlags{}
	up := &cobra.Command{
		Use:   "upgrade VERSION",
		Short: "Plan an upgrade to VERSION (same flags as 'kubectl nodeops upgrade')",
		Example: `  kubectl nodeops plan upgrade v1.37.2
  kubectl nodeops plan upgrade v1.37.2 --kubeadm-only -l pool=blue`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			op, err := of.upgradeOperation(args[0])
			if err != nil {
				return err
			}
			return o.runPlan(cmd.Context(), op, pf.output, "kubectl nodeops upgrade "+args[0]+" (with the same flags)")
		},
	}
	of.addCommon(up.Flags())
	of.addUpgrade(up.Flags())

	rf := &operationFlags{}
	renew := &cobra.Command{
		Use:     "renew-certs",
		Short:   "Plan a certificate renewal (same flags as 'kubectl nodeops renew-certs')",
		Example: `  kubectl nodeops plan renew-certs --certificates apiserver,etcd-server`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			op, err := rf.renewOperation()
			if err != nil {
				return err
			}
			return o.runPlan(cmd.Context(), op, pf.output, "kubectl nodeops renew-certs (with the same flags)")
		},
	}
	rf.addCommon(renew.Flags())
	rf.addRenew(renew.Flags())

	cf, rcf := &operationFlags{}, &reconfigureFlags{}
	reconf := &cobra.Command{
		Use:     "reconfigure",
		Short:   "Plan a reconfigure (same flags as 'kubectl nodeops reconfigure')",
		Example: `  kubectl nodeops plan reconfigure --apiserver-arg audit-log-maxage=30 --kubelet-config 'maxPods: 150'`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			op, err := cf.reconfigureOperation(rcf, func() ([]byte, error) { return io.ReadAll(o.In) })
			if err != nil {
				return err
			}
			return o.runPlan(cmd.Context(), op, pf.output, "kubectl nodeops reconfigure (with the same flags)")
		},
	}
	cf.addCommon(reconf.Flags())
	rcf.add(reconf.Flags())
	cmd.AddCommand(up, renew, reconf)
	return cmd
}

// readOperation reads one NodeOperation manifest, strictly: unknown fields are errors.
func readOperation(stdin io.Reader, file string) (*nodeopsv1.NodeOperation, error) {
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	op := &nodeopsv1.NodeOperation{}
	if err := yaml.UnmarshalStrict(data, op); err != nil {
		return nil, fmt.Errorf("%s is not a NodeOperation manifest: %w", file, err)
	}
	if op.Kind != "NodeOperation" || op.APIVersion != nodeopsv1.GroupVersion.String() {
		return nil, fmt.Errorf("%s holds %s %s, not a %s NodeOperation", file, op.APIVersion, op.Kind, nodeopsv1.GroupVersion)
	}
	if op.Spec.ExecutionMode == "" {
		op.Spec.ExecutionMode = nodeopsv1.ExecutionAuto
	}
	return op, nil
}

func (o *Options) runPlan(ctx context.Context, op *nodeopsv1.NodeOperation, output, runHint string) error {
	if err := validateOutput(output, "json", "yaml"); err != nil {
		return err
	}
	c, err := o.NewClient()
	if err != nil {
		return err
	}
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
	if output != "" {
		return printData(o.Out, p, output)
	}
	writePlan(o.Out, op, p, o.colour())
	fmt.Fprintf(o.Out, "\nNothing was created. To run it: %s\n", runHint)
	return nil
}

// buildPlan resolves the operation against the nodes with the manager's own planner.
func buildPlan(op *nodeopsv1.NodeOperation, nodes []corev1.Node) (*Plan, error) {
	groups, err := plan.Resolve(&op.Spec, nodes)
	if err != nil {
		return nil, fmt.Errorf("planning: %w", err)
	}
	// The manager fails an operation whose CEL does not compile; say so before it is created.
	if err := gate.Validate(&op.Spec); err != nil {
		return nil, err
	}
	if err := hook.Validate(&op.Spec); err != nil {
		return nil, err
	}
	ready := map[string]bool{}
	for i := range nodes {
		ready[nodes[i].Name] = plan.NodeReady(&nodes[i])
	}
	p := &Plan{Operation: operationDetail(op), Mode: op.Spec.ExecutionMode, Nodes: selectorText(op.Spec.NodeSelector)}
	for _, g := range groups {
		pg := PlanGroup{Name: g.Name, NodeFilter: g.NodeFilter, MaxUnavailable: g.MaxUnavailable, Nodes: g.Nodes}
		pg.Windows, pg.Soak = groupScheduling(op.Spec.Scheduling, g.Scheduling)
		gates := g.Scheduling.Over(op.Spec.Scheduling).Gates
		for j := range gates {
			pg.Gates = append(pg.Gates, gate.Describe(&gates[j]))
		}
		pg.Hooks = groupHooks(op, groups, g.Name)
		for _, n := range g.Scheduling.Over(op.Spec.Scheduling).PauseBefore {
			if slices.Contains(g.Nodes, n) {
				pg.PauseBefore = append(pg.PauseBefore, n)
			}
		}
		if pg.Nodes == nil {
			pg.Nodes = []string{}
		}
		for _, n := range g.Nodes {
			if !ready[n] {
				pg.NotReady = append(pg.NotReady, n)
			}
		}
		for i := range g.Commands {
			cmd := &g.Commands[i]
			pg.Commands = append(pg.Commands, PlanCommand{Name: cmd.DisplayName(), Kind: cmd.Kind(), Does: commandText(cmd), InsecureHTTP: cmd.Effects().PlainHTTP})
		}
		p.Groups = append(p.Groups, pg)
	}
	return p, nil
}

// checkClusterVersion reads the cluster's version from kubeadm-config and applies kubeadm's version policy.
func checkClusterVersion(ctx context.Context, c Client, requested string) (string, string) {
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "kubeadm-config"}, cm); err != nil {
		return "", "not checked: cannot read kube-system/kubeadm-config: " + err.Error()
	}
	current, err := plan.KubeadmConfigVersion(cm.Data["ClusterConfiguration"])
	if err != nil {
		return "", "not checked: " + err.Error()
	}
	if err := plan.CheckUpgradeVersion(current, requested); err != nil {
		var skew *plan.VersionSkewError
		if errors.As(err, &skew) {
			return current, "REFUSED: " + skew.Why
		}
		return current, "not checked: " + err.Error()
	}
	return current, "allowed"
}

const planMaxNodes = 50

// insecureText marks a plain-http download in the plan, in red on a terminal.
func insecureText(colour bool) string {
	const s = "INSECURE HTTP: anyone on the network path can change what is downloaded"
	if colour {
		return "\x1b[1;31m" + s + "\x1b[0m"
	}
	return s
}

// colour reports whether output may carry terminal colours.
func (o *Options) colour() bool {
	ok, _, _ := o.Terminal()
	return ok
}

func writePlan(w io.Writer, op *nodeopsv1.NodeOperation, p *Plan, colour bool) {
	fmt.Fprintf(w, "Plan: %s\n", p.Operation)
	fmt.Fprintf(w, "  mode %s, nodes %s, max unavailable %s\n", p.Mode, p.Nodes, maxUnavailableText(op))
	if p.VersionCheck != "" {
		if p.ClusterVersion != "" {
			fmt.Fprintf(w, "  cluster version %s -> %s: %s\n", p.ClusterVersion, op.Spec.Upgrade.KubernetesVersion, p.VersionCheck)
		} else {
			fmt.Fprintf(w, "  version check %s\n", p.VersionCheck)
		}
	}
	for i, g := range p.Groups {
		fmt.Fprintf(w, "\n%d. %s: %s", i+1, g.Name, nodeCount(len(g.Nodes)))
		switch {
		case len(g.Nodes) == 0:
			fmt.Fprint(w, ", nothing to do (the group succeeds at once)")
		case len(g.Nodes) == 1:
		case g.MaxUnavailable >= len(g.Nodes):
			fmt.Fprint(w, ", all at once")
		case g.MaxUnavailable == 1:
			fmt.Fprint(w, ", one at a time")
		default:
			fmt.Fprintf(w, ", %d at a time", g.MaxUnavailable)
		}
		if g.NodeFilter == nodeopsv1.NodeFilterHead {
			fmt.Fprint(w, " (the first node by name)")
		} else if g.NodeFilter == nodeopsv1.NodeFilterTail {
			fmt.Fprint(w, " (all but the first node by name)")
		}
		fmt.Fprintln(w)
		if len(g.Nodes) > 0 {
			fmt.Fprintf(w, "   nodes: %s\n", nodeList(g.Nodes, g.NotReady))
		}
		if len(g.NotReady) > 0 {
			fmt.Fprintf(w, "   %d NotReady (they count against max unavailable)\n", len(g.NotReady))
		}
		if g.Windows != "" {
			fmt.Fprintf(w, "   windows: %s (no new node starts outside them)\n", g.Windows)
		}
		if len(g.PauseBefore) > 0 {
			fmt.Fprintf(w, "   pause before: %s (a person resumes: kubectl nodeops resume)\n", strings.Join(g.PauseBefore, ", "))
		}
		if g.Soak != "" {
			fmt.Fprintf(w, "   soak: %s\n", g.Soak)
		}
		for _, gt := range g.Gates {
			fmt.Fprintf(w, "   gate %s\n", gt)
		}
		for _, h := range g.Hooks {
			fmt.Fprintf(w, "   hook %s\n", h)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for j, c := range g.Commands {
			fmt.Fprintf(tw, "   %d. %s\t%s\n", j+1, c.Name, c.Does)
			if c.InsecureHTTP {
				fmt.Fprintf(tw, "   \t%s\n", insecureText(colour))
			}
		}
		_ = tw.Flush()
	}
}

// groupScheduling is a group's windows and soak in words: its own fields over the operation's,
// as the manager applies them.
func groupScheduling(op, group nodeopsv1.Scheduling) (windows, soak string) {
	eff := group.Over(op)
	return schedule.DescribeAll(eff.Windows), soakText(eff)
}

func nodeCount(n int) string {
	return fmt.Sprintf("%d %s", n, plural(n, "node", "nodes"))
}

func nodeList(nodes, notReady []string) string {
	nr := map[string]bool{}
	for _, n := range notReady {
		nr[n] = true
	}
	shown := nodes
	if len(shown) > planMaxNodes {
		shown = shown[:planMaxNodes]
	}
	parts := make([]string, 0, len(shown)+1)
	for _, n := range shown {
		if nr[n] {
			n += " (NotReady)"
		}
		parts = append(parts, n)
	}
	if len(nodes) > len(shown) {
		parts = append(parts, fmt.Sprintf("... and %d more (-o yaml lists them all)", len(nodes)-len(shown)))
	}
	return strings.Join(parts, ", ")
}
