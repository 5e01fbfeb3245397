package framework

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/internal/localcluster"
)

// AsAgent is a client and clientset that authenticate as node's agent does with
// --agent-credentials=pod-bound: with the token nodeops-local minted for it (bound to its stand-in
// pod) and keeps in DIR/credentials.
func AsAgent(t testing.TB, l *Local, node string) (client.Client, *kubernetes.Clientset) {
	t.Helper()
	return asComponent(t, l, "agent-"+node)
}

// AsAgentPod is a client and clientset that authenticate as the agent of an agent Job's pod does
// with --agent-mode=Job: with the token nodeops-local minted bound to that pod.
func AsAgentPod(t testing.TB, l *Local, pod string) (client.Client, *kubernetes.Clientset) {
	t.Helper()
	return asComponent(t, l, "agent-"+pod)
}

func asComponent(t testing.TB, l *Local, component string) (client.Client, *kubernetes.Clientset) {
	t.Helper()
	cfg := rest.AnonymousClientConfig(l.RESTConfig)
	cfg.BearerTokenFile = localcluster.TokenFile(l.Dir, component)
	c, err := client.New(cfg, client.Options{Scheme: l.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, cs
}

// WhoAmI is the user the API server sees behind cs (a SelfSubjectReview).
func WhoAmI(t testing.TB, cs kubernetes.Interface) authenticationv1.UserInfo {
	t.Helper()
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview: %v", err)
	}
	return r.Status.UserInfo
}

// ProcessArgs are the command-line arguments of nodeops-local's child name, read from /proc.
func ProcessArgs(t testing.TB, l *Local, name string) []string {
	t.Helper()
	pid := processPID(t, l, name)
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		t.Fatalf("reading the arguments of %s: %v", name, err)
	}
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
}
