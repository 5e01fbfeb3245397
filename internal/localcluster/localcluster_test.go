package localcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/internal/testutil"
)

func TestNodeSpecs(t *testing.T) {
	tests := []struct {
		cps, workers, sims int
		want               []NodeSpec
	}{
		{1, 0, 0, []NodeSpec{{Name: "cp-1", Role: RoleControlPlane, IP: "192.0.2.11"}}},
		{2, 2, 2, []NodeSpec{
			{Name: "cp-1", Role: RoleControlPlane, IP: "192.0.2.11"},
			{Name: "cp-2", Role: RoleControlPlane, IP: "192.0.2.12"},
			{Name: "worker-1", Role: RoleWorker, IP: "192.0.2.111"},
			{Name: "worker-2", Role: RoleWorker, IP: "192.0.2.112"},
			{Name: "sim-1", Role: RoleSim},
			{Name: "sim-2", Role: RoleSim},
		}},
	}
	for _, tt := range tests {
		got := NodeSpecs(tt.cps, tt.workers, tt.sims)
		if len(got) != len(tt.want) {
			t.Fatalf("NodeSpecs(%d,%d,%d) = %v", tt.cps, tt.workers, tt.sims, got)
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("NodeSpecs(%d,%d,%d)[%d] = %+v, want %+v", tt.cps, tt.workers, tt.sims, i, got[i], tt.want[i])
			}
		}
	}
	// The largest allowed counts keep every address inside 192.0.2.0/24.
	for _, s := range NodeSpecs(100, 100, 0) {
		last, err := strconv.Atoi(strings.TrimPrefix(s.IP, "192.0.2."))
		if !strings.HasPrefix(s.IP, "192.0.2.") || err != nil || last < 1 || last > 254 {
			t.Errorf("%s has address %s outside 192.0.2.1-254", s.Name, s.IP)
		}
	}
}

func TestNodeObject(t *testing.T) {
	tests := []struct {
		spec         NodeSpec
		controlPlane bool
		addresses    int
	}{
		{NodeSpec{Name: "cp-1", Role: RoleControlPlane, IP: "192.0.2.11"}, true, 2},
		{NodeSpec{Name: "worker-1", Role: RoleWorker, IP: "192.0.2.111"}, false, 2},
		{NodeSpec{Name: "sim-7", Role: RoleSim}, false, 0},
	}
	for _, tt := range tests {
		n := NodeObject(tt.spec, "v1.36.4")
		if n.Labels[LabelHostname] != tt.spec.Name || n.Labels[LabelOS] != "linux" {
			t.Errorf("%s: labels %v", tt.spec.Name, n.Labels)
		}
		_, isCP := n.Labels[LabelControlPlane]
		hasTaint := len(n.Spec.Taints) == 1 && n.Spec.Taints[0].Key == LabelControlPlane && n.Spec.Taints[0].Effect == corev1.TaintEffectNoSchedule
		if isCP != tt.controlPlane || hasTaint != tt.controlPlane || len(n.Spec.Taints) > 1 {
			t.Errorf("%s: control-plane label %v, taints %v", tt.spec.Name, isCP, n.Spec.Taints)
		}
		if len(n.Status.Addresses) != tt.addresses {
			t.Errorf("%s: addresses %v", tt.spec.Name, n.Status.Addresses)
		}
		if n.Status.NodeInfo.KubeletVersion != "v1.36.4" {
			t.Errorf("%s: kubelet version %q", tt.spec.Name, n.Status.NodeInfo.KubeletVersion)
		}
	}
}

