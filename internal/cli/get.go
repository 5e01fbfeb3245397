package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
)

func newGetCommand(o *Options) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get [NAME]",
		Short: "List node operations, or show one",
		Example: `  # Every operation, newest last
  kubectl nodeops get

  # One operation as YAML, status included
  kubectl nodeops get upgrade-v1-37-2-abcde -o yaml`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := validateOutput(output, "json", "yaml"); err != nil {
				return err
			}
			c, err := o.NewClient()
			if err != nil {
				return err
			}
			return o.runGet(cmd.Context(), c, args, output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: json or yaml (a table when empty)")
	return cmd
}

func (o *Options) runGet(ctx context.Context, c Client, args []string, output string) error {
	var ops []nodeopsv1.NodeOperation
	if len(args) == 1 {
		op, err := getOperation(ctx, c, args[0])
		if err != nil {
			return err
		}
		if output != "" {
			return o.print(op, output)
		}
		ops = []nodeopsv1.NodeOperation{*op}
	} else {
		var list nodeopsv1.NodeOperationList
		if err := c.List(ctx, &list); err != nil {
			return fmt.Errorf("listing nodeoperations: %w", err)
		}
		sort.SliceStable(list.Items, func(i, j int) bool {
			a, b := list.Items[i].CreationTimestamp, list.Items[j].CreationTimestamp
			if !a.Equal(&b) {
				return a.Before(&b)
			}
			return list.Items[i].Name < list.Items[j].Name
		})
		if output != "" {
			return o.print(&list, output)
		}
		if len(list.Items) == 0 {
			fmt.Fprintln(o.ErrOut, "No node operations found.")
			return nil
		}
		ops = list.Items
	}
	tw := tabwriter.NewWriter(o.Out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tMODE\tPHASE\tPROGRESS\tAGE")
	for i := range ops {
		op := &ops[i]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", op.Name, operationKind(op), modeOf(op), phaseOf(op),
			orDash(op.Status.Progress), duration.HumanDuration(o.Now().Sub(op.CreationTimestamp.Time)))
	}
	return tw.Flush()
}

func (o *Options) print(obj runtime.Object, format string) error {
	s, err := NewScheme()
	if err != nil {
		return err
	}
	return printObject(o.Out, s, obj, format)
}

func phaseOf(op *nodeopsv1.NodeOperation) string {
	if op.Status.Phase == "" {
		return string(nodeopsv1.OperationPending)
	}
	return string(op.Status.Phase)
}

func modeOf(op *nodeopsv1.NodeOperation) string {
	m := string(op.Spec.ExecutionMode)
	if m == "" {
		m = string(nodeopsv1.ExecutionAuto)
	}
	var flags []string
	if op.Spec.Paused {
		flags = append(flags, "paused")
	}
	if op.Spec.Abort {
		flags = append(flags, "aborting")
	}
	if len(flags) > 0 {
		m += " (" + strings.Join(flags, ", ") + ")"
	}
	return m
}

// operationKind says in a few words what the operation does.
func operationKind(op *nodeopsv1.NodeOperation) string {
	switch {
	case op.Spec.Upgrade != nil:
		return "upgrade " + op.Spec.Upgrade.KubernetesVersion
	case op.Spec.RenewCertificates != nil:
		return "renew-certs"
	case op.Spec.Reconfigure != nil:
		return "reconfigure"
	case op.Spec.RotateCertificateAuthorities != nil:
		return "rotate-cas"
	case op.Spec.Custom != nil:
		n := len(op.Spec.Custom.Groups)
		return fmt.Sprintf("custom (%d %s)", n, plural(n, "group", "groups"))
	}
	return "unknown"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
