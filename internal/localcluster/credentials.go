package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/config"
)

// What the manager and the agents authenticate as (Options.AgentCredentials).
const (
	// CredentialsAdmin: DIR/kubeconfig (or Options.ComponentKubeconfig), an administrator, with no
	// nodeops RBAC or admission policy installed.
	CredentialsAdmin = "admin"
	// CredentialsPodBound: a real install's RBAC (config/manager, config/rbac, config/agent) and
	// admission policies (config/admission); each local node's agent runs with a token of
	// nodeops-system/nodeops-agent bound to a stand-in pod on its node (StandInAgentPod), and the
	// manager with a token of nodeops-system/nodeops-manager, the one user the NodeTask creation
	// policy lets create tasks. The simulated nodes' one agent keeps DIR/kubeconfig: a token is
	// bound to one pod, so to one node, and that agent serves them all.
	CredentialsPodBound = "pod-bound"
)

// Names of a real install that the pod-bound credentials use.
const (
	SystemNamespace       = "nodeops-system"
	AgentServiceAccount   = "nodeops-agent"
	ManagerServiceAccount = "nodeops-manager"
	// AgentLabel marks the agent's pods (config/agent's DaemonSet); drain leaves them.
	AgentLabel      = "app.kubernetes.io/name"
	AgentLabelValue = "nodeops-agent"
	// CredentialsDir, in DIR, holds <component>.token and <component>.kubeconfig for the manager
	// ("manager") and each local node's agent ("agent-<node>").
	CredentialsDir = "credentials"
	// tokenLifetime is what each TokenRequest asks for; tokens are minted again halfway through
	// the lifetime the API server granted, and client-go re-reads a kubeconfig's tokenFile.
	tokenLifetime = 24 * time.Hour
)

// StandInAgentPodName is the stand-in agent pod of node in SystemNamespace.
func StandInAgentPodName(node string) string { return "nodeops-agent-" + node }

// TokenFile is where nodeops-local keeps the current token of component ("manager", "agent-<node>").
func TokenFile(dir, component string) string {
	return filepath.Join(dir, CredentialsDir, component+".token")
}

// CredentialsKubeconfig is component's kubeconfig: the API server, its CA and TokenFile.
func CredentialsKubeconfig(dir, component string) string {
	return filepath.Join(dir, CredentialsDir, component+".kubeconfig")
}

// StandInAgentPod is the pod the agent of node would run in, as config/agent's DaemonSet makes it
// (namespace, ServiceAccount, label, spec.nodeName), so a token can be bound to it and the API server
// puts node into the token's user. nodeops-local has no kubelet: the pod never runs (kwok reports it
// Running); the agent runs as a process with that pod's token and --pod-name, so a drain leaves
// the pod as the agent's own. It tolerates every taint, as the DaemonSet does, so no taint evicts it
// and ends its token.
func StandInAgentPod(node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      StandInAgentPodName(node),
			Namespace: SystemNamespace,
			Labels:    map[string]string{AgentLabel: AgentLabelValue, "app.kubernetes.io/part-of": "nodeops"},
			Annotations: map[string]string{
				"nodeops.io/stand-in": "nodeops-local runs this node's agent as a process with a token bound to this pod; nothing runs in it",
			},
		},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: AgentServiceAccount,
			Tolerations:        []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:         []corev1.Container{{Name: "agent", Image: "nodeops-local/agent:stand-in"}},
		},
	}
}

// installRealRBACAndAdmission creates a real install's ServiceAccounts, roles and bindings and its
// admission policies, and waits until the API server enforces the policies.
func installRealRBACAndAdmission(ctx context.Context, cfg *rest.Config, c client.Client) error {
	objs, err := config.RBAC()
	if err != nil {
		return err
	}
	for _, o := range objs {
		if err := createAll(ctx, c, []client.Object{o}); err != nil {
			return err
		}
	}
	return config.InstallAdmission(ctx, cfg, c)
}

// credential is one component's ServiceAccount token, bound to pod when pod is set.
type credential struct {
	component, serviceAccount string
	pod                       *corev1.Pod
	refreshAt                 time.Time
}

// credentials mints the pod-bound credentials and keeps them fresh.
type credentials struct {
	cs     kubernetes.Interface
	dir    string
	server string
	ca     []byte

	mu    sync.Mutex
	creds []*credential
}

