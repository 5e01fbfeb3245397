package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nodeops/nodeops/internal/clock"
	"github.com/nodeops/nodeops/internal/objname"
)

// The demo's own manifests, shown on screen and applied as they are.
const (
	simRolloutFile  = "hack/demo/sim-rollout.yaml"
	maintenanceFile = "hack/demo/worker-maintenance.yaml"
)

const (
	upgradeVersion = "v1.37.2"
	// A node root is a directory: no container runtime, /proc or kernel config for kubeadm's preflight.
	localPreflightIgnores = "SystemVerification,ContainerRuntimeVersion,ImagePull"
	simPoolLabel          = "demo.nodeops.io/pool"
	backupLock            = "var/lib/app/backup.lock"
)

func (d *demo) steps() []step {
	return []step{
		{
			short: "renew certificates (real kubeadm)",
			title: "Renew the control planes' certificates, with the real kubeadm",
			why: "kubeadm's certificates last a year. nodeops renews them one control plane at a time with\n" +
				"'kubeadm certs renew' (here the real kubeadm, in each control plane's host root), then restarts\n" +
				"the static pods so they load the new certificates. First the plan, then the run, followed live.",
			run: d.renewCerts,
		},
		{
			short: "upgrade to " + upgradeVersion + " in DryRun",
			title: "Upgrade to " + upgradeVersion + " in DryRun",
			why: "An upgrade is planned as kubeadm does it: the first control plane runs 'kubeadm upgrade apply',\n" +
				"the others 'kubeadm upgrade node', then the workers are drained and upgraded. DryRun runs that\n" +
				"whole plan with every side effect in its dry-run form (kubeadm --dry-run, server-side dry-run\n" +
				"evictions, no file written), so you see it work before anything changes.",
			run: d.upgradeDryRun,
		},
		{
			short: "WebAssembly shims on annotated workers",
			title: "WebAssembly shims on the workers annotated kwasm.sh/kwasm-node=true",
			why: "A NodeProfile says what a set of nodes must have. The sample config/samples/wasm-shims.yaml does\n" +
				"what the KWasm operator does: annotate a node and it gets three containerd shims and their\n" +
				"runtime handlers; only then is it labelled, and RuntimeClasses schedule onto that label.",
			run: d.wasmShims,
		},
		{
			short: fmt.Sprintf("custom operation, %d sim nodes at 20%%", simNodes),
			title: fmt.Sprintf("A custom operation over the %d simulated nodes, 20%% at a time", simNodes),
			why: "Any ordered workflow of host commands runs across chosen nodes: a canary node first, then the\n" +
				"rest, never more than maxUnavailable (here 20%) busy or failed at once. A health gate holds the\n" +
				"rest until a person approves the canary.",
			run: d.simRollout,
		},
		{
			short: "a failure, then skip",
			title: "A failure, and a skip",
			why: "When a command fails, its node's task stops, its group starts no new node and the operation is\n" +
				"Blocked until a person decides: retry, skip or abort. Nothing retries on its own.",
			run: d.failureAndSkip,
		},
		{
			short: "ClusterTarget: one edit upgrades to " + upgradeVersion,
			title: "The ClusterTarget: what the cluster is, and one edit that upgrades it to " + upgradeVersion,
			why: "Instead of writing operations, say what the cluster should be. The manager created the one\n" +
				"ClusterTarget, 'cluster', from what it observed when it started; setting its version makes it\n" +
				"generate the upgrade (one minor version per operation), run it, and report it in its status.",
			run: d.clusterTarget,
		},
	}
}

// showNodes prints the nodes, the simulated ones shortened.
func (d *demo) showNodes(ctx context.Context) error {
	out, err := d.exec(ctx, execOpts{capture: true, show: "kubectl get nodes   # sim-4 to sim-50 left out below"}, "kubectl", "get", "nodes")
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	sims := 0
	for _, l := range lines {
		name, _, _ := strings.Cut(l, " ")
		n, isSim := strings.CutPrefix(name, "sim-")
		if !isSim {
			d.sayf("%s", l)
			continue
		}
		sims++
		if i, err := strconv.Atoi(n); err == nil && i <= 3 {
			d.sayf("%s", l)
		}
	}
	d.sayf("... %d sim-* nodes in all", sims)
	if sims != simNodes {
		return fmt.Errorf("%d sim nodes, expected %d", sims, simNodes)
	}
	return nil
}

