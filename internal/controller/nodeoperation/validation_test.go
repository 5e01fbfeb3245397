package nodeoperation_test

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// Invalid specs are rejected by the real API server (OpenAPI schema and CEL rules), each with a
// message naming the field.
func TestInvalidSpecsRejected(t *testing.T) {
	f := newFixture(t)
	wait := []v1alpha1.Command{waitCmd()}
	custom := func(groups ...v1alpha1.Group) v1alpha1.NodeOperationSpec {
		return v1alpha1.NodeOperationSpec{Custom: &v1alpha1.CustomOperation{Groups: groups}}
	}
	source := &v1alpha1.BinarySource{BaseURL: "https://b.local"}
	many := make([]v1alpha1.Group, 17)
	for i := range many {
		many[i] = v1alpha1.Group{Name: fmt.Sprint("g", i), Commands: wait}
	}
	withGates := func(s v1alpha1.NodeOperationSpec, gates ...v1alpha1.Gate) v1alpha1.NodeOperationSpec {
		s.Gates = gates
		return s
	}
	withMU := func(s v1alpha1.NodeOperationSpec, mu string) v1alpha1.NodeOperationSpec {
		s.MaxUnavailable = intOrStr(mu)
		return s
	}
	tests := []struct {
		name  string
		spec  v1alpha1.NodeOperationSpec
		field string // the field the message must name
		why   string
	}{
		{"no operation", v1alpha1.NodeOperationSpec{}, "spec", "exactly one of upgrade, renewCertificates, reconfigure, rotateCertificateAuthorities or custom"},
		{"rotation completion unknown", v1alpha1.NodeOperationSpec{RotateCertificateAuthorities: &v1alpha1.RotateCertificateAuthoritiesOperation{Completion: "Later"}}, "spec.rotateCertificateAuthorities.completion", "Unsupported value"},
		{"two operations", v1alpha1.NodeOperationSpec{RenewCertificates: &v1alpha1.RenewCertificatesOperation{}, Custom: &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{{Name: "g", Commands: wait}}}}, "spec", "exactly one of"},
		{"bad version", v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "1.37", BinarySource: source}}, "spec.upgrade.kubernetesVersion", ""},
		{"upgrade without binary source", v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2"}}, "spec.upgrade.binarySource", "binarySource is required"},
		{"packages with a binary source", v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", PackageSource: "apt", BinarySource: source}}, "spec.upgrade.binarySource", "binarySource serves packageSource binaries only"},
		{"repository without packages", v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", BinarySource: source, PackageRepository: &v1alpha1.PackageRepository{Name: "k", URL: "https://p", Trusted: true}}}, "spec.upgrade.packageRepository", "packageRepository needs packageSource"},
		{"unsigned repository not trusted", v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", PackageSource: "dnf", PackageRepository: &v1alpha1.PackageRepository{Name: "k", URL: "https://p"}}}, "spec.upgrade.packageRepository", "set signingKey, or trusted: true"},
		{"unknown package source", v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", PackageSource: "pacman"}}, "spec.upgrade.packageSource", "Unsupported value"},
		{"package name as an option", custom(v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{{InstallPackages: &v1alpha1.InstallPackagesCommand{Packages: []string{"--allow-unauthenticated"}}}}}), "spec.custom.groups[0].commands[0].installPackages.packages[0]", ""},
		{"unknown package manager", custom(v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{{InstallPackages: &v1alpha1.InstallPackagesCommand{Packages: []string{"kubeadm"}, Manager: "pacman"}}}}), "spec.custom.groups[0].commands[0].installPackages.manager", "Unsupported value"},
		{"bad binary source", v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", BinarySource: &v1alpha1.BinarySource{BaseURL: "ftp://x"}}}, "spec.upgrade.binarySource.baseURL", ""},
		{"unknown certificate", v1alpha1.NodeOperationSpec{RenewCertificates: &v1alpha1.RenewCertificatesOperation{Certificates: []string{"everything"}}}, "spec.renewCertificates.certificates[0]", "Unsupported value"},
		{"no groups", custom(), "spec.custom.groups", ""},
		{"too many groups", custom(many...), "spec.custom.groups", "must have at most 16 items"},
		{"duplicate group names", custom(v1alpha1.Group{Name: "g", Commands: wait}, v1alpha1.Group{Name: "g", Commands: wait}), "spec.custom.groups[1]", "Duplicate value"},
		{"bad group name", custom(v1alpha1.Group{Name: "Bad_Name", Commands: wait}), "spec.custom.groups[0].name", ""},
		{"no commands", custom(v1alpha1.Group{Name: "g"}), "spec.custom.groups[0].commands", ""},
		{"command without kind", custom(v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{{Name: "nothing"}}}), "spec.custom.groups[0].commands[0]", "exactly one command kind"},
		{"command with two kinds", custom(v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{{Cordon: &v1alpha1.CordonCommand{}, Uncordon: &v1alpha1.UncordonCommand{}}}}), "spec.custom.groups[0].commands[0]", "exactly one command kind"},
		{"bad node filter", custom(v1alpha1.Group{Name: "g", NodeFilter: "Middle", Commands: wait}), "spec.custom.groups[0].nodeFilter", "Unsupported value"},
		{"group maxUnavailable 0", custom(v1alpha1.Group{Name: "g", MaxUnavailable: intOrStr("0"), Commands: wait}), "spec.custom.groups[0].maxUnavailable", "integer >= 1"},
		{"maxUnavailable 0%", withMU(custom(v1alpha1.Group{Name: "g", Commands: wait}), "0%"), "spec.maxUnavailable", "percentage from 1% to 100%"},
		{"maxUnavailable 150%", withMU(custom(v1alpha1.Group{Name: "g", Commands: wait}), "150%"), "spec.maxUnavailable", "percentage from 1% to 100%"},
		{"maxUnavailable words", withMU(custom(v1alpha1.Group{Name: "g", Commands: wait}), "half"), "spec.maxUnavailable", ""},
		{"gate of two kinds", withGates(custom(v1alpha1.Group{Name: "g", Commands: wait}), v1alpha1.Gate{Name: "x", Approval: &v1alpha1.ApprovalGate{}, ClusterHealth: &v1alpha1.ClusterHealthGate{}}), "spec.gates[0]", "exactly one of cel, clusterHealth"},
		{"gate of no kind", withGates(custom(v1alpha1.Group{Name: "g", Commands: wait}), v1alpha1.Gate{Name: "x"}), "spec.gates[0]", "exactly one of cel, clusterHealth"},
		{"duplicate gate names", withGates(custom(v1alpha1.Group{Name: "g", Commands: wait}), v1alpha1.Gate{Name: "x", Approval: &v1alpha1.ApprovalGate{}}, v1alpha1.Gate{Name: "x", ClusterHealth: &v1alpha1.ClusterHealthGate{}}), "spec.gates[1]", "Duplicate value"},
		{"bad gate name", withGates(custom(v1alpha1.Group{Name: "g", Commands: wait}), v1alpha1.Gate{Name: "No_Way", Approval: &v1alpha1.ApprovalGate{}}), "spec.gates[0].name", ""},
		{"command gate without a script", custom(v1alpha1.Group{Name: "g", Commands: wait, Scheduling: v1alpha1.Scheduling{Gates: []v1alpha1.Gate{{Name: "raid", Command: &v1alpha1.CommandGate{}}}}}), "spec.custom.groups[0].gates[0].command.script", "at least 1 chars long"},
		{"cel gate with name and selector", withGates(custom(v1alpha1.Group{Name: "g", Commands: wait}), v1alpha1.Gate{Name: "x", CEL: &v1alpha1.CELGate{APIVersion: "v1", Kind: "ConfigMap", Name: "a", Selector: &metav1.LabelSelector{}, Expression: "true"}}), "spec.gates[0].cel", "exactly one of name or selector"},
		{"prometheus gate without http", withGates(custom(v1alpha1.Group{Name: "g", Commands: wait}), v1alpha1.Gate{Name: "x", Prometheus: &v1alpha1.PrometheusGate{URL: "ftp://p", Query: "up"}}), "spec.gates[0].prometheus.url", "http or https URL"},
		{"bad alertmanager matcher", withGates(custom(v1alpha1.Group{Name: "g", Commands: wait}), v1alpha1.Gate{Name: "x", Alertmanager: &v1alpha1.AlertmanagerGate{URL: "http://am:9093", Matchers: []string{"severity"}}}), "spec.gates[0].alertmanager.matchers[0]", ""},
		{"gate timeout 0", withGates(custom(v1alpha1.Group{Name: "g", Commands: wait}), v1alpha1.Gate{Name: "x", Timeout: &metav1.Duration{}, Approval: &v1alpha1.ApprovalGate{}}), "spec.gates[0].timeout", "from 1s to 168h"},
		{"bad execution mode", func() v1alpha1.NodeOperationSpec {
			s := custom(v1alpha1.Group{Name: "g", Commands: wait})
			s.ExecutionMode = "Fast"
			return s
		}(), "spec.executionMode", "Unsupported value"},
		{"negative ttl", func() v1alpha1.NodeOperationSpec {
			s := custom(v1alpha1.Group{Name: "g", Commands: wait})
			s.TTLSecondsAfterFinished = ptr.To(int32(-1))
			return s
		}(), "spec.ttlSecondsAfterFinished", ""},
		{"empty script", custom(v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{{Script: &v1alpha1.ScriptCommand{}}}}), "spec.custom.groups[0].commands[0].script.inline", ""},
		{"bad sha256", custom(v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{{InstallFile: &v1alpha1.InstallFileCommand{URL: "https://x/f", SHA256: "abc", Path: "/usr/bin/f"}}}}), "spec.custom.groups[0].commands[0].installFile.sha256", ""},
		{"relative path", custom(v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{{InstallFile: &v1alpha1.InstallFileCommand{URL: "https://x/f", SHA256: strings.Repeat("a", 64), Path: "usr/bin/f"}}}}), "spec.custom.groups[0].commands[0].installFile.path", ""},
		{"bad service name", custom(v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{{RestartService: &v1alpha1.RestartServiceCommand{Name: "kubelet; reboot"}}}}), "spec.custom.groups[0].commands[0].restartService.name", ""},
		{"too many retries", custom(v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{{Retries: 11, Wait: &v1alpha1.WaitCommand{}}}}), "spec.custom.groups[0].commands[0].retries", ""},
		{"bad pauseBefore node", func() v1alpha1.NodeOperationSpec {
			s := custom(v1alpha1.Group{Name: "g", Commands: wait})
			s.PauseBefore = []string{"Node_1"}
			return s
		}(), "spec.pauseBefore", "must be a node name"},
		{"bad group pauseBefore node", custom(v1alpha1.Group{Name: "g", Commands: wait, Scheduling: v1alpha1.Scheduling{PauseBefore: []string{"-x"}}}), "spec.custom.groups[0].pauseBefore", "must be a node name"},
		{"unknown binary", custom(v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{{InstallBinaries: &v1alpha1.InstallBinariesCommand{Components: []string{"etcd"}, Version: "v1.37.2", Source: *source}}}}), "spec.custom.groups[0].commands[0].installBinaries.components[0]", "Unsupported value"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-invalid-%d", f.id, i)}, Spec: tt.spec}
			err := f.c.Create(f.ctx, op)
			if err == nil {
				t.Fatalf("accepted: %+v", tt.spec)
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.field+":") && !strings.Contains(msg, tt.field+" ") {
				t.Errorf("message does not name %s: %s", tt.field, msg)
			}
			if tt.why != "" && !strings.Contains(msg, tt.why) {
				t.Errorf("message does not say %q: %s", tt.why, msg)
			}
		})
	}
	if len(tests) < 15 {
		t.Fatalf("only %d invalid specs", len(tests))
	}
}

