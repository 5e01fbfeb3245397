package realnode

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
)

// Logf prints one progress line.
func Logf(format string, args ...any) {
	fmt.Printf("realnode: "+format+"\n", args...)
}

// goBuild is one `go build`/`go install` run whose outputs are kept until its stamp changes.
type goBuild struct {
	name    string   // shown in progress lines
	dir     string   // module directory the go command runs in
	args    []string // go command arguments after "go"
	env     []string // extra environment
	outs    []string // files it must produce
	stampOf []string // the inputs: files hashed into the stamp besides args and env
}

// stamp is a hash of everything that decides the build's outputs.
func (b goBuild) stamp() (string, error) {
	h := sha256.New()
	fmt.Fprintln(h, strings.Join(b.args, " "), strings.Join(b.env, " "))
	for _, f := range b.stampOf {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("stamp of %s: %w", b.name, err)
		}
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// run builds when an output is missing or the stamp changed, printing progress every 30 s.
func (b goBuild) run(ctx context.Context, stampDir string) error {
	want, err := b.stamp()
	if err != nil {
		return err
	}
	stampFile := filepath.Join(stampDir, ".stamp-"+b.name)
	reason := ""
	for _, o := range b.outs {
		if _, err := os.Stat(o); err != nil {
			reason = filepath.Base(o) + " is missing"
			break
		}
	}
	if reason == "" {
		if have, _ := os.ReadFile(stampFile); strings.TrimSpace(string(have)) != want {
			reason = "its inputs changed"
		}
	}
	if reason == "" {
		Logf("%s up to date", b.name)
		return nil
	}
	Logf("building %s because %s (minutes on an empty Go cache; progress follows)", b.name, reason)
	start := time.Now()
	if err := runGo(ctx, b.name, b.dir, b.env, b.args...); err != nil {
		return err
	}
	if err := os.MkdirAll(stampDir, 0o755); err != nil {
		return fmt.Errorf("stamp dir: %w", err)
	}
	if err := os.WriteFile(stampFile, []byte(want+"\n"), 0o644); err != nil {
		return fmt.Errorf("write stamp: %w", err)
	}
	Logf("built %s in %s", b.name, time.Since(start).Round(time.Second))
	return nil
}

// runGo runs the go command with -v output counted as progress; on failure it prints the
// lines that are not package names.
func runGo(ctx context.Context, name, dir string, env []string, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var count atomic.Int64
	var errLines []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			if isPackageLine(line) {
				count.Add(1)
			} else {
				errLines = append(errLines, line)
			}
		}
	}()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start go for %s: %w", name, err)
	}
	start := time.Now()
	tick := time.NewTicker(30 * time.Second)
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait(); pw.Close() }()
	var err error
loop:
	for {
		select {
		case err = <-waitErr:
			break loop
		case <-tick.C:
			Logf("%s: %d packages compiled, %s", name, count.Load(), time.Since(start).Round(time.Second))
		}
	}
	tick.Stop()
	<-done
	if err != nil {
		tail := errLines
		if len(tail) > 40 {
			tail = tail[len(tail)-40:]
		}
		return fmt.Errorf("building %s: %w\n%s", name, err, strings.Join(tail, "\n"))
	}
	return nil
}