func (d *demo) nodeRoot(node string) string { return filepath.Join(d.clusterDir, "nodes", node) }

func controlPlaneNames() []string {
	var names []string
	for i := 1; i <= controlPlanes; i++ {
		names = append(names, fmt.Sprintf("cp-%d", i))
	}
	return names
}

// Step 1.

func (d *demo) renewCerts(ctx context.Context) error {
	const certPath = "etc/kubernetes/pki/apiserver.crt"
	before := map[string]certInfo{}
	d.sayf("\nBefore: each control plane's API server certificate, read from its host root (%s):", filepath.Join(d.clusterDir, "nodes/cp-N", certPath))
	for _, cp := range controlPlaneNames() {
		c, err := readCert(filepath.Join(d.nodeRoot(cp), certPath))
		if err != nil {
			return err
		}
		before[cp] = c
		d.sayf("  %s  %s", cp, c)
	}
	if err := d.sh(ctx, "kubectl", "nodeops", "plan", "renew-certs"); err != nil {
		return err
	}
	if err := d.sh(ctx, "kubectl", "nodeops", "renew-certs", "--name", "demo-renew-certs", "--watch"); err != nil {
		return err
	}
	d.sayf("\nAfter: new certificates, notBefore moved to the renewal (kubeadm backdates it by 5 minutes):")
	for _, cp := range controlPlaneNames() {
		c, err := readCert(filepath.Join(d.nodeRoot(cp), certPath))
		if err != nil {
			return err
		}
		d.sayf("  %s  %s", cp, c)
		if c.serial == before[cp].serial || !c.notBefore.After(before[cp].notBefore) {
			return fmt.Errorf("%s's %s was not renewed: before %s, after %s", cp, certPath, before[cp], c)
		}
	}
	return nil
}

// Step 2.

func (d *demo) upgradeDryRun(ctx context.Context) error {
	data, err := os.ReadFile(filepath.Join(d.clusterDir, "binary-source-url"))
	if err != nil {
		return fmt.Errorf("reading nodeops-local's binary source: %w", err)
	}
	src := strings.TrimSpace(string(data))
	version, err := d.clusterVersion(ctx)
	if err != nil {
		return err
	}
	d.sayf("\nThe cluster runs %s (kubeadm-config). Two flags are for this local cluster only:", version)
	d.sayf("  --binary-source %s --insecure-http  nodeops-local serves bin/{kubeadm,kubelet,kubectl} there, laid out as", src)
	d.sayf("      dl.k8s.io, over plain http on loopback, which nodeops refuses unless asked for (the plan marks it INSECURE HTTP)")
	d.sayf("  --ignore-preflight-errors %s  a node root is a directory: no container runtime, /proc or kernel config", localPreflightIgnores)
	flags := []string{"--binary-source", src, "--insecure-http", "--ignore-preflight-errors", localPreflightIgnores}
	if err := d.sh(ctx, append([]string{"kubectl", "nodeops", "plan", "upgrade", upgradeVersion}, flags...)...); err != nil {
		return err
	}
	const op = "demo-upgrade"
	args := append([]string{"kubectl", "nodeops", "upgrade", upgradeVersion, "--dry-run", "--name", op}, flags...)
	if err := d.sh(ctx, append(args, "--watch")...); err != nil {
		return err
	}
	d.sayf("\nWhat ran on the first control plane, and the end of kubeadm's own dry-run output:")
	if err := d.sh(ctx, "kubectl", "nodeops", "describe", objname.TaskName(op, "control-plane-first", "cp-1")); err != nil {
		return err
	}
	logArgs := []string{"kubectl", "nodeops", "logs", op, "--node", "cp-1", "--command", "kubeadmUpgradeApply"}
	out, err := d.exec(ctx, execOpts{capture: true, show: shellJoin(logArgs) + " | tail -n 3"}, logArgs...)
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	d.sayf("%s", strings.Join(lines[max(0, len(lines)-3):], "\n"))
	if !strings.Contains(out, "dryrun") && !strings.Contains(out, "dry-run") && !strings.Contains(out, "dry run") {
		return fmt.Errorf("kubeadm upgrade apply on cp-1 did not report a dry run:\n%s", out)
	}
	after, err := d.clusterVersion(ctx)
	if err != nil {
		return err
	}
	if err := d.sh(ctx, "kubectl", "get", "nodes", "cp-1", "worker-1"); err != nil {
		return err
	}
	if after != version {
		return fmt.Errorf("a DryRun upgrade changed kubeadm-config's kubernetesVersion from %s to %s", version, after)
	}
	d.sayf("\nDryRun changed nothing: kubeadm-config still says %s and the nodes still report it.", after)
	return nil
}