func TestNodeReady(t *testing.T) {
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue}
	notReady := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse}
	taint := corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}
	tests := []struct {
		name       string
		conditions []corev1.NodeCondition
		taints     []corev1.Taint
		want       bool
	}{
		{"no conditions yet", nil, nil, false},
		{"ready", []corev1.NodeCondition{ready}, nil, true},
		{"not ready", []corev1.NodeCondition{notReady}, nil, false},
		{"ready but not-ready taint not yet removed", []corev1.NodeCondition{ready}, []corev1.Taint{taint}, false},
		{"control-plane taint does not matter", []corev1.NodeCondition{ready}, []corev1.Taint{{Key: LabelControlPlane, Effect: corev1.TaintEffectNoSchedule}}, true},
	}
	for _, tt := range tests {
		n := &corev1.Node{Spec: corev1.NodeSpec{Taints: tt.taints}, Status: corev1.NodeStatus{Conditions: tt.conditions}}
		if got := NodeReady(n); got != tt.want {
			t.Errorf("%s: NodeReady = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestKubeadmConfig checks the rendered configuration parses and carries what kubeadm needs.
func TestKubeadmConfig(t *testing.T) {
	tests := []struct {
		controlPlane bool
		taints       int
	}{{true, 1}, {false, 0}}
	for _, tt := range tests {
		out := KubeadmConfig(kubeadmConfigParams{
			NodeName: "n-1", AdvertiseAddress: "192.0.2.11", ControlPlane: tt.controlPlane,
			KubernetesVersion: "v1.35.2", Endpoint: "127.0.0.1:40001", CertificatesDir: "/etc/kubernetes/pki",
		})
		docs := strings.Split(out, "\n---\n")
		if len(docs) != 2 {
			t.Fatalf("want 2 documents, got %d:\n%s", len(docs), out)
		}
		var initCfg struct {
			Kind             string
			LocalAPIEndpoint struct{ AdvertiseAddress string }
			NodeRegistration struct {
				Name      string
				CRISocket string
				Taints    []corev1.Taint
			}
		}
		var clusterCfg struct {
			Kind                 string
			KubernetesVersion    string
			ControlPlaneEndpoint string
			CertificatesDir      string
			EncryptionAlgorithm  string
		}
		if err := yaml.UnmarshalStrict([]byte(docs[0]), &initCfg); err != nil && !strings.Contains(err.Error(), "unknown field") {
			t.Fatalf("init configuration: %v\n%s", err, docs[0])
		}
		if err := yaml.Unmarshal([]byte(docs[1]), &clusterCfg); err != nil {
			t.Fatalf("cluster configuration: %v\n%s", err, docs[1])
		}
		if initCfg.Kind != "InitConfiguration" || initCfg.NodeRegistration.Name != "n-1" || initCfg.LocalAPIEndpoint.AdvertiseAddress != "192.0.2.11" ||
			initCfg.NodeRegistration.CRISocket != CRISocket || len(initCfg.NodeRegistration.Taints) != tt.taints {
			t.Errorf("init configuration %+v", initCfg)
		}
		if clusterCfg.Kind != "ClusterConfiguration" || clusterCfg.KubernetesVersion != "v1.35.2" ||
			clusterCfg.ControlPlaneEndpoint != "127.0.0.1:40001" || clusterCfg.CertificatesDir != "/etc/kubernetes/pki" || clusterCfg.EncryptionAlgorithm != "ECDSA-P256" {
			t.Errorf("cluster configuration %+v", clusterCfg)
		}
	}
}

func TestKubeadmObjects(t *testing.T) {
	objs := KubeadmObjects("v1.36.4", "127.0.0.1:6443", []byte("CA"))
	var sawKubeadmConfig, sawKubeletConfig, sawAdmins bool
	for _, o := range objs {
		switch v := o.(type) {
		case *corev1.ConfigMap:
			switch v.Name {
			case KubeadmConfigMap:
				sawKubeadmConfig = strings.Contains(v.Data[ClusterConfigurationKey], "kubernetesVersion: v1.36.4") && v.Namespace == "kube-system"
			case KubeletConfigMap:
				sawKubeletConfig = strings.Contains(v.Data["kubelet"], "kind: KubeletConfiguration")
			}
		case *rbacv1.ClusterRoleBinding:
			if v.Name == "kubeadm:cluster-admins" {
				sawAdmins = v.RoleRef.Name == "cluster-admin" && v.Subjects[0].Name == "kubeadm:cluster-admins"
			}
		}
	}
	if !sawKubeadmConfig || !sawKubeletConfig || !sawAdmins {
		t.Errorf("kubeadm-config %v, kubelet-config %v, kubeadm:cluster-admins binding %v", sawKubeadmConfig, sawKubeletConfig, sawAdmins)
	}
}

func TestEmbeddedCRDs(t *testing.T) {
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range crds {
		names[c.Name] = true
		if c.Spec.Group != "nodeops.io" || c.Spec.Scope != "Cluster" {
			t.Errorf("%s: group %s scope %s", c.Name, c.Spec.Group, c.Spec.Scope)
		}
	}
	for _, want := range []string{"nodeoperations.nodeops.io", "nodetasks.nodeops.io", "nodeprofiles.nodeops.io", "clustertargets.nodeops.io"} {
		if !names[want] {
			t.Errorf("CRD %s not embedded (have %v)", want, names)
		}
	}
}

func TestCheckBinariesNamesWhatIsMissing(t *testing.T) {
	bin := t.TempDir()
	for _, n := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubeadm", "agent"} {
		if err := os.WriteFile(filepath.Join(bin, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_, err := checkBinaries(Options{BinDir: bin, ControlPlanes: 1})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(bin, "manager")) || strings.Contains(err.Error(), filepath.Join(bin, "agent")) {
		t.Fatalf("want an error naming %s only, got %v", filepath.Join(bin, "manager"), err)
	}
	_, err = checkBinaries(Options{BinDir: bin, ControlPlanes: 1, NoManager: true})
	if err == nil || !strings.Contains(err.Error(), "kwok stage configs") {
		t.Fatalf("want an error about kwok stage configs, got %v", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	ok := Options{Dir: "d", ControlPlanes: 1, KubernetesVersion: "v1.36.4"}
	tests := []struct {
		name   string
		mutate func(*Options)
		valid  bool
	}{
		{"defaults", func(*Options) {}, true},
		{"no dir", func(o *Options) { o.Dir = "" }, false},
		{"no control plane", func(o *Options) { o.ControlPlanes = 0 }, false},
		{"too many workers", func(o *Options) { o.Workers = 101 }, false},
		{"many sim nodes", func(o *Options) { o.SimNodes = 5000 }, true},
		{"bad version", func(o *Options) { o.KubernetesVersion = "1.36" }, false},
		{"two managers", func(o *Options) { o.Managers = 2 }, true},
		{"negative managers", func(o *Options) { o.Managers = -1 }, false},
		{"pod-bound", func(o *Options) { o.AgentCredentials = CredentialsPodBound }, true},
		{"admin with a proxy", func(o *Options) { o.AgentCredentials, o.ComponentKubeconfig = CredentialsAdmin, "/p" }, true},
		{"pod-bound with a proxy", func(o *Options) { o.AgentCredentials, o.ComponentKubeconfig = CredentialsPodBound, "/p" }, false},
		{"unknown credentials", func(o *Options) { o.AgentCredentials = "root" }, false},
		{"Job mode", func(o *Options) { o.AgentMode, o.AgentCredentials = AgentModeJob, CredentialsPodBound }, true},
		{"Job mode as admin", func(o *Options) { o.AgentMode = AgentModeJob }, false},
		{"Job mode with sim nodes", func(o *Options) { o.AgentMode, o.AgentCredentials, o.SimNodes = AgentModeJob, CredentialsPodBound, 3 }, false},
		{"Job mode without a manager", func(o *Options) {
			o.AgentMode, o.AgentCredentials, o.NoManager = AgentModeJob, CredentialsPodBound, true
		}, false},
		{"unknown agent mode", func(o *Options) { o.AgentMode = "Pod" }, false},
	}
	for _, tt := range tests {
		o := ok
		tt.mutate(&o)
		if err := o.Validate(); (err == nil) != tt.valid {
			t.Errorf("%s: Validate() = %v", tt.name, err)
		}
	}
}

// TestSupervisorStopsProcessGroups starts a child that starts a grandchild and checks stopAll
// leaves neither alive.
func TestSupervisorStopsProcessGroups(t *testing.T) {
	dir := t.TempDir()
	s := newSupervisor(dir, t.Logf)
	if err := s.start("sleeper", "/bin/busybox", "sh", "-c", "/bin/busybox sleep 300 & /bin/busybox sleep 300"); err != nil {
		t.Fatal(err)
	}
	procs, err := ReadProcesses(dir)
	if err != nil || procs["sleeper"] == 0 {
		t.Fatalf("process table %v, %v", procs, err)
	}
	pgid := procs["sleeper"]
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("two sleeps in group %d", pgid), func() error {
		members, _ := ProcessGroupMembers([]int{pgid})
		if len(members) < 2 { // the shell exec()s its last command: two sleeps
			return fmt.Errorf("have %v", members)
		}
		return nil
	})
	s.stopAll(5 * time.Second)
	members, err := ProcessGroupMembers([]int{pgid})
	if err != nil || len(members) != 0 {
		t.Fatalf("after stopAll, group %d still has %v (%v)", pgid, members, err)
	}
	if err := syscall.Kill(pgid, 0); err == nil {
		t.Fatalf("pid %d still exists", pgid)
	}
}

func TestInstallBusybox(t *testing.T) {
	if _, err := os.Stat(BusyboxPath); err != nil {
		t.Fatalf("%s is needed (Debian's busybox-static; hack/install-deps.sh): %v", BusyboxPath, err)
	}
	root := t.TempDir()
	if err := installBusybox(root); err != nil {
		t.Fatal(err)
	}
	// Running the root's own /bin/sh through its absolute applet links proves the layout without chroot.
	out, err := exec.Command(filepath.Join(root, "bin/busybox"), "sh", "-c", "echo hello").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "hello" {
		t.Fatalf("busybox sh: %v %s", err, out)
	}
	if target, err := os.Readlink(filepath.Join(root, "bin/sh")); err != nil || target != "/bin/busybox" {
		t.Fatalf("/bin/sh links to %q (%v)", target, err)
	}
}

// TestSupervisorRestartsAfterStartUp: once started up, a child that dies is started again and the
// process table names its new PID; before that, its death is reported as a start-up failure.
func TestSupervisorRestartsAfterStartUp(t *testing.T) {
	dir := t.TempDir()
	s := newSupervisor(dir, t.Logf)
	defer s.stopAll(5 * time.Second)
	if err := s.start("quitter", "/bin/busybox", "sh", "-c", "exit 3"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.failed:
		if !strings.Contains(err.Error(), "quitter exited during start-up") {
			t.Fatalf("unexpected failure report: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a child dying during start-up was not reported")
	}
	if n := startsIn(t, dir, "quitter"); n != 1 {
		t.Errorf("quitter, which exited at once with no crash, was started %d times, want 1", n)
	}

	if err := s.start("sleeper", "/bin/busybox", "sleep", "300"); err != nil {
		t.Fatal(err)
	}
	s.setKeepAlive()
	procs, _ := ReadProcesses(dir)
	first := procs["sleeper"]
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyEvery(t, 20*time.Second, 100*time.Millisecond, "sleeper restarted", func(context.Context) error {
		procs, _ = ReadProcesses(dir)
		pid := procs["sleeper"]
		if pid == 0 || pid == first {
			return fmt.Errorf("process table %v", procs)
		}
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("restarted sleeper %d is not running: %v", pid, err)
		}
		return nil
	})
}

// TestSupervisorStartsACrashAgainOnceDuringStartUp: a child that panicked during start-up (as kwok
// v0.8.0 did on a race of its own), or exited after running a while, is started again once instead
// of ending the start-up; crashing again ends it, and the report keeps the Go panic's message even
// when a long goroutine dump follows it. (A quick plain exit still ends it at once:
// TestSupervisorRestartsAfterStartUp.)
func TestSupervisorStartsACrashAgainOnceDuringStartUp(t *testing.T) {
	for _, tc := range []struct{ name, firstRun string }{
		{"a panic at once", `echo "panic: runtime error: first start"; exit 2`},
		{"an exit after a while", `/bin/busybox sleep 1; echo "lost the lease"; exit 1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := newSupervisor(dir, t.Logf)
			s.startUpRetryAfter = 500 * time.Millisecond
			defer s.stopAll(5 * time.Second)
			crashOnce := "if [ -e crashed ]; then exec /bin/busybox sleep 300; fi; touch crashed; " + tc.firstRun
			if err := s.start("flaky", "/bin/busybox", "sh", "-c", crashOnce); err != nil {
				t.Fatal(err)
			}
			testutil.EventuallyEvery(t, 20*time.Second, 100*time.Millisecond, "flaky started again", func(context.Context) error {
				select {
				case err := <-s.failed:
					t.Fatalf("the crash ended the start-up: %v", err)
				default:
				}
				if n := startsIn(t, dir, "flaky"); n != 2 {
					return fmt.Errorf("started %d times", n)
				}
				return syscall.Kill(mustReadPID(t, dir, "flaky"), 0)
			})
		})
	}

	dir := t.TempDir()
	s := newSupervisor(dir, t.Logf)
	defer s.stopAll(5 * time.Second)
	// Crashing every time: the second crash ends the start-up, naming the panic.
	dump := strings.Repeat(`echo "goroutine stack line"; `, 30)
	crashAlways := `echo "some start-up chatter"; echo "panic: runtime error: every start"; ` + dump + `exit 2`
	if err := s.start("broken", "/bin/busybox", "sh", "-c", crashAlways); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.failed:
		msg := err.Error()
		if !strings.Contains(msg, "broken exited during start-up") || !strings.Contains(msg, "panic: runtime error: every start") {
			t.Fatalf("the report does not name the child and its panic:\n%s", msg)
		}
		if n := strings.Count(msg, "starting /bin/busybox"); n != 0 {
			t.Errorf("the report holds %d start lines, want only the last run's words:\n%s", n, msg)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a child crashing on each start was not reported")
	}
	if n := startsIn(t, dir, "broken"); n != 2 {
		t.Errorf("broken was started %d times, want 2", n)
	}
}

// startsIn is how many times the supervisor started child name, by the lines it wrote to its log.
func startsIn(t *testing.T, dir, name string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "logs", name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), "=== nodeops-local: starting")
}

func mustReadPID(t *testing.T, dir, name string) int {
	t.Helper()
	procs, err := ReadProcesses(dir)
	if err != nil || procs[name] == 0 {
		t.Fatalf("process table %v has no %s (%v)", procs, name, err)
	}
	return procs[name]
}

// TestSupervisorRunOnce: a once child is not started again when it exits; its exit code is kept
// and the process table forgets it.
func TestSupervisorRunOnce(t *testing.T) {
	dir := t.TempDir()
	s := newSupervisor(dir, t.Logf)
	defer s.stopAll(5 * time.Second)
	s.setKeepAlive()
	cmd, done, err := s.runOnce("once", "/bin/busybox", []string{"sh", "-c", `[ "$GREETING" = hello ] && exit 3`}, []string{"GREETING=hello"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the once child did not exit")
	}
	if code := cmd.ProcessState.ExitCode(); code != 3 {
		t.Errorf("exit code %d, want 3 (the env reached it)", code)
	}
	// Forgotten means exited() took the once path, which schedules no restart.
	testutil.EventuallyEvery(t, 5*time.Second, 50*time.Millisecond, "once out of the process table", func(context.Context) error {
		if procs, _ := ReadProcesses(dir); procs["once"] != 0 {
			return fmt.Errorf("process table %v", procs)
		}
		return nil
	})
}

func TestComponentKubeconfig(t *testing.T) {
	l := clusterLayout{Dir: "/d"}
	if got := l.managerArgs("manager", false)[0]; got != "--kubeconfig=/d/kubeconfig" {
		t.Errorf("by default the manager gets %s", got)
	}
	l.ComponentKubeconfig = "/proxy.kubeconfig"
	for _, args := range [][]string{l.managerArgs("manager", false), l.agentArgs("worker-1"), l.simAgentArgs()} {
		if args[0] != "--kubeconfig=/proxy.kubeconfig" {
			t.Errorf("with a component kubeconfig: %v", args)
		}
	}
}

// TestProfilerAddresses: the bench's profiler addresses reach the manager and the sim agent, and
// nothing asks for a profiler without them.
func TestProfilerAddresses(t *testing.T) {
	l := clusterLayout{Dir: "/d"}
	for _, args := range [][]string{l.managerArgs("manager", false), l.simAgentArgs()} {
		if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--pprof-bind-address") }) {
			t.Errorf("a profiler without an address: %v", args)
		}
	}
	l.ManagerPprof, l.SimAgentPprof = "127.0.0.1:6060", "127.0.0.1:6061"
	if args := l.managerArgs("manager", false); !slices.Contains(args, "--pprof-bind-address=127.0.0.1:6060") {
		t.Errorf("the manager gets %v", args)
	}
	if args := l.simAgentArgs(); !slices.Contains(args, "--pprof-bind-address=127.0.0.1:6061") {
		t.Errorf("the sim agent gets %v", args)
	}
}

// TestPodBoundKubeconfigs: with pod-bound credentials the manager and each local node's agent get
// their own kubeconfig, and the agent its stand-in pod's name so a drain leaves it; the simulated
// nodes' agent keeps the administrator's.
func TestPodBoundKubeconfigs(t *testing.T) {
	l := clusterLayout{Dir: "/d", PodBound: true}
	if got := l.managerArgs("manager", false)[0]; got != "--kubeconfig=/d/credentials/manager.kubeconfig" {
		t.Errorf("the manager gets %s", got)
	}
	args := l.agentArgs("worker-1")
	for _, want := range []string{"--kubeconfig=/d/credentials/agent-worker-1.kubeconfig", "--pod-name=nodeops-agent-worker-1", "--pod-namespace=nodeops-system"} {
		if !slices.Contains(args, want) {
			t.Errorf("worker-1's agent gets %v, without %s", args, want)
		}
	}
	if got := l.simAgentArgs()[0]; got != "--kubeconfig=/d/kubeconfig" {
		t.Errorf("the simulated nodes' agent gets %s", got)
	}
	if args := l.managerArgs("manager", false); slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--agent-mode") }) {
		t.Errorf("without Job mode the manager gets %v", args)
	}
	l.JobMode = true
	if args := l.managerArgs("manager", false); !slices.Contains(args, "--agent-mode=Job") {
		t.Errorf("in Job mode the manager gets %v", args)
	}
}

func TestRefreshTime(t *testing.T) {
	issued := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := refreshTime(issued, issued.Add(24*time.Hour)); !got.Equal(issued.Add(12 * time.Hour)) {
		t.Errorf("a 24h token is minted again at %s, want halfway", got)
	}
}