// newCredentials creates the stand-in pods of nodes' agents and mints a token and kubeconfig for
// the manager and each of those agents.
func newCredentials(ctx context.Context, l clusterLayout, cfg *rest.Config, c client.Client, agents []string, manager bool) (*credentials, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating a clientset: %w", err)
	}
	ca, err := os.ReadFile(l.pki("ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("reading CA: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(l.Dir, CredentialsDir), 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", CredentialsDir, err)
	}
	m := &credentials{cs: cs, dir: l.Dir, server: "https://" + l.endpoint(), ca: ca}
	if manager {
		m.creds = append(m.creds, &credential{component: "manager", serviceAccount: ManagerServiceAccount})
	}
	for _, node := range agents {
		pod := StandInAgentPod(node)
		if err := createAll(ctx, c, []client.Object{pod}); err != nil {
			return nil, err
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return nil, fmt.Errorf("reading pod %s: %w", pod.Name, err)
		}
		m.creds = append(m.creds, &credential{component: "agent-" + node, serviceAccount: AgentServiceAccount, pod: pod})
	}
	for _, cr := range m.creds {
		if err := m.mint(ctx, cr); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// mint asks for a token of cr's ServiceAccount (bound to its pod), for the API server's own audience,
// and writes it and a kubeconfig naming it; the token file is replaced in one rename.
func (m *credentials) mint(ctx context.Context, cr *credential) error {
	return m.mintSignedBy(ctx, cr, "")
}

// errOtherSigningKey: the API server signed a token with another key than the one asked for.
var errOtherSigningKey = errors.New("signed by another service-account key")

// mintSignedBy is mint; with kid set, a token whose header names another signing key is not written
// (errOtherSigningKey): the API server answering is still the one before a restart on a new key.
func (m *credentials) mintSignedBy(ctx context.Context, cr *credential, kid string) error {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(tokenLifetime.Seconds()))}}
	if cr.pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: cr.pod.Name, UID: cr.pod.UID}
	}
	issued := time.Now()
	tr, err := m.cs.CoreV1().ServiceAccounts(SystemNamespace).CreateToken(ctx, cr.serviceAccount, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("TokenRequest for %s/%s (%s): %w", SystemNamespace, cr.serviceAccount, cr.component, err)
	}
	if kid != "" {
		got, err := TokenKeyID(tr.Status.Token)
		if err != nil {
			return err
		}
		if got != kid {
			return fmt.Errorf("the token of %s: %w (%s, not %s)", cr.component, errOtherSigningKey, got, kid)
		}
	}
	if err := writeFileAtomic(TokenFile(m.dir, cr.component), []byte(tr.Status.Token), 0o600); err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: m.server, CertificateAuthorityData: m.ca}
	kc.AuthInfos[cr.component] = &clientcmdapi.AuthInfo{TokenFile: TokenFile(m.dir, cr.component)}
	kc.Contexts[cr.component] = &clientcmdapi.Context{Cluster: "local", AuthInfo: cr.component}
	kc.CurrentContext = cr.component
	if err := clientcmd.WriteToFile(*kc, CredentialsKubeconfig(m.dir, cr.component)); err != nil {
		return fmt.Errorf("writing %s's kubeconfig: %w", cr.component, err)
	}
	m.mu.Lock()
	cr.refreshAt = refreshTime(issued, tr.Status.ExpirationTimestamp.Time)
	m.mu.Unlock()
	return nil
}

// remint mints every token again, each once the API server signs it with the key kid names: the CA
// stand-in restarted the API server on a new signing key (followFirstControlPlane), and a real
// rotation's kubelet restarts give every pod a token of the new key before phase complete drops the
// old. A token whose pod is gone is left as it is.
func (m *credentials) remint(ctx context.Context, kid string) error {
	m.mu.Lock()
	creds := slices.Clone(m.creds)
	m.mu.Unlock()
	for _, cr := range creds {
		err := WaitUntil(ctx, pollInterval, func(ctx context.Context) (bool, error) {
			err := m.mintSignedBy(ctx, cr, kid)
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return err == nil, err
		})
		if err != nil {
			return fmt.Errorf("minting the token of %s again: %w", cr.component, err)
		}
	}
	return nil
}

// refreshTime is when a token issued at issued and expiring at expiry is minted again: halfway.
func refreshTime(issued, expiry time.Time) time.Time {
	return issued.Add(expiry.Sub(issued) / 2)
}

// addPod mints, as component, a token of pod's ServiceAccount bound to pod (an agent Job's pod),
// and keeps it fresh until removePod.
func (m *credentials) addPod(ctx context.Context, component string, pod *corev1.Pod) error {
	cr := &credential{component: component, serviceAccount: pod.Spec.ServiceAccountName, pod: pod}
	if err := m.mint(ctx, cr); err != nil {
		return err
	}
	m.mu.Lock()
	m.creds = append(m.creds, cr)
	m.mu.Unlock()
	return nil
}

// removePod stops renewing component's token; the pod it is bound to is gone or done.
func (m *credentials) removePod(component string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.creds = slices.DeleteFunc(m.creds, func(cr *credential) bool { return cr.component == component })
}

// run mints each token again once it is half through its life, until ctx ends. A stand-in pod
// that is gone (its node deleted) ends its token; it is left so. Tokens added later (addPod) are
// seen within a minute.
func (m *credentials) run(ctx context.Context, logf func(string, ...any)) {
	for {
		m.mu.Lock()
		sort.Slice(m.creds, func(i, j int) bool { return m.creds[i].refreshAt.Before(m.creds[j].refreshAt) })
		var next *credential
		wait := time.Minute
		if len(m.creds) > 0 {
			next = m.creds[0]
			wait = min(wait, time.Until(next.refreshAt))
		}
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		m.mu.Lock()
		due := next != nil && slices.Contains(m.creds, next) && !time.Now().Before(next.refreshAt)
		m.mu.Unlock()
		if !due {
			continue
		}
		err := m.mint(ctx, next)
		switch {
		case ctx.Err() != nil:
			return
		case apierrors.IsNotFound(err):
			logf("not renewing the token of %s: %v", next.component, err)
			m.mu.Lock()
			next.refreshAt = time.Now().Add(tokenLifetime)
			m.mu.Unlock()
		case err != nil:
			logf("renewing the token of %s (again in 10s): %v", next.component, err)
			m.mu.Lock()
			next.refreshAt = time.Now().Add(10 * time.Second)
			m.mu.Unlock()
		}
	}
}
