package confinement

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/agentjob"
	"github.com/nodeops/nodeops/internal/objname"
	"github.com/nodeops/nodeops/internal/secretholder"
	"github.com/nodeops/nodeops/internal/testutil"
	"github.com/nodeops/nodeops/internal/testutil/confine"
)

// kubelet is a client as node's kubelet: the user the Node authorizer serves.
func kubelet(t *testing.T, node string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + node, Groups: []string{"system:nodes", "system:authenticated"}}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestKubeletGetsNoSecretThroughAnAgentsPod (issue 24, point 1): the Node authorizer lets a node's
// kubelet read the Secrets its pods name, imagePullSecrets included, and root on the node holds the
// kubelet's credentials. A pod the agent on node-a makes naming nodeops-system's Secret "kept" in
// imagePullSecrets is refused, so node-a's kubelet still cannot read "kept"; a pod an administrator
// binds to node-a mounting "control" shows the Node authorizer at work here.
func TestKubeletGetsNoSecretThroughAnAgentsPod(t *testing.T) {
	ctx := context.Background()
	k := kubelet(t, "node-a")
	control := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "control", Namespace: ns}}
	if err := admin.Create(ctx, control); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	ctl := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "control-a", Namespace: ns}, Spec: corev1.PodSpec{NodeName: "node-a",
		Containers: []corev1.Container{{Name: "c", Image: "pause"}},
		Volumes:    []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "control"}}}}}}
	if err := admin.Create(ctx, ctl); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "node-a's kubelet reading the Secret of a pod on node-a", func() error {
		return k.Get(ctx, client.ObjectKeyFromObject(control), &corev1.Secret{})
	})
	if err := k.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kept"}, &corev1.Secret{}); !apierrors.IsForbidden(err) {
		t.Fatalf("node-a's kubelet reading Secret kept before any pod names it: %v, want Forbidden", err)
	}

	c, _ := as(t, token(t, "node-a"))
	pod := cluster().InstallerPod(func(p *corev1.Pod) { p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "kept"}} })
	err := c.Create(ctx, pod)
	if err == nil {
		t.Cleanup(func() { _ = admin.Delete(ctx, pod, client.GracePeriodSeconds(0)) })
		// The hole: once the authorizer's graph has the pod, node-a's kubelet reads the Secret.
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			if err := k.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kept"}, &corev1.Secret{}); err == nil {
				t.Fatalf("node-a's agent created pod %s naming Secret kept in imagePullSecrets, and node-a's kubelet (system:node:node-a) then read the Secret", pod.Name)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("node-a's agent created pod %s naming Secret kept in imagePullSecrets, want refused", pod.Name)
	}
	confine.Refused(t, "a pod naming Secret kept in imagePullSecrets", err, []string{"without spec.imagePullSecrets", "CREATE pods " + pod.Name})
	if err := k.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kept"}, &corev1.Secret{}); !apierrors.IsForbidden(err) {
		t.Errorf("node-a's kubelet reading Secret kept: %v, want Forbidden", err)
	}
}

// graphField is one way the Node authorizer's graph (Kubernetes' plugin/pkg/auth/authorizer/node,
// AddPod: the ServiceAccount, VisitPodSecretNames, VisitPodConfigmapNames, PVC and ephemeral
// volumes, PodClaims) hands a pod's kubelet another object.
type graphField struct {
	name   string
	change func(*corev1.PodSpec)
}

func volume(src corev1.VolumeSource) func(*corev1.PodSpec) {
	return func(s *corev1.PodSpec) {
		s.Volumes = append(s.Volumes, corev1.Volume{Name: "graph", VolumeSource: src})
		// The kubelet mounts only what a container uses; the graph follows every volume.
	}
}