// An upgrade through the package manager needs no binarySource; the server defaults what it leaves out.
func TestPackageUpgradeAccepted(t *testing.T) {
	f := newFixture(t)
	op := &v1alpha1.NodeOperation{ObjectMeta: metav1.ObjectMeta{Name: f.id + "-packages"}, Spec: v1alpha1.NodeOperationSpec{
		ExecutionMode: v1alpha1.ExecutionDryRun,
		NodeSelector:  &metav1.LabelSelector{MatchLabels: map[string]string{"nobody": f.id}},
		Upgrade: &v1alpha1.UpgradeOperation{KubernetesVersion: "v1.37.2", PackageSource: "auto",
			PackageRepository: &v1alpha1.PackageRepository{Name: "kubernetes", URL: "https://pkgs.example/core:/stable:/v1.37/deb/", SigningKey: "-----BEGIN PGP PUBLIC KEY BLOCK-----\n..."}}}}
	if err := f.c.Create(f.ctx, op); err != nil {
		t.Fatalf("an upgrade with packageSource auto was refused: %v", err)
	}
	var custom v1alpha1.NodeOperation
	custom.Name = f.id + "-install-packages"
	custom.Spec = v1alpha1.NodeOperationSpec{ExecutionMode: v1alpha1.ExecutionDryRun, NodeSelector: op.Spec.NodeSelector,
		Custom: &v1alpha1.CustomOperation{Groups: []v1alpha1.Group{{Name: "g", Commands: []v1alpha1.Command{{InstallPackages: &v1alpha1.InstallPackagesCommand{Packages: []string{"containerd.io"}}}}}}}}
	if err := f.c.Create(f.ctx, &custom); err != nil {
		t.Fatal(err)
	}
	if m := custom.Spec.Custom.Groups[0].Commands[0].InstallPackages.Manager; m != "auto" {
		t.Errorf("installPackages.manager defaulted to %q, want auto", m)
	}
}

