package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/controller/nodeprofile"
	"github.com/nodeops/nodeops/internal/testutil"
)

// ProfileTimeout bounds a profile's installs or labels on a few nodes.
const ProfileTimeout = 3 * time.Minute

// GetNode reads a node.
func GetNode(t testing.TB, l *Local, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{}
	if err := l.Client.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	return n
}

// ProfileLabelled reports whether node carries profile's provisioned label.
func ProfileLabelled(t testing.TB, l *Local, profile, node string) bool {
	t.Helper()
	return labelled(GetNode(t, l, node), profile)
}

func labelled(n *corev1.Node, profile string) bool {
	return n.Labels[nodeprofile.ProvisionedLabel(profile)] == v1alpha1.ProvisionedValue
}

// WaitForProfileLabel waits until node carries profile's provisioned label (want) or not.
func WaitForProfileLabel(t testing.TB, l *Local, profile, node string, want bool) {
	t.Helper()
	testutil.EventuallyEvery(t, ProfileTimeout, PollInterval, fmt.Sprintf("%s labelled=%v by %s", node, want, profile), func(ctx context.Context) error {
		n := &corev1.Node{}
		if err := l.Client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
			return err
		}
		if got := labelled(n, profile); got != want {
			return fmt.Errorf("labelled=%v; profile says %s", got, ProfileSummary(ctx, l, profile))
		}
		return nil
	})
}

// ProfileSummary is a profile's node counts and conditions, for a failure's message.
func ProfileSummary(ctx context.Context, l *Local, name string) string {
	p := &v1alpha1.NodeProfile{}
	if err := l.Client.Get(ctx, client.ObjectKey{Name: name}, p); err != nil {
		return err.Error()
	}
	var parts []string
	for _, c := range p.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return fmt.Sprintf("%+v %s", p.Status.Nodes, strings.Join(parts, "; "))
}

// WaitForProfileCondition waits until profile's condition typ has status and returns it.
func WaitForProfileCondition(t testing.TB, l *Local, profile, typ string, status metav1.ConditionStatus) metav1.Condition {
	t.Helper()
	var got metav1.Condition
	testutil.EventuallyEvery(t, ProfileTimeout, PollInterval, fmt.Sprintf("%s %s=%s", profile, typ, status), func(ctx context.Context) error {
		p := &v1alpha1.NodeProfile{}
		if err := l.Client.Get(ctx, client.ObjectKey{Name: profile}, p); err != nil {
			return err
		}
		c := meta.FindStatusCondition(p.Status.Conditions, typ)
		if c == nil || c.Status != status {
			return fmt.Errorf("%s", ProfileSummary(ctx, l, profile))
		}
		got = *c
		return nil
	})
	return got
}

// WaitForProfileGone waits until the profile is deleted: its uninstalls done and its finalizer gone.
func WaitForProfileGone(t testing.TB, l *Local, profile string) {
	t.Helper()
	testutil.EventuallyEvery(t, 10*time.Minute, PollInterval, "profile "+profile+" gone", func(ctx context.Context) error {
		err := l.Client.Get(ctx, client.ObjectKey{Name: profile}, &v1alpha1.NodeProfile{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %s", ProfileSummary(ctx, l, profile))
	})
}

// LabelNodes sets label=value on the nodes, sixteen patches at a time.
func LabelNodes(t testing.TB, l *Local, label, value string, nodes ...string) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(nodes))
	sem := make(chan struct{}, 16)
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{label: value}}})
	if err != nil {
		t.Fatal(err)
	}
	patch := client.RawPatch(types.MergePatchType, body)
	for _, name := range nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := l.Client.Patch(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, patch); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// CountProfileLabelled counts the nodes that carry profile's provisioned label.
func CountProfileLabelled(ctx context.Context, l *Local, profile string) (int, error) {
	var nodes corev1.NodeList
	if err := l.Client.List(ctx, &nodes, client.MatchingLabels{nodeprofile.ProvisionedLabel(profile): v1alpha1.ProvisionedValue}); err != nil {
		return 0, err
	}
	return len(nodes.Items), nil
}