// clusterVersion is kubernetesVersion in kube-system/kubeadm-config.
func (d *demo) clusterVersion(ctx context.Context) (string, error) {
	out, err := d.output(ctx, "kubectl", "-n", "kube-system", "get", "configmap", "kubeadm-config", "-o", "jsonpath={.data.ClusterConfiguration}")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "kubernetesVersion:"); ok {
			return strings.Trim(strings.TrimSpace(v), `"`), nil
		}
	}
	return "", fmt.Errorf("no kubernetesVersion in kubeadm-config:\n%s", out)
}

// Step 3.

func (d *demo) wasmShims(ctx context.Context) error {
	shimDir := filepath.Join(d.work, "shims")
	digests, err := writeShims(shimDir, time.Now())
	if err != nil {
		return err
	}
	baseURL, stop, err := serveShims(shimDir)
	if err != nil {
		return err
	}
	defer stop()
	d.sayf("\nThis machine has no network, so the demo made three small PLACEHOLDER shim files just now (shell")
	d.sayf("scripts that only say they are placeholders), took their sha256, and serves them at %s:", baseURL)
	for _, s := range sampleShims() {
		d.sayf("  %s  %s", digests[s.name], s.name)
	}
	sample, err := os.ReadFile(sampleFile)
	if err != nil {
		return fmt.Errorf("reading the sample: %w", err)
	}
	manifest, err := substituteSample(string(sample), baseURL, digests)
	if err != nil {
		return err
	}
	manifestFile := filepath.Join(d.work, "wasm-shims.yaml")
	if err := os.WriteFile(manifestFile, []byte(manifest), 0o644); err != nil {
		return fmt.Errorf("writing the manifest: %w", err)
	}
	d.sayf("The sample with %s replaced by that URL and its placeholder sha256 values by these: %s", sampleBaseURL, manifestFile)
	if err := d.sh(ctx, "kubectl", "apply", "-f", manifestFile); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "the profile's RuntimeClasses", func() (bool, error) {
		_, err := d.output(ctx, "kubectl", "get", "runtimeclass", "wasmedge", "wasmtime", "spin")
		return err == nil, nil
	}); err != nil {
		return err
	}
	if err := d.sh(ctx, "kubectl", "get", "runtimeclasses", "-o", "custom-columns=NAME:.metadata.name,HANDLER:.handler,NODE-SELECTOR:.scheduling.nodeSelector"); err != nil {
		return err
	}
	annotate := []string{"kubectl", "annotate", "node", "worker-1", "worker-2", "kwasm.sh/kwasm-node=true"}
	if err := d.followProfile(ctx, "wasm-shims", 2, annotate); err != nil {
		return err
	}
	if err := d.sh(ctx, "kubectl", "nodeops", "profile", "status", "wasm-shims"); err != nil {
		return err
	}
	if err := d.sh(ctx, "kubectl", "get", "nodes", "worker-1", "worker-2", "worker-3", "-L", "nodeops.io/profile.wasm-shims"); err != nil {
		return err
	}
	return d.checkShims(digests)
}

