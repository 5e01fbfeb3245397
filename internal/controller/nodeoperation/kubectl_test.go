package nodeoperation_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// `kubectl wait --for=condition=Succeeded nodeoperation/NAME` returns once the operation succeeded.
func TestKubectlWaitSucceeded(t *testing.T) {
	dir := os.Getenv("NODEOPS_BIN")
	if dir == "" {
		dir = os.Getenv("KUBEBUILDER_ASSETS")
	}
	kubectl := filepath.Join(dir, "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Fatalf("kubectl not found (run `make tools`): %v", err)
	}
	f := newFixture(t)
	f.nodes(nil, "n1", "n2")
	kubeconfig, err := env.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	op := f.operation("wait", nil, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	var out bytes.Buffer
	cmd := exec.CommandContext(f.ctx, kubectl, "--kubeconfig", kubeconfig, "wait", "--for=condition=Succeeded", "nodeoperation/"+op.Name, "--timeout=120s")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	first := f.waitTasks(op.Name, 1)[0]
	f.runAll(first.Name)
	select {
	case err := <-exited:
		t.Fatalf("kubectl wait returned before the operation succeeded: %v: %s", err, out.String())
	default:
	}
	for _, task := range f.waitTasks(op.Name, 2) {
		if task.Name != first.Name {
			f.runAll(task.Name)
		}
	}
	if err := <-exited; err != nil {
		t.Fatalf("kubectl wait: %v: %s", err, out.String())
	}
	if !strings.Contains(out.String(), "condition met") {
		t.Fatalf("kubectl wait said: %s", out.String())
	}
	if f.get(op.Name).Status.Phase != v1alpha1.OperationSucceeded {
		t.Fatal("kubectl wait returned but the operation has not succeeded")
	}
}
