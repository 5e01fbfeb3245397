package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/gate"
	"github.com/nodeops/nodeops/internal/schedule"
)

func newProfileCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "profile",
		Short: "NodeProfiles: what a set of nodes must have (runtime shims, files, settings)",
	}
	var output string
	status := &cobra.Command{
		Use:   "status [NAME]",
		Short: "Which nodes of a profile are provisioned, provisioning or failed",
		Long: `Without NAME: one line per NodeProfile with its node counts and readiness.
With NAME: the profile's nodes by state: provisioned (labelled
nodeops.io/profile.NAME=provisioned), provisioning (an install or uninstall task
pending or running, with its progress) and failed (with the failure message).`,
		Example: `  kubectl nodeops profile status
  kubectl nodeops profile status wasm
  kubectl nodeops profile status wasm -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := validateOutput(output, "json", "yaml"); err != nil {
				return err
			}
			c, err := o.NewClient()
			if err != nil {
				return err
			}
			if len(args) == 0 {
				return o.runProfileList(cmd.Context(), c, output)
			}
			return o.runProfileStatus(cmd.Context(), c, args[0], output)
		},
	}
	status.Flags().StringVarP(&output, "output", "o", "", "Output format: json or yaml")
	cmd.AddCommand(status)
	return cmd
}

func (o *Options) runProfileList(ctx context.Context, c Client, output string) error {
	var list nodeopsv1.NodeProfileList
	if err := c.List(ctx, &list); err != nil {
		return fmt.Errorf("listing nodeprofiles: %w", err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	if output != "" {
		return o.print(&list, output)
	}
	if len(list.Items) == 0 {
		fmt.Fprintln(o.ErrOut, "No node profiles found.")
		return nil
	}
	tw := tabwriter.NewWriter(o.Out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tMATCHED\tPROVISIONED\tPROVISIONING\tFAILED\tREADY")
	for _, p := range list.Items {
		n := p.Status.Nodes
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", p.Name, n.Matched, n.Provisioned, n.Provisioning, n.Failed, conditionStatus(p.Status.Conditions, nodeopsv1.ConditionReady))
	}
	return tw.Flush()
}

// ProfileStatus is `profile status NAME -o json|yaml`.
type ProfileStatus struct {
	Name         string                         `json:"name"`
	Counts       nodeopsv1.ProfileNodeCounts    `json:"counts"`
	Conditions   []metav1.Condition             `json:"conditions,omitempty"`
	Provisioned  []string                       `json:"provisioned"`
	Provisioning []ProfileTaskState             `json:"provisioning"`
	Failed       []nodeopsv1.ProfileNodeFailure `json:"failed"`
}

// ProfileTaskState is a node whose install or uninstall is under way.
type ProfileTaskState struct {
	Node     string `json:"node"`
	Task     string `json:"task"`
	Phase    string `json:"phase"`
	Progress string `json:"progress"`
	Command  string `json:"command,omitempty"`
}

func (o *Options) runProfileStatus(ctx context.Context, c Client, name, output string) error {
	p := &nodeopsv1.NodeProfile{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, p); err != nil {
		return fmt.Errorf("getting nodeprofile %q: %w", name, err)
	}
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes, client.MatchingLabels{nodeopsv1.ProfileLabelPrefix + name: nodeopsv1.ProvisionedValue}); err != nil {
		return fmt.Errorf("listing nodes of nodeprofile %q: %w", name, err)
	}
	var tasks nodeopsv1.NodeTaskList
	if err := c.List(ctx, &tasks, client.MatchingLabels{nodeopsv1.LabelProfile: name}); err != nil {
		return fmt.Errorf("listing tasks of nodeprofile %q: %w", name, err)
	}
	st := profileStatus(p, nodes.Items, tasks.Items)
	if output != "" {
		return printData(o.Out, st, output)
	}
	writeProfileStatus(o.Out, p, st)
	return nil
}

// profileStatus sorts the profile's nodes into provisioned, provisioning and failed.
func profileStatus(p *nodeopsv1.NodeProfile, provisioned []corev1.Node, tasks []nodeopsv1.NodeTask) ProfileStatus {
	st := ProfileStatus{Name: p.Name, Counts: p.Status.Nodes, Conditions: p.Status.Conditions,
		Provisioned: []string{}, Provisioning: []ProfileTaskState{}, Failed: []nodeopsv1.ProfileNodeFailure{}}
	for _, n := range provisioned {
		st.Provisioned = append(st.Provisioned, n.Name)
	}
	sort.Strings(st.Provisioned)
	sort.Slice(tasks, func(i, j int) bool { return tasks[i].Spec.NodeName < tasks[j].Spec.NodeName })
	failedNodes := map[string]bool{}
	for i := range tasks {
		t := &tasks[i]
		switch t.EffectivePhase() {
		case nodeopsv1.TaskPending, nodeopsv1.TaskRunning:
			st.Provisioning = append(st.Provisioning, ProfileTaskState{Node: t.Spec.NodeName, Task: t.Name,
				Phase: string(t.EffectivePhase()), Progress: taskProgress(t), Command: currentCommandName(t)})
		case nodeopsv1.TaskFailed:
			failedNodes[t.Spec.NodeName] = true
			st.Failed = append(st.Failed, nodeopsv1.ProfileNodeFailure{Node: t.Spec.NodeName, Task: t.Name, Message: failureLine(t)})
		}
	}
	for _, f := range p.Status.Failures {
		if !failedNodes[f.Node] {
			failedNodes[f.Node] = true
			st.Failed = append(st.Failed, f)
		}
	}
	return st
}

func writeProfileStatus(w io.Writer, p *nodeopsv1.NodeProfile, st ProfileStatus) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "Profile:\t%s\n", p.Name)
	who := "nodes matching " + selectorText(p.Spec.NodeSelector)
	switch {
	case p.Spec.AutoProvision:
		who += ", all of them (autoProvision)"
	case p.Spec.Trigger != nil:
		who += ", annotated " + p.Spec.Trigger.Annotation
	}
	fmt.Fprintf(tw, "Nodes:\t%s\n", who)
	n := st.Counts
	fmt.Fprintf(tw, "Counts:\t%d matched, %d provisioned, %d provisioning, %d failed\n", n.Matched, n.Provisioned, n.Provisioning, n.Failed)
	fmt.Fprintf(tw, "Ready:\t%s\n", conditionText(p.Status.Conditions, nodeopsv1.ConditionReady))
	if len(p.Spec.Windows) > 0 {
		fmt.Fprintf(tw, "Windows:\t%s (no new task starts outside them)\n", schedule.DescribeAll(p.Spec.Windows))
	}
	for i := range p.Spec.Gates {
		fmt.Fprintf(tw, "Gate:\t%s\n", gate.Describe(&p.Spec.Gates[i]))
	}
	if len(p.Spec.Windows) > 0 || len(p.Spec.Gates) > 0 {
		fmt.Fprintf(tw, "Provisioning:\t%s\n", conditionText(p.Status.Conditions, nodeopsv1.ConditionProvisioning))
	}
	if len(p.Spec.Gates) > 0 {
		fmt.Fprintf(tw, "Blocked:\t%s\n", conditionText(p.Status.Conditions, nodeopsv1.ConditionBlocked))
	}
	if p.Status.NextStart != nil {
		fmt.Fprintf(tw, "Next start:\t%s\n", timeText(p.Status.NextStart))
	}
	_ = tw.Flush()

	printGates(w, p.Status.Gates, false)

	fmt.Fprintf(w, "\nProvisioned (%d):\n", len(st.Provisioned))
	if len(st.Provisioned) > 0 {
		fmt.Fprintln(w, "  "+strings.Join(st.Provisioned, ", "))
	}
	fmt.Fprintf(w, "\nProvisioning (%d):\n", len(st.Provisioning))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, t := range st.Provisioning {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", t.Node, t.Phase, t.Progress, orDash(t.Command), t.Task)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nFailed (%d):\n", len(st.Failed))
	for _, f := range st.Failed {
		fmt.Fprintf(w, "  %s: %s (task %s)\n", f.Node, f.Message, f.Task)
	}
	if len(st.Failed) > 0 {
		fmt.Fprintln(w, "\nRecover with: kubectl nodeops retry TASK or kubectl nodeops skip TASK")
	}
}

func conditionStatus(conds []metav1.Condition, t string) string {
	if c := meta.FindStatusCondition(conds, t); c != nil {
		return string(c.Status)
	}
	return "Unknown"
}

func conditionText(conds []metav1.Condition, t string) string {
	c := meta.FindStatusCondition(conds, t)
	if c == nil {
		return "Unknown"
	}
	s := string(c.Status)
	if c.Reason != "" {
		s += " (" + c.Reason + ")"
	}
	if c.Message != "" {
		s += ": " + c.Message
	}
	return s
}