// followProfile shows the profile's tasks live (kubectl get --watch, in the background) while
// trigger runs, until want nodes are provisioned.
func (d *demo) followProfile(ctx context.Context, profile string, want int, trigger []string) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watchArgs := []string{"kubectl", "get", "nodetasks", "-l", "nodeops.io/profile=" + profile, "--watch"}
	d.sayf("\n$ %s", d.paint(bold, shellJoin(watchArgs)+" &   # stopped once both are provisioned"))
	started := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		// Ended by cancel; its exit status says nothing.
		_, _ = d.exec(wctx, execOpts{quiet: true, started: started}, watchArgs...)
	}()
	defer func() { cancel(); <-watched }()
	select {
	case <-started:
	case <-watched:
	}
	if err := d.sh(ctx, trigger...); err != nil {
		return err
	}
	return d.waitFor(ctx, fmt.Sprintf("%d provisioned node(s) of %s", want, profile), func() (bool, error) {
		out, err := d.output(ctx, "kubectl", "get", "nodeprofile", profile, "-o", "jsonpath={.status.nodes.provisioned} {.status.nodes.failed}")
		if err != nil {
			return false, err
		}
		var provisioned, failed int
		if _, err := fmt.Sscan(out, &provisioned, &failed); err != nil {
			return false, nil // no status yet
		}
		if failed > 0 {
			msg, _ := d.output(ctx, "kubectl", "get", "nodeprofile", profile, "-o", "jsonpath={.status.conditions[?(@.type==\"Degraded\")].message}")
			return false, fmt.Errorf("profile %s: %d node(s) failed: %s", profile, failed, msg)
		}
		if provisioned < want {
			return false, nil
		}
		// Let the watch print the last task updates before it is stopped.
		time.Sleep(time.Second)
		return true, nil
	})
}

// waitFor polls cond until it is true, returns an error, or ctx ends.
func (d *demo) waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	for {
		done, err := cond()
		if err != nil || done {
			return err
		}
		if clock.Sleep(ctx, 500*time.Millisecond) != nil {
			return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		}
	}
}

// checkShims shows what the install left on worker-1 and checks both annotated workers, and worker-3 untouched.
func (d *demo) checkShims(digests map[string]string) error {
	d.sayf("\nOn the nodes (their host roots under %s):", filepath.Join(d.clusterDir, "nodes"))
	for _, node := range []string{"worker-1", "worker-2"} {
		for _, s := range sampleShims() {
			p := filepath.Join(d.nodeRoot(node), "usr/local/bin", s.name)
			got, err := fileSHA256(p)
			if err != nil {
				return err
			}
			if got != digests[s.name] {
				return fmt.Errorf("%s on %s has sha256 %s, want %s", s.name, node, got, digests[s.name])
			}
		}
		d.sayf("  %s: /usr/local/bin/containerd-shim-{wasmedge-v1,wasmtime-v1,spin-v2}, sha256 as served", node)
	}
	config, err := os.ReadFile(filepath.Join(d.nodeRoot("worker-1"), "etc/containerd/config.toml"))
	if err != nil {
		return fmt.Errorf("reading worker-1's containerd config: %w", err)
	}
	var handlers []string
	for _, l := range strings.Split(string(config), "\n") {
		if strings.Contains(l, "runtime_type") && (strings.Contains(l, "wasm") || strings.Contains(l, "spin")) {
			handlers = append(handlers, strings.TrimSpace(l))
		}
	}
	if len(handlers) != 3 {
		return fmt.Errorf("worker-1's containerd config has %d wasm runtime handlers, want 3:\n%s", len(handlers), config)
	}
	d.sayf("  worker-1: /etc/containerd/config.toml: %s", strings.Join(handlers, "; "))
	services, err := os.ReadFile(filepath.Join(d.nodeRoot("worker-1"), "var/lib/nodeops-local/services.log"))
	if err != nil {
		return fmt.Errorf("reading worker-1's service table: %w", err)
	}
	if !strings.Contains(string(services), "restart containerd") {
		return fmt.Errorf("no containerd restart recorded on worker-1:\n%s", services)
	}
	d.sayf("  worker-1: containerd restarted once for all three (the local service table: %s)", "/var/lib/nodeops-local/services.log")
	for _, s := range sampleShims() {
		if fileExists(filepath.Join(d.nodeRoot("worker-3"), "usr/local/bin", s.name)) {
			return fmt.Errorf("worker-3, not annotated, got %s", s.name)
		}
	}
	d.sayf("  worker-3: not annotated, untouched")
	return nil
}

