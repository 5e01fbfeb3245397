// Package agentjob runs the agent as a Job per node that has work for it (the manager's
// --agent-mode=Job): the agent runs with --exit-when-idle, so the Job ends when the node's tasks no
// longer need it, and a new one is created when they do again.
//
// It creates and deletes only the agent's Jobs; it never writes a NodeTask.
package agentjob

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Options say how agent Jobs are built.
type Options struct {
	// Image of the agent.
	Image string
	// Namespace of the Jobs; nodeops-system by default.
	Namespace string
	// ServiceAccount the agent runs as; nodeops-agent by default.
	ServiceAccount string
}

func (o Options) withDefaults() Options {
	if o.Namespace == "" {
		o.Namespace = "nodeops-system"
	}
	if o.ServiceAccount == "" {
		o.ServiceAccount = "nodeops-agent"
	}
	if o.Image == "" {
		o.Image = "ghcr.io/nodeops/agent:latest"
	}
	return o
}

const (
	// AnnotationNode holds the node of an agent Job (node names can be longer than label values).
	AnnotationNode = "nodeops.io/node-name"
	// LabelComponent marks agent Jobs.
	LabelComponent = "app.kubernetes.io/name"
	componentAgent = "nodeops-agent"
)

// TerminationGracePeriodSeconds of an agent's pod: above the agent's default --shutdown-grace-period
// (10m), so that a running command may finish on SIGTERM (every command has a timeout, rule 12).
const TerminationGracePeriodSeconds int64 = 630

// JobName is the agent Job's name for a node: nodeops-agent-<node>, hashed when it would pass 63
// characters (the Job controller copies it into a label).
func JobName(node string) string {
	name := "nodeops-agent-" + node
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(node))
	// A cut node name may end in '.' or '-', which may not precede the '-' before the hash.
	return "nodeops-agent-" + strings.TrimRight(node[:32], ".-") + "-" + hex.EncodeToString(sum[:])[:12]
}

// BuildJob is the agent Job of a node: privileged, in the host's PID namespace, the host's / at
// /host, pinned to the node and tolerating every taint, exiting when idle.
func BuildJob(node string, o Options) *batchv1.Job {
	o = o.withDefaults()
	labels := map[string]string{LabelComponent: componentAgent, "app.kubernetes.io/part-of": "nodeops"}
	if len(node) <= 63 {
		labels[v1alpha1.LabelNode] = node
	}
	hostPathType := corev1.HostPathDirectory
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name:        JobName(node),
			Namespace:   o.Namespace,
			Labels:      labels,
			Annotations: map[string]string{AnnotationNode: node},
		},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](10),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeName:                      node,
					HostPID:                       true,
					RestartPolicy:                 corev1.RestartPolicyOnFailure,
					ServiceAccountName:            o.ServiceAccount,
					TerminationGracePeriodSeconds: ptr.To(TerminationGracePeriodSeconds),
					Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name:    "agent",
						Image:   o.Image,
						Command: []string{"/agent"},
						Args:    []string{"--host-root=/host", "--exit-when-idle"},
						// POD_NAME and POD_NAMESPACE: the agent's drain must not evict the Job's own pod.
						Env: []corev1.EnvVar{
							fieldEnv("NODE_NAME", "spec.nodeName"),
							fieldEnv("POD_NAME", "metadata.name"),
							fieldEnv("POD_NAMESPACE", "metadata.namespace"),
						},
						SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
						VolumeMounts: []corev1.VolumeMount{{
							Name: "host", MountPath: "/host", MountPropagation: ptr.To(corev1.MountPropagationHostToContainer),
						}},
					}},
					Volumes: []corev1.Volume{{
						Name:         "host",
						VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/", Type: &hostPathType}},
					}},
				},
			},
		},
	}
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
}

// finished reports whether a Job has ended, one way or the other.
func finished(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
