package cli

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The manager's Deployment as config/manager and the chart install it.
const (
	managerNamespace  = "nodeops-system"
	managerDeployment = "nodeops-manager"
)

func newVersionCommand(o *Options) *cobra.Command {
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print this plugin's version and the version of the nodeops manager the cluster runs",
		Long: `Print the plugin's version (its Go module version and the commit it was built from) and,
unless --client, the image of the nodeops manager Deployment in nodeops-system and how many of its
replicas are ready.`,
		Example: `  kubectl nodeops version
  kubectl nodeops version --client`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(o.Out, "client: %s\n", clientVersion())
			if clientOnly {
				return nil
			}
			c, err := o.NewClient()
			if err != nil {
				return err
			}
			server, err := serverVersion(cmd.Context(), c)
			if err != nil {
				return err
			}
			fmt.Fprintf(o.Out, "server: %s\n", server)
			return nil
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "Print only the plugin's version; do not ask the cluster")
	return cmd
}

// buildVersion is stamped by `make build` (-ldflags -X ...cli.buildVersion=$(git describe)), for
// builds where Go records no VCS information (-buildvcs=false); it is never set at run time.
var buildVersion string

// clientVersion is the stamped version, or the module version and VCS revision Go recorded.
func clientVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown (no build information in the binary)"
	}
	v := bi.Main.Version
	if buildVersion != "" {
		return buildVersion + ", " + bi.GoVersion
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = ", modified"
			}
		}
	}
	if rev != "" {
		v += fmt.Sprintf(" (commit %s%s)", rev[:min(12, len(rev))], modified)
	}
	return v + ", " + bi.GoVersion
}

// serverVersion describes the manager Deployment: its images and ready replicas.
func serverVersion(ctx context.Context, c Client) (string, error) {
	var d appsv1.Deployment
	err := c.Get(ctx, client.ObjectKey{Namespace: managerNamespace, Name: managerDeployment}, &d)
	if apierrors.IsNotFound(err) {
		return fmt.Sprintf("no Deployment %s/%s (nodeops is not installed, or its manager runs outside the cluster, as on nodeops-local)", managerNamespace, managerDeployment), nil
	}
	if err != nil {
		return "", fmt.Errorf("reading Deployment %s/%s: %w", managerNamespace, managerDeployment, err)
	}
	var images []string
	for _, ctr := range d.Spec.Template.Spec.Containers {
		images = append(images, ctr.Image)
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	return fmt.Sprintf("manager %s, %d/%d replicas ready", strings.Join(images, ", "), d.Status.ReadyReplicas, want), nil
}
