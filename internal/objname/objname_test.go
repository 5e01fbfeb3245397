package objname

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestTaskName(t *testing.T) {
	long := strings.Repeat("n", 250)
	tests := []struct {
		name               string
		owner, group, node string
		want               string // empty: hashed, checked for validity only
	}{
		{name: "plain", owner: "upgrade", group: "workers", node: "worker-1", want: "upgrade-workers-worker-1"},
		{name: "dotted node", owner: "op", group: "g", node: "ip-10-0-0-1.ec2.internal", want: "op-g-ip-10-0-0-1.ec2.internal"},
		{name: "too long", owner: "op", group: "g", node: long},
		{name: "uppercase node", owner: "op", group: "g", node: "Worker_1"},
		{name: "exactly 253", owner: "o", group: "g", node: strings.Repeat("x", 249), want: "o-g-" + strings.Repeat("x", 249)},
		{name: "253-character node", owner: "upgrade", group: "workers", node: strings.Repeat("n", 253)},
		{name: "dash in the owner", owner: "steer-op", group: "rest", node: "b-3"},
		{name: "dash in the group", owner: "op", group: "control-plane-first", node: "cp-1"},
		{name: "node ending like a hash", owner: "op", group: "g", node: "n-0123456789abcdef"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := TaskName(tt.owner, tt.group, tt.node)
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Fatalf("TaskName = %q, not a DNS-1123 subdomain: %v", got, errs)
			}
			if tt.want != "" && got != tt.want {
				t.Fatalf("TaskName = %q, want %q", got, tt.want)
			}
			if again := TaskName(tt.owner, tt.group, tt.node); again != got {
				t.Fatalf("not deterministic: %q then %q", got, again)
			}
		})
	}
	if a, b := TaskName("op", "g", long+"a"), TaskName("op", "g", long+"b"); a == b {
		t.Fatalf("distinct long names hash alike: %q", a)
	}
	// Joined with '-', these triples read alike; their names must not.
	for _, pair := range [][2][3]string{
		{{"a-b", "c", "n"}, {"a", "b-c", "n"}},
		{{"a", "b", "c-n"}, {"a", "b-c", "n"}},
		{{"a-b", "c", "n"}, {"a", "b", "c-n"}},
		// A plain name that copies another triple's hashed name.
		{{"o", "p", "g-n-" + TaskName("o-p", "g", "n")[len("o-p-g-n-"):]}, {"o-p", "g", "n"}},
	} {
		x, y := pair[0], pair[1]
		if a, b := TaskName(x[0], x[1], x[2]), TaskName(y[0], y[1], y[2]); a == b {
			t.Errorf("%q and %q share the task name %q", x, y, a)
		}
	}
	if got := TaskName("steer-op", "rest", "b-3"); !strings.HasPrefix(got, "steer-op-rest-b-3-") {
		t.Errorf("a hashed name lost its readable prefix: %q", got)
	}
	if a, b := TaskName("op", "g", "Node"), TaskName("op", "g", "node"); a == b {
		t.Fatalf("case-distinct nodes share a task name %q", a)
	}
}

func TestLabelValue(t *testing.T) {
	tests := []struct{ in, want string }{
		{"worker-1", "worker-1"},
		{"Worker_1.x", "Worker_1.x"},
		{strings.Repeat("a", 63), strings.Repeat("a", 63)},
		{strings.Repeat("a", 64), ""},
		{"ip-10-0-0-1.eu-west-1.compute.internal.example.com.some.long.domain.name", ""},
		{"-bad-", ""},
		{strings.Repeat("n", 253), ""},
		{"n-0123456789abcdef", ""},
		{"0123456789abcdef", ""},
	}
	for _, tt := range tests {
		got := LabelValue(tt.in)
		if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
			t.Errorf("LabelValue(%q) = %q, invalid: %v", tt.in, got, errs)
		}
		if tt.want != "" && got != tt.want {
			t.Errorf("LabelValue(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if tt.want == "" && got == tt.in {
			t.Errorf("LabelValue(%q) kept an invalid value", tt.in)
		}
	}
}

func TestNodeLeaseName(t *testing.T) {
	long := strings.Repeat("n", 250)
	tests := []struct{ node, want string }{
		{"worker-1", "node-worker-1"},
		{strings.Repeat("n", 248), "node-" + strings.Repeat("n", 248)},
		{long, ""},
		{long + "x", ""},
		{"w-0123456789abcdef", ""},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		got := NodeLeaseName(tt.node)
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("NodeLeaseName(%q) = %q, invalid: %v", tt.node, got, errs)
		}
		if tt.want != "" && got != tt.want {
			t.Errorf("NodeLeaseName(%q) = %q, want %q", tt.node, got, tt.want)
		}
		if other, ok := seen[got]; ok {
			t.Errorf("nodes %q and %q share the lease %q", other, tt.node, got)
		}
		seen[got] = tt.node
	}
}

func TestInstallerPodName(t *testing.T) {
	for _, node := range []string{"worker-1", "ip-10-0-0-1.ec2.internal", strings.Repeat("n", 243)} {
		if errs := validation.IsDNS1123Subdomain(InstallerPodName(node)); len(errs) > 0 {
			t.Errorf("InstallerPodName(%q) = %q, not a DNS subdomain: %v", node, InstallerPodName(node), errs)
		}
	}
}

func TestSecretHolderPodName(t *testing.T) {
	tasks := []string{"upgrade-workers-worker-1", "op-g-ip-10-0-0-1.ec2.internal", strings.Repeat("t", 253), "x"}
	seen := map[string]bool{}
	for _, task := range tasks {
		got := SecretHolderPodName(task)
		if errs := validation.IsDNS1123Label(got); len(errs) > 0 {
			t.Errorf("SecretHolderPodName(%q) = %q, not a DNS-1123 label: %v", task, got, errs)
		}
		if again := SecretHolderPodName(task); again != got {
			t.Errorf("SecretHolderPodName(%q) not deterministic: %q then %q", task, got, again)
		}
		if seen[got] || seen[InstallerPodName(task)] {
			t.Errorf("SecretHolderPodName(%q) = %q, the name of another task's pod", task, got)
		}
		seen[got], seen[InstallerPodName(task)] = true, true
	}
}

func TestSecretVolumeName(t *testing.T) {
	for secret, want := range map[string]string{
		"nodeops-script-db":                         "nodeops-script-db",
		"nodeops-script-db.prod":                    "",
		"nodeops-script-" + strings.Repeat("a", 60): "",
	} {
		got := SecretVolumeName(secret)
		if errs := validation.IsDNS1123Label(got); len(errs) > 0 {
			t.Errorf("SecretVolumeName(%q) = %q, not a DNS-1123 label: %v", secret, got, errs)
		}
		if want != "" && got != want {
			t.Errorf("SecretVolumeName(%q) = %q, want %q", secret, got, want)
		}
		if want == "" && (got == secret || !endsInHash(got)) {
			t.Errorf("SecretVolumeName(%q) = %q, want a prefix and a hash", secret, got)
		}
	}
}
