package localcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/secretholder"
)

// secretVolumesInterval is how often the secret volume stand-in looks at the local nodes' pods.
const secretVolumesInterval = time.Second

// SecretVolumes is the local stand-in for the kubelet's secret volumes on local nodes that run a real
// agent on a local host root: there is no kubelet, so for every pod bound to one of those nodes it
// writes each secret volume's files where a kubelet would, <root>/var/lib/kubelet/pods/<uid>/volumes/
// kubernetes.io~secret/<volume>/, in the kubelet's atomic-writer layout (a timestamped directory of
// the files, mode 0400, the ..data link to it and a link per key into ..data), rewrites them when the
// Secret changes, and removes a pod's directory once the pod is going or gone. That is where a
// script's agent reads its task's Secrets (internal/secretholder).
//
// It reads Secrets with nodeops-local's administrator credential: a real kubelet's read is confined
// by the Node authorizer to the Secrets of pods bound to its node; this stand-in's is not.
type SecretVolumes struct {
	// Client reads pods and Secrets as an administrator.
	Client client.Client
	// Roots are the host roots of the nodes it plays the kubelet for, by node name.
	Roots map[string]string
	// written is the content last written per volume directory, to write only changes.
	written map[string][]byte
}

// Run keeps the volumes in step until ctx ends, logging errors (at most one a minute).
func (s *SecretVolumes) Run(ctx context.Context, logf func(string, ...any)) {
	var lastLog time.Time
	for {
		if err := s.Sync(ctx); err != nil && ctx.Err() == nil && time.Since(lastLog) > time.Minute {
			logf("secret volumes: %v", err)
			lastLog = time.Now()
		}
		if clock.Sleep(ctx, secretVolumesInterval) != nil {
			return
		}
	}
}

// Sync makes every node's secret volumes match its pods and their Secrets once.
func (s *SecretVolumes) Sync(ctx context.Context) error {
	if s.written == nil {
		s.written = map[string][]byte{}
	}
	var errs []string
	// Pod directories to keep, by root (two nodes may share one in tests).
	keep := map[string]map[string]bool{}
	for _, node := range slices.Sorted(maps.Keys(s.Roots)) {
		root := s.Roots[node]
		if keep[root] == nil {
			keep[root] = map[string]bool{}
		}
		if err := s.syncNode(ctx, node, root, keep[root]); err != nil {
			errs = append(errs, err.Error())
		}
	}
	for root, uids := range keep {
		if err := s.removeOthers(filepath.Join(root, secretholder.DefaultKubeletRootDir, "pods"), uids); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// syncNode writes the secret volumes of node's running pods under root, adding their UIDs to keep.
func (s *SecretVolumes) syncNode(ctx context.Context, node, root string, keep map[string]bool) error {
	var pods corev1.PodList
	// The kubelet's own query: the pods bound to its node.
	if err := s.Client.List(ctx, &pods, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", node)}); err != nil {
		return fmt.Errorf("listing the pods of %s: %w", node, err)
	}
	var errs []string
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // its containers are stopped: the kubelet unmounts its volumes
		}
		for _, v := range p.Spec.Volumes {
			if v.Secret == nil {
				continue
			}
			keep[string(p.UID)] = true
			dir := filepath.Join(root, secretholder.VolumeDir(secretholder.DefaultKubeletRootDir, p.UID, v.Name))
			if err := s.writeVolume(ctx, dir, p.Namespace, v.Secret); err != nil {
				errs = append(errs, fmt.Sprintf("pod %s/%s volume %s: %v", p.Namespace, p.Name, v.Name, err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("node %s: %s", node, strings.Join(errs, "; "))
	}
	return nil
}

// removeOthers removes the directories of podsDir whose pod is not in keep: gone, or going.
func (s *SecretVolumes) removeOthers(podsDir string, keep map[string]bool) error {
	entries, err := os.ReadDir(podsDir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if keep[e.Name()] {
			continue
		}
		dir := filepath.Join(podsDir, e.Name())
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		for d := range s.written {
			if strings.HasPrefix(d, dir+string(filepath.Separator)) {
				delete(s.written, d)
			}
		}
	}
	return nil
}

// writeVolume writes the Secret's keys into dir as the kubelet's atomic writer does, when they changed.
// A missing Secret leaves the volume unwritten (the kubelet retries, the pod waits), unless optional.
func (s *SecretVolumes) writeVolume(ctx context.Context, dir, namespace string, src *corev1.SecretVolumeSource) error {
	sec := &corev1.Secret{}
	err := s.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: src.SecretName}, sec)
	switch {
	case apierrors.IsNotFound(err) && src.Optional != nil && *src.Optional:
		sec.Data = nil
	case err != nil:
		return err
	}
	var sum bytes.Buffer
	keys := slices.Sorted(maps.Keys(sec.Data))
	for _, k := range keys {
		fmt.Fprintf(&sum, "%d:%s%d:", len(k), k, len(sec.Data[k]))
		sum.Write(sec.Data[k])
	}
	if prev, ok := s.written[dir]; ok && bytes.Equal(prev, sum.Bytes()) {
		if _, err := os.Stat(filepath.Join(dir, secretholder.DataLink)); err == nil {
			return nil
		}
	}
	mode := os.FileMode(0o644)
	if src.DefaultMode != nil {
		mode = os.FileMode(*src.DefaultMode) & os.ModePerm
	}
	if err := atomicWrite(dir, sec.Data, mode); err != nil {
		return err
	}
	s.written[dir] = sum.Bytes()
	return nil
}

// atomicWrite lays files out in dir as the kubelet's AtomicWriter (pkg/volume/util/atomic_writer.go)
// does: a new ..<timestamp> directory holding them, the ..data link swapped to it by a rename, a link
// per key to ..data/<key>, and the previous directory and links of removed keys removed.
func atomicWrite(dir string, files map[string][]byte, mode os.FileMode) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dataLink := filepath.Join(dir, secretholder.DataLink)
	old, _ := os.Readlink(dataLink)
	ts, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return err
	}
	for k, v := range files {
		if err := os.WriteFile(filepath.Join(ts, k), v, mode); err != nil {
			return err
		}
		if err := os.Chmod(filepath.Join(ts, k), mode); err != nil { // past the umask
			return err
		}
	}
	if err := os.Chmod(ts, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, dataLink); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, "..") {
			continue
		}
		if _, ok := files[name]; !ok {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return err
			}
		}
	}
	for k := range files {
		link := filepath.Join(dir, k)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join(secretholder.DataLink, k), link); err != nil {
			return err
		}
	}
	if old != "" && old != filepath.Base(ts) {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}
