package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/host"
)

// DefaultCertificateCheckInterval is how often a control plane's agent reads its certificates'
// expiry; each wait is jittered by up to a fifth, so a fleet's agents do not read in step.
const DefaultCertificateCheckInterval = time.Hour

// kubeAPIServerManifest marks a kubeadm control plane: only there does kubeadm have
// certificates to report.
const kubeAPIServerManifest = "/etc/kubernetes/manifests/kube-apiserver.yaml"

// CertificateReader records a control plane's certificate expiry in its Node's annotation
// v1alpha1.AnnotationCertificates, where the ClusterTarget controller reads it (docs/design.md,
// "ClusterTarget"). It runs `kubeadm certs check-expiration -o json` soon after the agent starts
// and then every Interval, jittered, and writes only when the reading changed: at rest, nothing.
type CertificateReader struct {
	Client client.Client
	Node   string
	Host   *host.Host
	// Interval: zero for DefaultCertificateCheckInterval.
	Interval time.Duration
}

// Start reads until ctx ends (a manager.Runnable). A failed reading is logged and tried again
// at the next interval: it never stops the agent.
func (c *CertificateReader) Start(ctx context.Context) error {
	every := c.Interval
	if every <= 0 {
		every = DefaultCertificateCheckInterval
	}
	first := min(every, time.Minute)
	wait := time.Duration(rand.Int64N(int64(first)/5 + 1))
	logger := log.FromContext(ctx).WithValues("node", c.Node)
	for {
		if err := clock.Sleep(ctx, wait); err != nil {
			return nil
		}
		if err := c.ReadOnce(ctx); err != nil {
			logger.Error(err, "reading the certificates' expiry")
		}
		wait = every + time.Duration(rand.Int64N(int64(every)/5+1))
	}
}

// ReadOnce reads the certificates once and records them if they changed; on a node that is no
// kubeadm control plane it does nothing.
func (c *CertificateReader) ReadOnce(ctx context.Context) error {
	if !c.Host.Files.Exists(kubeAPIServerManifest) {
		return nil
	}
	var out bytes.Buffer
	if err := c.Host.Kubeadm.Kubeadm(ctx, &out, "certs", "check-expiration", "-o", "json"); err != nil {
		return fmt.Errorf("kubeadm certs check-expiration: %w", err)
	}
	certs, err := commands.ParseCheckExpiration(out.Bytes())
	if err != nil {
		return err
	}
	// The certificate authorities beside the leaves (the ClusterTarget shows them apart): a node
	// whose kubeadm lists none still records its leaves.
	if cas, err := commands.ParseCheckExpirationAuthorities(out.Bytes()); err == nil {
		certs = append(certs, cas...)
	}
	value := v1alpha1.EncodeCertificates(certs)
	var node corev1.Node
	if err := c.Client.Get(ctx, client.ObjectKey{Name: c.Node}, &node); err != nil {
		return fmt.Errorf("get node %s: %w", c.Node, err)
	}
	if node.Annotations[v1alpha1.AnnotationCertificates] == value {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.AnnotationCertificates: value}}})
	if err != nil {
		return err
	}
	if err := c.Client.Patch(ctx, &node, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("record the certificates' expiry on node %s: %w", c.Node, err)
	}
	log.FromContext(ctx).Info("certificates' expiry recorded", "node", c.Node, "certificates", len(certs))
	return nil
}
