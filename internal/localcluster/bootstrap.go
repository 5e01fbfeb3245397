package localcluster

import (
	"context"
	"encoding/base64"
	"fmt"
	"io/fs"
	"path"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	nodeopsv1alpha1 "github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/config"
)

// Names of the kubeadm objects in kube-system.
const (
	KubeadmConfigMap = "kubeadm-config"
	KubeletConfigMap = "kubelet-config"
	// ClusterConfigurationKey holds the ClusterConfiguration in kubeadm-config.
	ClusterConfigurationKey = "ClusterConfiguration"
)

// NewScheme returns a scheme with the Kubernetes built-in kinds, CRDs and the nodeops kinds.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, nodeopsv1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("building scheme: %w", err)
		}
	}
	return s, nil
}

// KubeadmObjects are what `kubeadm init` leaves in the API that kubeadm upgrade and certs read:
// kubeadm-config and kubelet-config with the RBAC that lets nodes read them, the kubeadm:cluster-admins
// binding the admin.conf of a control plane relies on, and kube-public/cluster-info.
func KubeadmObjects(kubernetesVersion, endpoint string, caPEM []byte) []client.Object {
	kubeSystem := metav1.NamespaceSystem
	nodeGroups := []rbacv1.Subject{
		{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:bootstrappers:kubeadm:default-node-token"},
		{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:nodes"},
	}
	readConfigMap := func(role, cm string) []client.Object {
		return []client.Object{
			&rbacv1.Role{
				ObjectMeta: metav1.ObjectMeta{Name: role, Namespace: kubeSystem},
				Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{cm}, Verbs: []string{"get"}}},
			},
			&rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: role, Namespace: kubeSystem},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role},
				Subjects:   nodeGroups,
			},
		}
	}
	clusterInfo := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority-data: %s
    server: https://%s
  name: ""
contexts: null
current-context: ""
preferences: {}
users: null
`, base64.StdEncoding.EncodeToString(caPEM), endpoint)
	objs := []client.Object{
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:cluster-admins"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "kubeadm:cluster-admins"}},
		},
		// A node renewing its own client certificate is approved by the controller-manager's
		// csrapproving controller (kubeadm init's binding; the kubelets' rotation and
		// reissueCertificates on a worker ask for it).
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:node-autoapprove-certificate-rotation"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"},
			Subjects:   nodeGroups[1:],
		},
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:get-nodes"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}},
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:get-nodes"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kubeadm:get-nodes"},
			Subjects:   nodeGroups[:1],
		},
		&corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: KubeadmConfigMap, Namespace: kubeSystem},
			Data:       map[string]string{ClusterConfigurationKey: ClusterConfiguration(kubernetesVersion, endpoint, "/etc/kubernetes/pki")},
		},
		&corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: KubeletConfigMap, Namespace: kubeSystem},
			Data:       map[string]string{"kubelet": KubeletConfiguration()},
		},
		&corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "cluster-info", Namespace: metav1.NamespacePublic},
			Data:       map[string]string{"kubeconfig": clusterInfo},
		},
	}
	objs = append(objs, readConfigMap("kubeadm:nodes-kubeadm-config", KubeadmConfigMap)...)
	return append(objs, readConfigMap("kubeadm:kubelet-config", KubeletConfigMap)...)
}

// createAll creates objs in order, leaving ones that already exist.
func createAll(ctx context.Context, c client.Client, objs []client.Object) error {
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %T %s: %w", o, client.ObjectKeyFromObject(o), err)
		}
	}
	return nil
}

// CRDs decodes the CustomResourceDefinitions embedded in the config package.
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	files, err := fs.Glob(config.CRDs, "crd/*.yaml")
	if err != nil {
		return nil, fmt.Errorf("listing embedded CRDs: %w", err)
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		data, err := config.CRDs.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading embedded %s: %w", f, err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(data, crd); err != nil {
			return nil, fmt.Errorf("decoding embedded %s: %w", path.Base(f), err)
		}
		crds = append(crds, crd)
	}
	if len(crds) == 0 {
		return nil, fmt.Errorf("no CRDs embedded in config/crd")
	}
	return crds, nil
}

// installCRDs creates (or updates) the nodeops CRDs and waits until each is Established.
func installCRDs(ctx context.Context, c client.Client) error {
	crds, err := CRDs()
	if err != nil {
		return err
	}
	for _, crd := range crds {
		err := c.Create(ctx, crd.DeepCopy())
		if apierrors.IsAlreadyExists(err) {
			existing := &apiextensionsv1.CustomResourceDefinition{}
			if err = c.Get(ctx, client.ObjectKeyFromObject(crd), existing); err == nil {
				existing.Spec = crd.Spec
				err = c.Update(ctx, existing)
			}
		}
		if err != nil {
			return fmt.Errorf("installing CRD %s: %w", crd.Name, err)
		}
	}
	for _, crd := range crds {
		err := WaitUntil(ctx, pollInterval, func(ctx context.Context) (bool, error) {
			got := &apiextensionsv1.CustomResourceDefinition{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(crd), got); err != nil {
				return false, err
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("waiting for CRD %s to be Established: %w", crd.Name, err)
		}
	}
	return nil
}
