package localcluster

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/config"
	"github.com/nodeops/nodeops/internal/testutil"
)

// TestCredentialsAreMintedAgain: on a real API server (envtest) the agent's kubeconfig authenticates
// as nodeops-agent with its stand-in pod's node, and once a token is due the run loop writes a new
// one, still bound to that pod, into the file the kubeconfig names; remint writes new tokens only
// once the API server signs them with the key asked for.
func TestCredentialsAreMintedAgain(t *testing.T) {
	env, err := testutil.Start("nodetasks")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c := env.Client
	if err := createAll(ctx, c, []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: SystemNamespace}}, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}}}); err != nil {
		t.Fatal(err)
	}
	rbac, err := config.RBAC()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range rbac {
		if err := createAll(ctx, c, []client.Object{o}); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	host, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(host.Port())
	l := clusterLayout{Dir: dir, APIPort: port, PodBound: true}
	if err := os.MkdirAll(filepath.Join(dir, "pki"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.pki("ca.crt"), env.Config.CAData, 0o644); err != nil {
		t.Fatal(err)
	}
	creds, err := newCredentials(ctx, l, env.Config, c, []string{"worker-1"}, true)
	if err != nil {
		t.Fatal(err)
	}
	whoami := func() authenticationv1.UserInfo {
		t.Helper()
		cfg, err := clientcmd.BuildConfigFromFlags("", CredentialsKubeconfig(dir, "agent-worker-1"))
		if err != nil {
			t.Fatal(err)
		}
		r, err := kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SelfSubjectReview with the agent's kubeconfig: %v", err)
		}
		return r.Status.UserInfo
	}
	check := func(when string) {
		t.Helper()
		u := whoami()
		if u.Username != "system:serviceaccount:nodeops-system:nodeops-agent" || !slices.Equal(u.Extra["authentication.kubernetes.io/node-name"], []string{"worker-1"}) ||
			!slices.Equal(u.Extra["authentication.kubernetes.io/pod-name"], []string{StandInAgentPodName("worker-1")}) {
			t.Errorf("%s: the agent's kubeconfig is %q with extra %v", when, u.Username, u.Extra)
		}
	}
	check("first minted")
	first, err := os.ReadFile(TokenFile(dir, "agent-worker-1"))
	if err != nil {
		t.Fatal(err)
	}

	creds.mu.Lock()
	for _, cr := range creds.creds {
		cr.refreshAt = time.Now()
	}
	creds.mu.Unlock()
	go creds.run(ctx, t.Logf)
	testutil.Eventually(t, 30*time.Second, "the agent's token minted again", func() error {
		again, err := os.ReadFile(TokenFile(dir, "agent-worker-1"))
		if err != nil {
			return err
		}
		if string(again) == string(first) {
			return errors.New("the token file still holds the first token")
		}
		return nil
	})
	check("minted again")
	creds.mu.Lock()
	for _, cr := range creds.creds {
		if time.Until(cr.refreshAt) < time.Hour {
			t.Errorf("%s is due again at %s", cr.component, cr.refreshAt)
		}
	}
	creds.mu.Unlock()

	// remint (after the CA stand-in restarted the API server on a new signing key) writes only
	// tokens whose header names the key asked for.
	held, err := os.ReadFile(TokenFile(dir, "agent-worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	kid, err := TokenKeyID(string(held))
	if err != nil || kid == "" {
		t.Fatalf("the token's key ID %q: %v", kid, err)
	}
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	err = creds.remint(short, "a-key-the-api-server-does-not-sign-with")
	cancelShort()
	if !errors.Is(err, errOtherSigningKey) {
		t.Errorf("remint for another key: %v", err)
	}
	if now, _ := os.ReadFile(TokenFile(dir, "agent-worker-1")); string(now) != string(held) {
		t.Error("remint for another key wrote a token")
	}
	if err := creds.remint(ctx, kid); err != nil {
		t.Fatal(err)
	}
	if now, _ := os.ReadFile(TokenFile(dir, "agent-worker-1")); string(now) == string(held) {
		t.Error("remint wrote no new token")
	}
	check("minted for the signing key")
}
