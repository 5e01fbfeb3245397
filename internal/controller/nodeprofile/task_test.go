package nodeprofile

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/objname"
)

func testProfile() *v1alpha1.NodeProfile {
	return &v1alpha1.NodeProfile{
		ObjectMeta: metav1.ObjectMeta{Name: "wasm", UID: "uid-1"},
		Spec: v1alpha1.NodeProfileSpec{
			AutoProvision: true,
			Install:       []v1alpha1.Command{{Name: "shim", InstallFile: &v1alpha1.InstallFileCommand{URL: "https://x/a", SHA256: strings.Repeat("a", 64), Path: "/a"}}},
			Uninstall:     []v1alpha1.Command{{Name: "rm-shim", InstallFile: &v1alpha1.InstallFileCommand{Path: "/a", Remove: true}}},
		},
	}
}

func TestBuildTask(t *testing.T) {
	p := testProfile()
	task := BuildTask(p, "worker-1", ActionInstall, "0123456789")
	// The group "install-<hash>" holds a '-', so the readable join is followed by a hash (objname.TaskName).
	if !strings.HasPrefix(task.Name, "wasm-install-0123456789-worker-1-") || task.Name != objname.TaskName("wasm", "install-0123456789", "worker-1") {
		t.Errorf("name = %q", task.Name)
	}
	if again := BuildTask(p, "worker-1", ActionInstall, "0123456789"); again.Name != task.Name {
		t.Errorf("name not deterministic")
	}
	if other := BuildTask(p, "worker-1", ActionInstall, "abcdefabcd"); other.Name == task.Name {
		t.Errorf("a new spec hash must give a new task name")
	}
	want := map[string]string{v1alpha1.LabelProfile: "wasm", v1alpha1.LabelNode: "worker-1", v1alpha1.LabelGroup: "install-0123456789"}
	for k, v := range want {
		if task.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, task.Labels[k], v)
		}
	}
	ref := metav1.GetControllerOf(task)
	if ref == nil || ref.UID != "uid-1" || ref.Kind != "NodeProfile" {
		t.Errorf("controller ref = %+v", ref)
	}
	if task.Spec.NodeName != "worker-1" || task.Spec.Operation != "wasm" || len(task.Spec.Commands) != 1 || task.Spec.Commands[0].Name != "shim" {
		t.Errorf("spec = %+v", task.Spec)
	}
	task.Spec.Commands[0].InstallFile.Path = "/mutated"
	if p.Spec.Install[0].InstallFile.Path != "/a" {
		t.Errorf("the task shares commands with the profile")
	}
	un := BuildTask(p, "worker-1", ActionUninstall, "0123456789")
	if un.Spec.Commands[0].Name != "rm-shim" || un.Name == task.Name {
		t.Errorf("uninstall task = %s %+v", un.Name, un.Spec.Commands)
	}
	long := BuildTask(p, strings.Repeat("n", 250), ActionInstall, "0123456789")
	if errs := validation.IsDNS1123Subdomain(long.Name); len(errs) > 0 {
		t.Errorf("long node: name %q invalid: %v", long.Name, errs)
	}
	if errs := validation.IsValidLabelValue(long.Labels[v1alpha1.LabelNode]); len(errs) > 0 {
		t.Errorf("long node: label invalid: %v", errs)
	}
	v, ok := ViewTask(long)
	if !ok || v.Action != ActionInstall || v.Hash != "0123456789" || v.Node != strings.Repeat("n", 250) {
		t.Errorf("ViewTask = %+v, %v", v, ok)
	}
}

func TestParseGroup(t *testing.T) {
	for g, want := range map[string]bool{"install-abc": true, "uninstall-abc": true, "install-": false, "workers": false, "upgrade-abc": false} {
		if _, _, ok := parseGroup(g); ok != want {
			t.Errorf("parseGroup(%q) ok = %v, want %v", g, ok, want)
		}
	}
}

func TestFailureMessage(t *testing.T) {
	exit := int32(1)
	tests := []struct {
		name   string
		status v1alpha1.NodeTaskStatus
		abort  bool
		want   string
	}{
		{name: "running", status: v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskRunning}, want: ""},
		{name: "command message", want: "command shim failed: sha256 mismatch: got 12, want 34", status: v1alpha1.NodeTaskStatus{
			Phase: v1alpha1.TaskFailed, Message: "command shim failed",
			Commands: []v1alpha1.CommandStatus{{Name: "shim", Phase: v1alpha1.CommandFailed, Message: "sha256 mismatch: got 12, want 34"}},
		}},
		{name: "exit code only", want: "command s failed: exit code 1", status: v1alpha1.NodeTaskStatus{
			Phase: v1alpha1.TaskFailed, Commands: []v1alpha1.CommandStatus{{Name: "s", Phase: v1alpha1.CommandFailed, ExitCode: &exit}},
		}},
		{name: "task message", status: v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskFailed, Message: "interrupted"}, want: "interrupted"},
		{name: "aborted", status: v1alpha1.NodeTaskStatus{Phase: v1alpha1.TaskAborted}, want: "task Aborted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			task := &v1alpha1.NodeTask{Status: tt.status}
			task.Spec.Abort = tt.abort
			if got := FailureMessage(task); got != tt.want {
				t.Errorf("FailureMessage = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestNodePatchBody(t *testing.T) {
	set, err := NodePatchBody("wasm", nil, NodePatch{Node: "n", Provisioned: true}, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(set); got != `{"metadata":{"annotations":{"nodeops.io/profile-hash.wasm":"h1"},"labels":{"nodeops.io/profile.wasm":"provisioned"}}}` {
		t.Errorf("set patch = %s", got)
	}
	rm, err := NodePatchBody("wasm", nil, NodePatch{Node: "n"}, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(rm); got != `{"metadata":{"annotations":{"nodeops.io/profile-hash.wasm":null},"labels":{"nodeops.io/profile.wasm":null}}}` {
		t.Errorf("remove patch = %s", got)
	}
	// KWasm's label, as its operator sets it: the node's name.
	kwasm := []v1alpha1.ProvisionedLabel{{Key: "kwasm.sh/kwasm-provisioned", Value: "$(NODE_NAME)"}}
	set, err = NodePatchBody("wasm", kwasm, NodePatch{Node: "n", Provisioned: true}, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(set); got != `{"metadata":{"annotations":{"nodeops.io/profile-hash.wasm":"h1"},"labels":{"kwasm.sh/kwasm-provisioned":"n","nodeops.io/profile.wasm":"provisioned"}}}` {
		t.Errorf("set patch with provisionedLabels = %s", got)
	}
	rm, err = NodePatchBody("wasm", kwasm, NodePatch{Node: "n"}, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(rm); got != `{"metadata":{"annotations":{"nodeops.io/profile-hash.wasm":null},"labels":{"kwasm.sh/kwasm-provisioned":null,"nodeops.io/profile.wasm":null}}}` {
		t.Errorf("remove patch with provisionedLabels = %s", got)
	}
}