func graphFields() []graphField {
	ref := &corev1.LocalObjectReference{Name: "kept"}
	secretEnv := corev1.EnvVar{Name: "X", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: *ref, Key: "k"}}}
	cmEnv := corev1.EnvVar{Name: "X", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: *ref, Key: "k"}}}
	fields := []graphField{
		{"spec.serviceAccountName (its tokens)", func(s *corev1.PodSpec) { s.ServiceAccountName = agentSA }},
		{"spec.imagePullSecrets", func(s *corev1.PodSpec) { s.ImagePullSecrets = []corev1.LocalObjectReference{*ref} }},
		{"spec.resourceClaims", func(s *corev1.PodSpec) {
			s.ResourceClaims = []corev1.PodResourceClaim{{Name: "c", ResourceClaimName: ptr.To("kept")}}
		}},
		{"spec.volumes[].secret", volume(corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "kept"}})},
		{"spec.volumes[].configMap", volume(corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: *ref}})},
		{"spec.volumes[].projected.sources[].secret", volume(corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{Secret: &corev1.SecretProjection{LocalObjectReference: *ref}}}}})},
		{"spec.volumes[].projected.sources[].configMap", volume(corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: *ref}}}}})},
		{"spec.volumes[].projected.sources[].serviceAccountToken", volume(corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "t"}}}}})},
		{"spec.volumes[].persistentVolumeClaim", volume(corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "kept"}})},
		{"spec.volumes[].ephemeral", volume(corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}}})},
		{"spec.volumes[].csi.nodePublishSecretRef", volume(corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "csi.example.com", NodePublishSecretRef: ref}})},
		{"spec.volumes[].azureFile.secretName", volume(corev1.VolumeSource{AzureFile: &corev1.AzureFileVolumeSource{SecretName: "kept", ShareName: "s"}})},
		{"spec.volumes[].cephfs.secretRef", volume(corev1.VolumeSource{CephFS: &corev1.CephFSVolumeSource{Monitors: []string{"m"}, SecretRef: ref}})},
		{"spec.volumes[].cinder.secretRef", volume(corev1.VolumeSource{Cinder: &corev1.CinderVolumeSource{VolumeID: "v", SecretRef: ref}})},
		{"spec.volumes[].flexVolume.secretRef", volume(corev1.VolumeSource{FlexVolume: &corev1.FlexVolumeSource{Driver: "example.com/flex", SecretRef: ref}})},
		{"spec.volumes[].rbd.secretRef", volume(corev1.VolumeSource{RBD: &corev1.RBDVolumeSource{CephMonitors: []string{"m"}, RBDImage: "i", SecretRef: ref}})},
		{"spec.volumes[].scaleIO.secretRef", volume(corev1.VolumeSource{ScaleIO: &corev1.ScaleIOVolumeSource{Gateway: "g", System: "s", VolumeName: "v", SecretRef: ref}})},
		{"spec.volumes[].iscsi.secretRef", volume(corev1.VolumeSource{ISCSI: &corev1.ISCSIVolumeSource{TargetPortal: "1.2.3.4:3260", IQN: "iqn.2001-04.com.example:storage", SecretRef: ref}})},
		{"spec.volumes[].storageos.secretRef", volume(corev1.VolumeSource{StorageOS: &corev1.StorageOSVolumeSource{VolumeName: "v", SecretRef: ref}})},
	}
	for _, which := range []string{"containers", "initContainers"} {
		for _, e := range []struct {
			name string
			set  func(*corev1.Container)
		}{
			{"env[].valueFrom.secretKeyRef", func(c *corev1.Container) { c.Env = append(c.Env, secretEnv) }},
			{"env[].valueFrom.configMapKeyRef", func(c *corev1.Container) { c.Env = append(c.Env, cmEnv) }},
			{"envFrom[].secretRef", func(c *corev1.Container) {
				c.EnvFrom = append(c.EnvFrom, corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: *ref}})
			}},
			{"envFrom[].configMapRef", func(c *corev1.Container) {
				c.EnvFrom = append(c.EnvFrom, corev1.EnvFromSource{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: *ref}})
			}},
		} {
			fields = append(fields, graphField{"spec." + which + "[]." + e.name, func(s *corev1.PodSpec) {
				if which == "containers" {
					e.set(&s.Containers[0])
					return
				}
				c := s.Containers[0].DeepCopy()
				c.Name = "init"
				c.VolumeMounts = nil
				e.set(c)
				s.InitContainers = append(s.InitContainers, *c)
			}})
		}
	}
	return fields
}

