package framework

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/internal/localcluster"
)

// ManagerLeader reads the managers' Lease (nodeops-local --managers=N) and returns its holder
// identity and the process it names: the identity is NAME_UUID with NAME the manager's name in
// the process table (manager-1, ...) and a UUID new at each start of that process.
func ManagerLeader(ctx context.Context, l *Local) (identity, process string, err error) {
	lease := &coordinationv1.Lease{}
	key := client.ObjectKey{Namespace: localcluster.ManagerLeaseNamespace, Name: localcluster.ManagerLeaseName}
	if err := l.Client.Get(ctx, key, lease); err != nil {
		return "", "", fmt.Errorf("reading the managers' Lease: %w", err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		return "", "", fmt.Errorf("the managers' Lease has no holder: %+v", lease.Spec)
	}
	identity = *lease.Spec.HolderIdentity
	process, _, ok := strings.Cut(identity, "_")
	if !ok {
		return "", "", fmt.Errorf("holder identity %q is not NAME_UUID", identity)
	}
	return identity, process, nil
}

// KillProcess kills the child name of nodeops-local with SIGKILL and returns the PID it had;
// nodeops-local starts it again after a back-off, as a kubelet restarts a crashed pod.
func KillProcess(t testing.TB, l *Local, name string) int {
	t.Helper()
	pid := processPID(t, l, name)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing %s (pid %d): %v", name, pid, err)
	}
	return pid
}

// processPID is the PID of nodeops-local's child name; the test fails when there is none.
func processPID(t testing.TB, l *Local, name string) int {
	t.Helper()
	procs, err := l.Processes()
	if err != nil {
		t.Fatal(err)
	}
	pid, ok := procs[name]
	if !ok {
		t.Fatalf("no %s among %v", name, procs)
	}
	return pid
}