// Step 4.

func (d *demo) simRollout(ctx context.Context) error {
	var names []string
	for i := 1; i <= simNodes; i++ {
		names = append(names, fmt.Sprintf("sim-%d", i))
	}
	label := simPoolLabel + "=sim"
	out, err := d.exec(ctx, execOpts{capture: true, show: fmt.Sprintf("kubectl label nodes sim-{1..%d} %s", simNodes, label)},
		append(append([]string{"kubectl", "label", "nodes"}, names...), label)...)
	if err != nil {
		return err
	}
	if n := strings.Count(out, " labeled"); n != simNodes {
		return fmt.Errorf("%d nodes labelled, want %d:\n%s", n, simNodes, out)
	}
	d.sayf("node/sim-1 labeled ... node/sim-%d labeled", simNodes)
	if err := d.showFile(ctx, simRolloutFile); err != nil {
		return err
	}
	if err := d.sh(ctx, "kubectl", "nodeops", "plan", "-f", simRolloutFile); err != nil {
		return err
	}
	if err := d.sh(ctx, "kubectl", "create", "-f", simRolloutFile); err != nil {
		return err
	}
	const op = "demo-sim-rollout"
	d.sayf("\nThe canary runs; the fleet waits for its gate change-board (an approval) ...")
	err = d.waitFor(ctx, "the fleet waiting for gate change-board", func() (bool, error) {
		reason, err := d.output(ctx, "kubectl", "get", "nodeoperation", op, "-o", `jsonpath={.status.conditions[?(@.type=="Progressing")].reason}`)
		return reason == "WaitingForGate", err
	})
	if err != nil {
		return err
	}
	if err := d.sh(ctx, "kubectl", "nodeops", "describe", op); err != nil {
		return err
	}
	d.sayf("\nThe canary looks fine: approve the gate, and the fleet starts.")
	if err := d.sh(ctx, "kubectl", "nodeops", "approve", op, "--gate", "change-board"); err != nil {
		return err
	}
	return d.sh(ctx, "kubectl", "nodeops", "watch", op)
}

// showFile prints a file as `cat` would, comments included: they say why it is there.
func (d *demo) showFile(ctx context.Context, path string) error {
	return d.sh(ctx, "cat", path)
}

// Step 5.