// notFollowed are the volume sources the Node authorizer's graph gives the kubelet nothing through
// (each refused by both policies anyway, which allow the hostPath / and secret volumes only).
var notFollowed = map[string]bool{"HostPath": true, "EmptyDir": true, "GCEPersistentDisk": true, "AWSElasticBlockStore": true,
	"GitRepo": true, "NFS": true, "Glusterfs": true, "DownwardAPI": true, "FC": true, "Flocker": true, "VsphereVolume": true,
	"Quobyte": true, "AzureDisk": true, "PhotonPersistentDisk": true, "PortworxVolume": true, "Image": true}

// TestPodFieldsTheNodeAuthorizerFollowsAreRefused (issue 24, point 1): each field through which the
// Node authorizer grants a pod's kubelet a Secret, ConfigMap, PVC, ResourceClaim or ServiceAccount
// token is refused in a pod made by node-a's agent (its installer pod) and in one made by the manager
// (a secret holder): by nodeops' policies, or by the API server itself where it no longer takes a
// volume type. Every VolumeSource field is either walked here or named as one the graph ignores.
func TestPodFieldsTheNodeAuthorizerFollowsAreRefused(t *testing.T) {
	ctx := context.Background()
	walked := map[string]bool{}
	fields := graphFields()
	for _, f := range fields {
		if strings.HasPrefix(f.name, "spec.volumes[].") {
			walked[strings.ToLower(strings.SplitN(strings.TrimPrefix(f.name, "spec.volumes[]."), ".", 2)[0])] = true
		}
	}
	vs := reflect.TypeFor[corev1.VolumeSource]()
	for i := range vs.NumField() {
		if n := vs.Field(i).Name; !notFollowed[n] && !walked[strings.ToLower(n)] {
			t.Errorf("VolumeSource.%s is neither walked here nor named as a source the Node authorizer does not follow: look at its graph", n)
		}
	}

	c, _ := as(t, token(t, "node-a"))
	task := &v1alpha1.NodeTask{ObjectMeta: metav1.ObjectMeta{Name: taskA, UID: "uid-a"}, Spec: v1alpha1.NodeTaskSpec{NodeName: "node-a",
		Commands: []v1alpha1.Command{{Script: &v1alpha1.ScriptCommand{Inline: "true",
			EnvFrom: []v1alpha1.EnvFromSource{{SecretRef: v1alpha1.SecretEnvSource{Name: "nodeops-script-a"}}}}}}}}
	holder := secretholder.Build(task, secretholder.Options{Image: "agent"})
	holder.OwnerReferences = nil // no such task in this API server
	for _, who := range []struct {
		name string
		c    client.Client
		pod  *corev1.Pod
	}{
		{"node-a's agent", c, cluster().InstallerPod(nil)},
		{"the manager", manager, holder},
	} {
		// The pod as it is is admitted (a dry run), so each refusal below is the field's.
		if err := who.c.Create(ctx, who.pod.DeepCopy(), client.DryRunAll); err != nil {
			t.Fatalf("%s's own pod: %v", who.name, err)
		}
		for _, f := range fields {
			pod := who.pod.DeepCopy()
			f.change(&pod.Spec)
			err := who.c.Create(ctx, pod, client.DryRunAll)
			switch {
			case err == nil:
				t.Errorf("%s: a pod with %s admitted, want refused", who.name, f.name)
			case apierrors.IsInvalid(err):
				t.Logf("%s: a pod with %s refused by the API server's validation: %v", who.name, f.name, err)
			case !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'nodeops-"):
				t.Errorf("%s: a pod with %s: %v, want refused by nodeops' policy", who.name, f.name, err)
			}
		}
	}
}

