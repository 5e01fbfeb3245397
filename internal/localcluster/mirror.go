package localcluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/internal/clock"
)

// Annotations the kubelet puts on mirror pods.
const (
	AnnotationConfigMirror = "kubernetes.io/config.mirror"
	AnnotationConfigHash   = "kubernetes.io/config.hash"
	AnnotationConfigSource = "kubernetes.io/config.source"
	// AnnotationAdvertiseAddress is on kubeadm's kube-apiserver manifest; kubeadm upgrade reads it from the mirror pod.
	AnnotationAdvertiseAddress = "kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint"
	// AnnotationEtcdClientURLs is on kubeadm's etcd manifest; kubeadm upgrade dials etcd there.
	AnnotationEtcdClientURLs = "kubeadm.kubernetes.io/etcd.advertise-client-urls"
)

// mirrorInterval is how often the mirror-pod stand-in looks at the control-plane roots' manifests.
const mirrorInterval = time.Second

// MirrorPods is the local stand-in for the kubelet's static pods: there is no kubelet on a local node,
// so nodeops-local keeps one kube-system mirror pod per static pod manifest in each control-plane
// root's /etc/kubernetes/manifests, named <pod>-<node>, annotated with a config hash of the manifest
// (as the kubelet does), and replaced whenever the manifest changes or removed when it goes away.
// kubeadm upgrade finds the apiserver's advertise address on these pods and waits for their hash
// to change after writing a new manifest. kwok then reports them Running.
//
// One departure from the manifests: every control plane's etcd is the local cluster's one etcd, so
// etcd mirror pods advertise etcdURL (it serves TLS with the roots' etcd CA), where kubeadm upgrade
// checks etcd's health, rather than the node's 192.0.2.x address nothing listens on.
func MirrorPods(node string, manifests map[string][]byte, etcdURL string) ([]*corev1.Pod, error) {
	names := make([]string, 0, len(manifests))
	for f := range manifests {
		names = append(names, f)
	}
	sort.Strings(names)
	var pods []*corev1.Pod
	for _, f := range names {
		pod := &corev1.Pod{}
		if err := yaml.Unmarshal(manifests[f], pod); err != nil {
			return nil, fmt.Errorf("static pod manifest %s on %s: %w", f, node, err)
		}
		if pod.Name == "" {
			return nil, fmt.Errorf("static pod manifest %s on %s has no name", f, node)
		}
		sum := sha256.Sum256(manifests[f])
		hash := hex.EncodeToString(sum[:16])
		pod.Name = pod.Name + "-" + node
		pod.Namespace = metav1.NamespaceSystem
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[AnnotationConfigMirror] = hash
		pod.Annotations[AnnotationConfigHash] = hash
		pod.Annotations[AnnotationConfigSource] = "file"
		if _, ok := pod.Annotations[AnnotationEtcdClientURLs]; ok && etcdURL != "" {
			pod.Annotations[AnnotationEtcdClientURLs] = etcdURL
		}
		pod.Spec.NodeName = node
		pod.Status = corev1.PodStatus{}
		pods = append(pods, pod)
	}
	return pods, nil
}

// readManifests reads the *.yaml files of a root's static pod directory.
func readManifests(root string) (map[string][]byte, error) {
	files, err := filepath.Glob(filepath.Join(root, "etc/kubernetes/manifests", "*.yaml"))
	if err != nil {
		return nil, fmt.Errorf("listing manifests: %w", err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue // moved away between listing and reading, as kubeadm does to restart a component
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", f, err)
		}
		out[filepath.Base(f)] = data
	}
	return out, nil
}

// syncMirrorPods makes kube-system's mirror pods on nodes match their roots' manifests.
func syncMirrorPods(ctx context.Context, c client.Client, dir string, nodes []string, etcdURL string) error {
	var existing corev1.PodList
	if err := c.List(ctx, &existing, client.InNamespace(metav1.NamespaceSystem)); err != nil {
		return fmt.Errorf("listing mirror pods: %w", err)
	}
	have := map[string]*corev1.Pod{}
	for i := range existing.Items {
		p := &existing.Items[i]
		if _, ok := p.Annotations[AnnotationConfigMirror]; ok {
			have[p.Name] = p
		}
	}
	var errs []string
	for _, node := range nodes {
		manifests, err := readManifests(filepath.Join(dir, "nodes", node))
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		want, err := MirrorPods(node, manifests, etcdURL)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		wanted := map[string]bool{}
		for _, p := range want {
			wanted[p.Name] = true
			cur, ok := have[p.Name]
			if ok && cur.Annotations[AnnotationConfigHash] == p.Annotations[AnnotationConfigHash] && cur.DeletionTimestamp == nil {
				continue
			}
			if ok {
				if err := deleteNow(ctx, c, cur); err != nil {
					errs = append(errs, err.Error())
					continue
				}
			}
			if err := c.Create(ctx, p); err != nil {
				errs = append(errs, fmt.Sprintf("creating mirror pod %s: %v", p.Name, err))
			}
		}
		for name, p := range have {
			if p.Spec.NodeName == node && !wanted[name] {
				if err := deleteNow(ctx, c, p); err != nil {
					errs = append(errs, err.Error())
				}
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("mirror pods: %s", strings.Join(errs, "; "))
	}
	return nil
}

func deleteNow(ctx context.Context, c client.Client, p *corev1.Pod) error {
	err := c.Delete(ctx, p, client.GracePeriodSeconds(0), client.Preconditions{UID: ptr.To(p.UID)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting mirror pod %s: %w", p.Name, err)
	}
	return nil
}

// runMirrorPods keeps mirror pods in step until ctx ends, logging errors (at most one a minute).
func runMirrorPods(ctx context.Context, c client.Client, dir string, nodes []string, etcdURL string, logf func(string, ...any)) {
	var lastLog time.Time
	for {
		if clock.Sleep(ctx, mirrorInterval) != nil {
			return
		}
		if err := syncMirrorPods(ctx, c, dir, nodes, etcdURL); err != nil && ctx.Err() == nil && time.Since(lastLog) > time.Minute {
			logf("%v", err)
			lastLog = time.Now()
		}
	}
}