func (d *demo) failureAndSkip(ctx context.Context) error {
	const op = "demo-maintenance"
	lock := filepath.Join(d.nodeRoot("worker-2"), backupLock)
	if err := os.MkdirAll(filepath.Dir(lock), 0o755); err != nil {
		return fmt.Errorf("making the lock's directory: %w", err)
	}
	if err := os.WriteFile(lock, []byte("backup job 4711, started 03:00 UTC\n"), 0o644); err != nil {
		return fmt.Errorf("planting the lock: %w", err)
	}
	d.sayf("\nThe demo planted /%s in worker-2's host root, as a running backup would leave it,", backupLock)
	d.sayf("so the workflow's first command fails there and only there (%s).", lock)
	if err := d.showFile(ctx, maintenanceFile); err != nil {
		return err
	}
	if err := d.sh(ctx, "kubectl", "create", "-f", maintenanceFile); err != nil {
		return err
	}
	if _, err := d.exec(ctx, execOpts{wantExit: 3}, "kubectl", "nodeops", "watch", op); err != nil {
		return err
	}
	d.sayf("\nExit code 3: Blocked. worker-1 is done, worker-2 failed, worker-3 has not started. Why:")
	if err := d.sh(ctx, "kubectl", "nodeops", "describe", op); err != nil {
		return err
	}
	d.sayf("\nThe backup does not matter for this rotation: skip the failed check on worker-2 and go on.")
	if err := d.sh(ctx, "kubectl", "nodeops", "skip", op); err != nil {
		return err
	}
	if err := d.sh(ctx, "kubectl", "nodeops", "watch", op); err != nil {
		return err
	}
	task := objname.TaskName(op, "workers", "worker-2")
	if err := d.sh(ctx, "kubectl", "nodeops", "describe", task); err != nil {
		return err
	}
	phase, err := d.output(ctx, "kubectl", "get", "nodetask", task, "-o", "jsonpath={.status.commands[0].phase}")
	if err != nil {
		return err
	}
	if phase != "Skipped" {
		return fmt.Errorf("check-backup on worker-2 is %q, want Skipped", phase)
	}
	for _, node := range []string{"worker-1", "worker-2", "worker-3"} {
		if !fileExists(filepath.Join(d.nodeRoot(node), "var/log/app/rotated")) {
			return fmt.Errorf("rotate-logs left no /var/log/app/rotated on %s", node)
		}
	}
	d.sayf("\ncheck-backup Skipped on worker-2, the rest of its commands ran, then worker-3's: /var/log/app/rotated")
	d.sayf("is on all three workers.")
	return nil
}

// Helpers.

func fileSHA256(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// Step 6.

func (d *demo) clusterTarget(ctx context.Context) error {
	data, err := os.ReadFile(filepath.Join(d.clusterDir, "binary-source-url"))
	if err != nil {
		return fmt.Errorf("reading nodeops-local's binary source: %w", err)
	}
	src := strings.TrimSpace(string(data))
	if err := d.sh(ctx, "kubectl", "get", "clustertarget"); err != nil {
		return err
	}
	if err := d.sh(ctx, "kubectl", "nodeops", "target"); err != nil {
		return err
	}
	d.sayf("\nThe generated upgrade needs what any upgrade on this local cluster needs: the binary source and the")
	d.sayf("preflight checks a directory root cannot pass. Then one edit: the version.")
	var ignores []string
	for _, e := range strings.Split(localPreflightIgnores, ",") {
		ignores = append(ignores, strconv.Quote(e))
	}
	patch := fmt.Sprintf(`{"spec":{"upgrade":{"binarySource":{"baseURL":%q,"insecureHTTP":true},"ignorePreflightErrors":[%s]}}}`, src, strings.Join(ignores, ","))
	if err := d.sh(ctx, "kubectl", "patch", "clustertarget", "cluster", "--type", "merge", "-p", patch); err != nil {
		return err
	}
	if err := d.sh(ctx, "kubectl", "nodeops", "target", "set", "--version", upgradeVersion); err != nil {
		return err
	}
	op := "cluster-upgrade-" + upgradeVersion + "-1"
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := d.waitFor(wctx, "the ClusterTarget's upgrade "+op, func() (bool, error) {
		_, err := d.output(wctx, "kubectl", "get", "nodeoperation", op, "-o", "name")
		return err == nil, nil
	}); err != nil {
		return err
	}
	if err := d.sh(ctx, "kubectl", "nodeops", "watch", op); err != nil {
		return err
	}
	version, err := d.clusterVersion(ctx)
	if err != nil {
		return err
	}
	if version != upgradeVersion {
		return fmt.Errorf("after %s kubeadm-config says %s, not %s", op, version, upgradeVersion)
	}
	d.sayf("\nkubeadm-config and the control planes' static pods are at %s. The ClusterTarget says UpToDate once", upgradeVersion)
	d.sayf("every kubelet reports it (here nodeops-local plays the restarted kubelets, simulated nodes included):")
	if err := d.sh(ctx, "kubectl", "wait", "clustertarget/cluster", "--for=condition=UpToDate", "--timeout=2m"); err != nil {
		return err
	}
	return d.sh(ctx, "kubectl", "nodeops", "target")
}