// isPackageLine tells the import paths that `go build -v` prints from everything else.
func isPackageLine(line string) bool {
	if line == "" || strings.HasPrefix(line, "go: ") || strings.HasPrefix(line, "#") {
		return false
	}
	for _, r := range line {
		if !(r == '.' || r == '/' || r == '-' || r == '_' || r == '~' || r == '+' ||
			(r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')) {
			return false
		}
	}
	return true
}

// versionLDFlags stamps Kubernetes binaries with their version, or they report v0.0.0.
func versionLDFlags(v string) string {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	const pkg = "k8s.io/component-base/version"
	return fmt.Sprintf("-s -w -X %[1]s.gitVersion=%[2]s -X %[1]s.gitMajor=%[3]s -X %[1]s.gitMinor=%[4]s "+
		"-X %[1]s.gitTreeState=clean -X %[1]s.buildDate=2026-01-01T00:00:00Z", pkg, v, parts[0], parts[1])
}

// KubeBinaries are the Kubernetes binaries of one version the node needs (etcd comes with them).
var KubeBinaries = []string{"kubeadm", "kubelet", "kubectl", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"}

// builds lists everything `Build` makes, in order.
func (l Layout) builds() []goBuild {
	kdir := filepath.Join(l.Repo, "hack/realnode/kubernetes-v1.36")
	rdir := filepath.Join(l.Repo, "hack/realnode")
	var kouts []string
	for _, n := range KubeBinaries {
		kouts = append(kouts, filepath.Join(l.KubeDir(FromVersion), n))
	}
	static := []string{"CGO_ENABLED=0"}
	inTmp := os.TempDir() // `go install pkg@version` needs no module
	return []goBuild{
		{
			name: "kubernetes-" + FromVersion, dir: kdir, env: static, outs: kouts,
			args: []string{"build", "-v", "-trimpath", "-ldflags", versionLDFlags(FromVersion), "-o", l.KubeDir(FromVersion) + "/",
				"./cmd/etcd", "k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kube-controller-manager",
				"k8s.io/kubernetes/cmd/kube-scheduler", "k8s.io/kubernetes/cmd/kubeadm", "k8s.io/kubernetes/cmd/kubelet",
				"k8s.io/kubernetes/cmd/kubectl"},
			stampOf: []string{kdir + "/go.mod", kdir + "/go.sum"},
		},
		{
			name: "containerd-" + ContainerdVersion, dir: inTmp, env: []string{"GOBIN=" + l.RuntimeOut()},
			outs: []string{l.RuntimeOut() + "/containerd", l.RuntimeOut() + "/ctr", l.RuntimeOut() + "/containerd-shim-runc-v2"},
			args: []string{"install", "-v", "-trimpath", "-ldflags", "-s -w -X github.com/containerd/containerd/v2/version.Version=" + ContainerdVersion,
				"github.com/containerd/containerd/v2/cmd/containerd@" + ContainerdVersion,
				"github.com/containerd/containerd/v2/cmd/ctr@" + ContainerdVersion,
				"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@" + ContainerdVersion},
		},
		{
			// runc needs cgo and libseccomp-dev (installed by hack/install-deps.sh realnode).
			name: "runc-" + RuncVersion, dir: inTmp, env: []string{"GOBIN=" + l.RuntimeOut(), "CGO_ENABLED=1"},
			outs: []string{l.RuntimeOut() + "/runc"},
			args: []string{"install", "-v", "-trimpath", "-tags", "seccomp", "-ldflags", "-s -w",
				"github.com/opencontainers/runc@" + RuncVersion},
		},
		{
			name: "cni-plugins-" + CNIVersion, dir: inTmp, env: []string{"GOBIN=" + l.CNIOut(), "CGO_ENABLED=0"},
			outs: []string{l.CNIOut() + "/bridge", l.CNIOut() + "/host-local", l.CNIOut() + "/loopback"},
			args: []string{"install", "-v", "-trimpath", "-ldflags", "-s -w",
				"github.com/containernetworking/plugins/plugins/main/bridge@" + CNIVersion,
				"github.com/containernetworking/plugins/plugins/main/loopback@" + CNIVersion,
				"github.com/containernetworking/plugins/plugins/ipam/host-local@" + CNIVersion},
		},
		{
			name: "realnode-tools", dir: rdir, env: static,
			outs: []string{l.ToolOut() + "/pause", l.ToolOut() + "/systemctl", l.ToolOut() + "/installer-test"},
			args: []string{"build", "-v", "-trimpath", "-ldflags", "-s -w", "-o", l.ToolOut() + "/", "./cmd/pause", "./cmd/systemctl", "./cmd/installer-test"},
			stampOf: append(goFiles(rdir+"/cmd/pause", rdir+"/cmd/systemctl", rdir+"/cmd/installer-test", rdir+"/internal/realnode"),
				rdir+"/go.mod", rdir+"/go.sum"),
		},
	}
}

// goFiles lists the .go files directly in dirs, for stamps.
func goFiles(dirs ...string) []string {
	var out []string
	for _, d := range dirs {
		m, _ := filepath.Glob(filepath.Join(d, "*.go"))
		out = append(out, m...)
	}
	return out
}

// Build makes every binary and image the node needs but nodeops' own: the v1.37.2 set comes from
// hack/tools.sh (`make tools`), the manager and agent images from `make images` (Layout.Images).
func Build(ctx context.Context, l Layout) error {
	for _, n := range KubeBinaries {
		if _, err := os.Stat(filepath.Join(l.KubeDir(ToVersion), n)); err != nil {
			return fmt.Errorf("%s %s is missing from %s: run `make tools` first", n, ToVersion, l.Bin)
		}
	}
	for _, b := range l.builds() {
		if err := b.run(ctx, l.Out()); err != nil {
			return err
		}
	}
	return BuildImages(ctx, l)
}
