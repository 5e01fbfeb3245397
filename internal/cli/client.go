package cli

import (
	"context"
	"fmt"
	appsv1 "k8s.io/api/apps/v1"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
)

// Client is all the CLI needs from the API server: read, create, patch and watch.
// A controller-runtime client.WithWatch satisfies it.
type Client interface {
	client.Reader
	Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error
	Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error
	Watch(ctx context.Context, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error)
}

// NewScheme is the CLI's own scheme: core (nodes), apps (the manager's Deployment) and nodeops kinds.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("adding core/v1 to scheme: %w", err)
	}
	if err := appsv1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("adding apps/v1 to scheme: %w", err)
	}
	if err := nodeopsv1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("adding nodeops.io/v1alpha1 to scheme: %w", err)
	}
	return s, nil
}

// clientFromFlags builds a client from the usual kubeconfig flags.
func clientFromFlags(flags *genericclioptions.ConfigFlags) (Client, error) {
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	s, err := NewScheme()
	if err != nil {
		return nil, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, fmt.Errorf("creating client for %s: %w", cfg.Host, err)
	}
	return c, nil
}