// TestAgentOfAHashedNodeTakesNoOtherLease (issue 24, point 6): the agent of a node whose name looks
// hashed (so its Lease's name is hashed too, a hash CEL cannot compute) still creates only a Lease
// of its own node's hashed form, not any name it likes.
func TestAgentOfAHashedNodeTakesNoOtherLease(t *testing.T) {
	ctx := context.Background()
	node := "h-0123456789abcdef"
	if err := admin.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-" + node, Namespace: ns},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: agentSA, Containers: []corev1.Container{{Name: "agent", Image: "agent"}}}}
	if err := admin.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	c, _ := as(t, token(t, node))
	for _, name := range []string{"node-c", "kube-scheduler", "node-c-0123456789abcdef", "node-" + node + "-0123456789abcdef-x"} {
		l := confine.NodeLease(ns, node)
		l.Name = name
		confine.Refused(t, "the agent of "+node+" creating Lease "+name, c.Create(ctx, l, client.DryRunAll),
			[]string{"creates or updates only its own node's Lease", "CREATE leases " + name})
	}
	own := confine.NodeLease(ns, node)
	if own.Name != objname.NodeLeaseName(node) || own.Name == "node-"+node {
		t.Fatalf("the Lease of %s is %s, want a hashed name", node, own.Name)
	}
	own.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To("t")}
	if err := c.Create(ctx, own, client.DryRunAll); err != nil {
		t.Errorf("the agent of %s creating its own Lease %s: %v", node, own.Name, err)
	}
}

// TestManagerJobsAreAgentJobs (issue 24, point 6): the Job controller makes a Job's pods, so the
// manager's pod policy never sees them; the manager's Jobs are held to the agent Job's shape.
func TestManagerJobsAreAgentJobs(t *testing.T) {
	ctx := context.Background()
	good := agentjob.BuildJob("node-a", agentjob.Options{Image: "ghcr.io/nodeops/agent:v1"})
	if err := manager.Create(ctx, good.DeepCopy(), client.DryRunAll); err != nil {
		t.Fatalf("the manager creating node-a's agent Job: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*batchv1.Job)
		want   string
	}{
		{"a Job running as the manager", func(j *batchv1.Job) { j.Spec.Template.Spec.ServiceAccountName = "nodeops-manager" }, "run only /agent"},
		{"a Job running another program", func(j *batchv1.Job) { j.Spec.Template.Spec.Containers[0].Command = []string{"/bin/sh"} }, "run only /agent"},
		{"a Job mounting a Secret", func(j *batchv1.Job) {
			j.Spec.Template.Spec.Volumes = append(j.Spec.Template.Spec.Volumes, corev1.Volume{Name: "s",
				VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "kept"}}})
		}, "mount only the hostPath /"},
		{"a Job naming a Secret in imagePullSecrets", func(j *batchv1.Job) {
			j.Spec.Template.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "kept"}}
		}, "imagePullSecrets"},
		{"a Job taking env from a Secret", func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].Env = append(j.Spec.Template.Spec.Containers[0].Env, corev1.EnvVar{Name: "T",
				ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "kept"}, Key: "k"}}})
		}, "env only from their own fields"},
		{"a Job bound to no node", func(j *batchv1.Job) { j.Spec.Template.Spec.NodeName = "" }, "spec.template.spec.nodeName set"},
		{"a Job outside nodeops-system", func(j *batchv1.Job) { j.Namespace = "default" }, "in namespace default"},
	} {
		j := good.DeepCopy()
		tc.change(j)
		confine.Refused(t, tc.name, manager.Create(ctx, j, client.DryRunAll), []string{"nodeops' manager creates", tc.want})
	}
	cron := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "by-manager", Namespace: ns},
		Spec: batchv1.CronJobSpec{Schedule: "* * * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: good.Spec}}}
	confine.Refused(t, "a CronJob", manager.Create(ctx, cron, client.DryRunAll), []string{"no CronJobs", "cronjobs by-manager"})
	if err := admin.Create(ctx, good.DeepCopy(), client.DryRunAll); err != nil {
		t.Errorf("an administrator's Job: %v (the policy is the manager's only)", err)
	}
}
