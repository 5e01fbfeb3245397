// Package secretholder builds the pod that makes a NodeTask's Secrets readable on its node, and only
// there, while the task runs: the kubelet is the one reader. Kubernetes' Node authorizer lets a kubelet
// read just the Secrets of pods bound to its node, so the manager (internal/controller/nodetask,
// secretholder.go) keeps one holder pod per unfinished task whose scripts name Secrets, bound to the
// task's node and mounting each of them; the node's kubelet mounts them on its host, and the task's
// agent reads the values there (internal/agent/commands, script.go). No agent and no manager may read
// a Secret through the API (docs/operations/security.md).
//
// It only builds and names objects: the nodetask controller creates the pod, and nothing here reads a
// Secret.
package secretholder

import (
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/objname"
)

const (
	// Namespace holds the Secrets scripts take variables from, and so the holder pods, which can mount
	// only their own namespace's Secrets.
	Namespace = "nodeops-system"
	// LabelComponent, with the value Component, marks holder pods: the manager caches only those, and
	// a drain leaves them (internal/drain).
	LabelComponent = "app.kubernetes.io/name"
	Component      = "nodeops-secret-holder"
	// ServiceAccount runs holder pods: no role binds it and it mounts no token (config/agent).
	ServiceAccount = "nodeops-installer"
	// Container is the holder's one container, the agent's image run with --hold: it blocks until
	// SIGTERM, so a node needs no image besides the agent's.
	Container = "hold"
	// HoldFlag makes the agent binary hold (cmd/agent).
	HoldFlag = "--hold"
	// MountRoot is where the container mounts the volumes (the kubelet mounts only volumes a
	// container uses); nothing in it reads them.
	MountRoot = "/secrets"
	// DefaultKubeletRootDir is the kubelet's --root-dir unless a node sets another.
	DefaultKubeletRootDir = "/var/lib/kubelet"
	// DataLink is the kubelet's link, in each secret volume, to the directory holding the current
	// files (its atomic writer swaps it on an update).
	DataLink = "..data"
	// volumeMode: the files are read by root on the host only.
	volumeMode int32 = 0o400
	// gracePeriod: the holder exits on SIGTERM at once.
	gracePeriod int64 = 5
)

// Options say how holder pods are built.
type Options struct {
	// Image is the agent's image (the manager's --agent-image).
	Image string
	// PullPolicy of the image; empty for the API server's default.
	PullPolicy corev1.PullPolicy
}

// PodName is the holder pod's name for task.
func PodName(task string) string { return objname.SecretHolderPodName(task) }

// VolumeName is the holder pod's volume of the Secret named secret.
func VolumeName(secret string) string { return objname.SecretVolumeName(secret) }

// SecretNames are the Secrets the task's commands read, as each kind's Effects say (a script's
// env[].valueFrom.secretKeyRef and envFrom[].secretRef), sorted, each once: those named with
// v1alpha1.ScriptSecretPrefix, as admission requires (a task that predates the rule gets no volume for
// another, and its agent refuses it).
func SecretNames(spec *v1alpha1.NodeTaskSpec) []string {
	var names []string
	for i := range spec.Commands {
		names = append(names, spec.Commands[i].Effects().Secrets...)
	}
	names = slices.DeleteFunc(names, func(n string) bool { return !Allowed(n) })
	slices.Sort(names)
	return slices.Compact(names)
}

// Allowed reports whether a script may take its environment from the Secret named name.
func Allowed(name string) bool { return strings.HasPrefix(name, v1alpha1.ScriptSecretPrefix) }

// Wanted reports whether task needs its holder pod now: it names Secrets and is not finished
// (Succeeded, Failed or Aborted; a retry makes a failed task unfinished again). A task being deleted
// needs none.
func Wanted(task *v1alpha1.NodeTask) bool {
	if task.DeletionTimestamp != nil || len(SecretNames(&task.Spec)) == 0 {
		return false
	}
	switch task.EffectivePhase() {
	case v1alpha1.TaskSucceeded, v1alpha1.TaskFailed, v1alpha1.TaskAborted:
		return false
	}
	return true
}

// Build is task's holder pod: in Namespace, bound to the task's node, tolerating every taint (a task
// may run on any node), as nodeops-installer without a token, one secret volume per Secret (all its
// keys, mode 0400), tiny requests, and controlled by the task, so that the garbage collector removes
// it with the task.
func Build(task *v1alpha1.NodeTask, o Options) *corev1.Pod {
	names := SecretNames(&task.Spec)
	ctr := corev1.Container{
		Name:            Container,
		Image:           o.Image,
		ImagePullPolicy: o.PullPolicy,
		Command:         []string{"/agent", HoldFlag},
		Resources: corev1.ResourceRequirements{
			// The agent binary's package initialisation (client-go's scheme) is its whole footprint.
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
		},
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	var volumes []corev1.Volume
	for _, n := range names {
		v := VolumeName(n)
		volumes = append(volumes, corev1.Volume{Name: v, VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: n, DefaultMode: ptr.To(volumeMode)}}})
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: v, MountPath: path.Join(MountRoot, v), ReadOnly: true})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      PodName(task.Name),
			Namespace: Namespace,
			Labels: map[string]string{
				LabelComponent:              Component,
				"app.kubernetes.io/part-of": "nodeops",
				v1alpha1.LabelNode:          objname.LabelValue(task.Spec.NodeName),
				v1alpha1.LabelTask:          objname.LabelValue(task.Name),
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeTask", Name: task.Name, UID: task.UID, Controller: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{
			NodeName:                      task.Spec.NodeName,
			ServiceAccountName:            ServiceAccount,
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			RestartPolicy:                 corev1.RestartPolicyAlways,
			TerminationGracePeriodSeconds: ptr.To(gracePeriod),
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				RunAsUser:      ptr.To[int64](65532),
				RunAsGroup:     ptr.To[int64](65532),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{ctr},
			Volumes:    volumes,
		},
	}
}

// OwnedBy reports whether pod's controller is the NodeTask with uid.
func OwnedBy(pod *corev1.Pod, uid types.UID) bool {
	ref := metav1.GetControllerOf(pod)
	return ref != nil && ref.Kind == "NodeTask" && ref.APIVersion == v1alpha1.GroupVersion.String() && ref.UID == uid
}

// VolumeOf is the name of pod's volume of the Secret named secret, "" when it has none.
func VolumeOf(pod *corev1.Pod, secret string) string {
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == secret {
			return v.Name
		}
	}
	return ""
}

// VolumeDir is where the kubelet whose root directory is kubeletRoot mounts the secret volume of the
// pod with uid on its host.
func VolumeDir(kubeletRoot string, uid types.UID, volume string) string {
	return path.Join(kubeletRoot, "pods", string(uid), "volumes", "kubernetes.io~secret", volume)
}
