package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/internal/version"
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
		Long: `Print the plugin's version and the commit it was built from (as make build stamps them, else as Go
recorded them) and, unless --client, the image of the nodeops manager Deployment in nodeops-system and
how many of its replicas are ready.`,
		Example: `  kubectl nodeops version
  kubectl nodeops version --client`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(o.Out, "client: %s\n", version.Get())
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