// The spec is immutable except paused, abort (one way) and executionMode from Controlled to Auto.
func TestImmutableSpec(t *testing.T) {
	f := newFixture(t)
	op := f.operation("immutable", func(o *v1alpha1.NodeOperation) {
		o.Spec.ExecutionMode = v1alpha1.ExecutionControlled
		o.Spec.ResumedBefore = []string{"n1"}
		o.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"nobody": f.id}}
	}, v1alpha1.Group{Name: "g", Commands: []v1alpha1.Command{waitCmd()}})
	tests := []struct {
		name   string
		mutate func(*v1alpha1.NodeOperation)
		field  string
	}{
		{"groups", func(o *v1alpha1.NodeOperation) { o.Spec.Custom.Groups[0].Name = "other" }, "spec.custom"},
		{"selector", func(o *v1alpha1.NodeOperation) { o.Spec.NodeSelector = nil }, "spec.nodeSelector"},
		{"maxUnavailable", func(o *v1alpha1.NodeOperation) { o.Spec.MaxUnavailable = intOrStr("5") }, "spec.maxUnavailable"},
		{"pauseBefore", func(o *v1alpha1.NodeOperation) { o.Spec.PauseBefore = []string{"n9"} }, "spec.pauseBefore"},
		{"resumedBefore taken back", func(o *v1alpha1.NodeOperation) { o.Spec.ResumedBefore = nil }, "spec.resumedBefore"},
		{"mode to DryRun", func(o *v1alpha1.NodeOperation) { o.Spec.ExecutionMode = v1alpha1.ExecutionDryRun }, "spec.executionMode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				o := f.get(op.Name)
				tt.mutate(o)
				return f.c.Update(f.ctx, o)
			})
			if err == nil || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("update of %s: %v", tt.name, err)
			}
		})
	}
	// What may change does.
	f.update(op.Name, func(o *v1alpha1.NodeOperation) { o.Spec.Paused = true })
	f.update(op.Name, func(o *v1alpha1.NodeOperation) { o.Spec.ResumedBefore = append(o.Spec.ResumedBefore, "n2") })
	f.update(op.Name, func(o *v1alpha1.NodeOperation) { o.Spec.ExecutionMode = v1alpha1.ExecutionAuto })
	f.update(op.Name, func(o *v1alpha1.NodeOperation) { o.Spec.Abort = true })
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		o := f.get(op.Name)
		o.Spec.Abort = false
		return f.c.Update(f.ctx, o)
	})
	if err == nil || !strings.Contains(err.Error(), "spec.abort") {
		t.Fatalf("abort undone: %v", err)
	}
}
