package commands_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/agent/commands"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
	"github.com/nodeops/nodeops/internal/plan"
	"github.com/nodeops/nodeops/internal/testutil/debroot"
)

// One cached Debian root serves the apt and the dnf tests: apt is in every root, dnf and rpm are added.
var rootPackages = debroot.Shared

// kubePackages are the packages an upgrade installs; the repositories hold stand-ins of them.
var kubePackages = []string{"kubeadm", "kubelet", "kubectl"}

// standIn is the program a package installs as /usr/bin/NAME: it prints its version, as kubeadm version -o short does.
func standIn(name, version string) string {
	return fmt.Sprintf("#!/bin/sh\necho %s v%s\n", name, version)
}

func mustRun(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func need(t *testing.T, programs ...string) {
	t.Helper()
	for _, p := range programs {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s is not installed: run hack/install-deps.sh", p)
		}
	}
}

// serve serves dir on a loopback port, as a node's package repository.
func serve(t *testing.T, dir string) string {
	t.Helper()
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	t.Cleanup(srv.Close)
	return srv.URL + "/"
}

// inRoot runs a program chrooted into root, as an administrator would on the node.
func inRoot(t *testing.T, root string, argv ...string) string {
	t.Helper()
	var out bytes.Buffer
	err := (&host.ChrootRunner{Root: root}).Run(context.Background(), host.Cmd{Path: argv[0], Args: argv[1:],
		Env: []string{"PATH=" + host.DefaultPath, "HOME=/root", "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C"}, Output: &out})
	if err != nil {
		t.Fatalf("%s in the root: %v\n%s", strings.Join(argv, " "), err, out.String())
	}
	return out.String()
}

// upgradeInstalls is what the built-in upgrade installs on a worker with this package source: its
// installPackages commands, in order, from the planner itself.
func upgradeInstalls(t *testing.T, source, version string, repo *v1alpha1.PackageRepository) []v1alpha1.Command {
	t.Helper()
	groups, err := plan.Expand(&v1alpha1.NodeOperationSpec{Upgrade: &v1alpha1.UpgradeOperation{
		KubernetesVersion: version, PackageSource: source, PackageRepository: repo}})
	if err != nil {
		t.Fatal(err)
	}
	var out []v1alpha1.Command
	for _, g := range groups {
		if g.Name != plan.GroupWorkers {
			continue
		}
		for _, c := range g.Commands {
			if c.InstallBinaries != nil {
				t.Errorf("packageSource %s still swaps binaries: %s", source, c.DisplayName())
			}
			if c.InstallPackages != nil {
				out = append(out, *c.DeepCopy())
			}
		}
	}
	if len(out) != 2 {
		t.Fatalf("the workers' group of an upgrade with packageSource %s installs %d times, want kubeadm then kubelet and kubectl", source, len(out))
	}
	return out
}

func runAll(t *testing.T, env *commands.Env, cmds []v1alpha1.Command) {
	t.Helper()
	for i := range cmds {
		if _, err := commands.Run(context.Background(), env, &cmds[i]); err != nil {
			t.Fatalf("%s: %v\n%s", cmds[i].DisplayName(), err, env.Out)
		}
	}
}

func realEnv(root string, dryRun bool) (*commands.Env, *bytes.Buffer) {
	out := &bytes.Buffer{}
	return &commands.Env{NodeName: "node-a", Operation: "op", DryRun: dryRun, Host: host.New(root, nil), Out: out}, out
}

// buildAptRepo makes .debs of the stand-ins at each version with dpkg-deb and indexes them with
// apt-ftparchive, as a flat repository ("deb URL /").
func buildAptRepo(t *testing.T, versions ...string) string {
	t.Helper()
	need(t, "dpkg-deb", "apt-ftparchive")
	start := time.Now()
	repo, work := t.TempDir(), t.TempDir()
	arch := strings.TrimSpace(mustRun(t, work, "dpkg", "--print-architecture"))
	for _, v := range versions {
		for _, name := range kubePackages {
			dir := filepath.Join(work, name+"_"+v)
			hosttest.WriteFile(t, dir, "/DEBIAN/control", fmt.Sprintf("Package: %s\nVersion: %s\nArchitecture: %s\nMaintainer: nodeops tests <nodeops@localhost>\nDescription: %s stand-in for nodeops' tests\n", name, v, arch, name), 0o644)
			hosttest.WriteFile(t, dir, "/usr/bin/"+name, standIn(name, v), 0o755)
			mustRun(t, work, "dpkg-deb", "--root-owner-group", "-Zgzip", "--build", dir, filepath.Join(repo, fmt.Sprintf("%s_%s_%s.deb", name, v, arch)))
		}
	}
	hosttest.WriteFile(t, repo, "/Packages", mustRun(t, repo, "apt-ftparchive", "packages", "."), 0o644)
	hosttest.WriteFile(t, repo, "/Release", mustRun(t, repo, "apt-ftparchive", "release", "."), 0o644)
	t.Logf("apt repository of %d .debs built in %s", len(versions)*len(kubePackages), time.Since(start).Round(time.Millisecond))
	return repo
}

// TestInstallPackagesApt: the built-in upgrade's installs with packageSource apt, run by the agent's
// command runner, install the packages with the real apt inside a real Debian root, from a local
// repository they add, and hold them: apt's own upgrade leaves them alone, the next upgrade moves them.
func TestInstallPackagesApt(t *testing.T) {
	start := time.Now()
	defer func() { t.Logf("TestInstallPackagesApt took %s", time.Since(start).Round(time.Millisecond)) }()
	repoDir := buildAptRepo(t, "1.36.4-1.1", "1.37.2-1.1")
	root := debroot.Root(t, rootPackages...)
	// The root's own sources name Debian's mirror; this test reaches only its loopback repository.
	if err := os.Remove(filepath.Join(root, "etc/apt/sources.list")); err != nil {
		t.Fatal(err)
	}
	repo := &v1alpha1.PackageRepository{Name: "kubernetes", URL: serve(t, repoDir), Trusted: true}

	env, out := realEnv(root, false)
	runAll(t, env, upgradeInstalls(t, "apt", "v1.36.4", repo))
	for _, want := range []string{"Setting up kubeadm (1.36.4-1.1)", "kubelet set on hold."} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the task's output lacks apt's own %q:\n%s", want, out)
		}
	}
	if got := hosttest.ReadFile(t, root, "/etc/apt/sources.list.d/kubernetes.list"); !strings.Contains(got, "deb [trusted=yes] "+repo.URL+" /") {
		t.Errorf("sources.list.d/kubernetes.list is %q", got)
	}
	if got := strings.Fields(inRoot(t, root, "/usr/bin/apt-mark", "showhold")); strings.Join(got, " ") != "kubeadm kubectl kubelet" {
		t.Errorf("apt-mark showhold lists %q, want kubeadm kubectl kubelet", got)
	}
	// Held: apt's own upgrade keeps them back although the repository has 1.37.2.
	inRoot(t, root, "/usr/bin/apt-get", "update", "-q")
	inRoot(t, root, "/usr/bin/apt-get", "upgrade", "-y", "-q")
	if got := inRoot(t, root, "/usr/bin/kubeadm"); got != "kubeadm v1.36.4-1.1\n" {
		t.Errorf("after apt-get upgrade, kubeadm says %q: the hold did not hold", got)
	}

	out.Reset()
	runAll(t, env, upgradeInstalls(t, "apt", "v1.37.2", repo))
	for _, name := range kubePackages {
		if got := inRoot(t, root, "/usr/bin/"+name); got != name+" v1.37.2-1.1\n" {
			t.Errorf("/usr/bin/%s says %q after the upgrade to v1.37.2", name, got)
		}
	}
	versions := inRoot(t, root, "/usr/bin/dpkg-query", "-W", "-f", "${Package} ${Version}\n", "kubeadm", "kubelet", "kubectl")
	if versions != "kubeadm 1.37.2-1.1\nkubectl 1.37.2-1.1\nkubelet 1.37.2-1.1\n" {
		t.Errorf("dpkg-query: %q", versions)
	}
	if got := strings.Fields(inRoot(t, root, "/usr/bin/apt-mark", "showhold")); strings.Join(got, " ") != "kubeadm kubectl kubelet" {
		t.Errorf("after the upgrade apt-mark showhold lists %q", got)
	}
}

// TestInstallPackagesDryRunChangesNothing: a DryRun prints the exact apt commands and the source it
// would add, and leaves the root as it was: no source file, no package, no hold.
func TestInstallPackagesDryRunChangesNothing(t *testing.T) {
	start := time.Now()
	defer func() {
		t.Logf("TestInstallPackagesDryRunChangesNothing took %s", time.Since(start).Round(time.Millisecond))
	}()
	root := debroot.Root(t, rootPackages...)
	before := treeDigest(t, root)
	env, out := realEnv(root, true)
	repo := &v1alpha1.PackageRepository{Name: "kubernetes", URL: "http://127.0.0.1:9/", Trusted: true}
	cmds := upgradeInstalls(t, "apt", "v1.37.2", repo)
	var messages []string
	for i := range cmds {
		res, err := commands.Run(context.Background(), env, &cmds[i])
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		messages = append(messages, res.Message)
	}
	for _, want := range []string{
		"deb [trusted=yes] http://127.0.0.1:9/ /",
		"dry run: would write /etc/apt/sources.list.d/kubernetes.list",
		"$ /usr/bin/apt-get update -q -o Dir::Etc::sourcelist=sources.list.d/kubernetes.list -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0",
		"$ /usr/bin/apt-get install -y -q --allow-downgrades --allow-change-held-packages -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold kubelet=1.37.2-* kubectl=1.37.2-*",
		"$ /usr/bin/apt-mark hold kubelet kubectl",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the dry run's output lacks %q:\n%s", want, out)
		}
	}
	if !strings.HasPrefix(messages[0], "dry run: ") {
		t.Errorf("message %q is not marked as a dry run", messages[0])
	}
	if after := treeDigest(t, root); after != before {
		t.Errorf("the dry run changed the root")
	}
}

// treeDigest sums every path, mode, size and file content under root.
func treeDigest(t *testing.T, root string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %v %d\n", strings.TrimPrefix(p, root), fi.Mode(), fi.Size())
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// buildRPMRepo builds rpms of the stand-ins (no dependencies) with rpmbuild and indexes them with createrepo_c.
func buildRPMRepo(t *testing.T, versions ...string) string {
	t.Helper()
	need(t, "rpmbuild", "createrepo_c")
	start := time.Now()
	repo, top := t.TempDir(), t.TempDir()
	for _, v := range versions {
		version, release, _ := strings.Cut(v, "-")
		for _, name := range kubePackages {
			spec := filepath.Join(top, name+"-"+v+".spec")
			hosttest.WriteFile(t, top, "/"+filepath.Base(spec), fmt.Sprintf(`Name: %[1]s
Version: %[2]s
Release: %[3]s
Summary: %[1]s stand-in for nodeops' tests
License: Apache-2.0
BuildArch: noarch
AutoReqProv: no
%%description
%[1]s stand-in for nodeops' tests.
%%install
mkdir -p %%{buildroot}/usr/bin
printf '#!/bin/sh\necho %[1]s v%[4]s\n' > %%{buildroot}/usr/bin/%[1]s
chmod 0755 %%{buildroot}/usr/bin/%[1]s
%%files
/usr/bin/%[1]s
`, name, version, release, v), 0o644)
			mustRun(t, top, "rpmbuild", "--quiet", "-bb", "--define", "_topdir "+top, "--define", "_rpmdir "+repo, spec)
		}
	}
	mustRun(t, repo, "createrepo_c", "--quiet", ".")
	t.Logf("rpm repository of %d rpms built in %s", len(versions)*len(kubePackages), time.Since(start).Round(time.Millisecond))
	return repo
}

// TestInstallPackagesDnf: the same with the real dnf inside a root that has it, from a local rpm-md
// repository the command adds; the hold is dnf's exclude list, which dnf's own upgrade obeys.
func TestInstallPackagesDnf(t *testing.T) {
	start := time.Now()
	defer func() { t.Logf("TestInstallPackagesDnf took %s", time.Since(start).Round(time.Millisecond)) }()
	repoDir := buildRPMRepo(t, "1.36.4-1.1", "1.37.2-1.1")
	root := debroot.Root(t, rootPackages...)
	repo := &v1alpha1.PackageRepository{Name: "kubernetes", URL: serve(t, repoDir), Trusted: true}
	rpmQuery := func() string {
		return inRoot(t, root, "/usr/bin/rpm", "-q", "--qf", "%{NAME} %{VERSION}-%{RELEASE}\n", "kubeadm", "kubelet", "kubectl")
	}

	env, out := realEnv(root, false)
	runAll(t, env, upgradeInstalls(t, "dnf", "v1.36.4", repo))
	if got := rpmQuery(); got != "kubeadm 1.36.4-1.1\nkubelet 1.36.4-1.1\nkubectl 1.36.4-1.1\n" {
		t.Errorf("rpm -q: %q\n%s", got, out)
	}
	if !strings.Contains(out.String(), "Installed:") {
		t.Errorf("the task's output lacks dnf's own report:\n%s", out)
	}
	if got := hosttest.ReadFile(t, root, "/etc/dnf/dnf.conf"); !strings.Contains(got, "exclude=kubeadm kubelet kubectl\n") {
		t.Errorf("dnf.conf holds nothing:\n%s", got)
	}
	// Held: dnf's own upgrade leaves them although the repository has 1.37.2.
	inRoot(t, root, "/usr/bin/dnf", "-y", "upgrade")
	if got := rpmQuery(); got != "kubeadm 1.36.4-1.1\nkubelet 1.36.4-1.1\nkubectl 1.36.4-1.1\n" {
		t.Errorf("after dnf upgrade, rpm -q: %q: the hold did not hold", got)
	}

	runAll(t, env, upgradeInstalls(t, "dnf", "v1.37.2", repo))
	if got := rpmQuery(); got != "kubeadm 1.37.2-1.1\nkubelet 1.37.2-1.1\nkubectl 1.37.2-1.1\n" {
		t.Errorf("after the upgrade to v1.37.2, rpm -q: %q\n%s", got, out)
	}
	if got := inRoot(t, root, "/usr/bin/kubelet"); got != "kubelet v1.37.2-1.1\n" {
		t.Errorf("/usr/bin/kubelet says %q", got)
	}
}

// TestInstallPackagesRefusesUnknownFamily: auto never guesses a package manager, and the refusal
// changes nothing in the root.
func TestInstallPackagesRefusesUnknownFamily(t *testing.T) {
	root := hosttest.NewRoot(t, map[string]string{"/etc/os-release": "ID=alpine\nVERSION_ID=3.20\n", "/usr/bin/apt-get": "#!/bin/sh\n"})
	env, out := realEnv(root, false)
	_, err := commands.Run(context.Background(), env, &v1alpha1.Command{InstallPackages: &v1alpha1.InstallPackagesCommand{
		Packages: []string{"kubeadm"}, Manager: "auto", Hold: true,
		Repository: &v1alpha1.PackageRepository{Name: "kubernetes", URL: "http://127.0.0.1:9/", Trusted: true}}})
	if err == nil || !strings.Contains(err.Error(), `OS family "alpine"`) || !strings.Contains(err.Error(), "set manager to apt, dnf, yum or zypper") {
		t.Fatalf("auto on an Alpine root: %v", err)
	}
	if hosttest.ReadFile(t, root, "/etc/apt/sources.list.d/kubernetes.list") != "" || out.Len() != 0 {
		t.Errorf("the refused command wrote a source or ran something:\n%s", out)
	}
}

// signingKey makes an OpenPGP key in its own keyring and returns that keyring's directory and the armoured public key.
func signingKey(t *testing.T) (home, public string) {
	t.Helper()
	need(t, "gpg")
	home = t.TempDir()
	mustRun(t, home, "gpg", "--batch", "--homedir", home, "--passphrase", "", "--quick-gen-key", "nodeops test <nodeops@localhost>", "ed25519", "sign", "never")
	return home, mustRun(t, home, "gpg", "--batch", "--homedir", home, "--armor", "--export")
}

// TestInstallPackagesAptSigned: with signingKey, apt checks the repository's signature with that key
// only: the right key installs, another key is refused and nothing is installed.
func TestInstallPackagesAptSigned(t *testing.T) {
	start := time.Now()
	defer func() { t.Logf("TestInstallPackagesAptSigned took %s", time.Since(start).Round(time.Millisecond)) }()
	repoDir := buildAptRepo(t, "1.37.2-1.1")
	home, public := signingKey(t)
	mustRun(t, repoDir, "gpg", "--batch", "--homedir", home, "--clearsign", "-o", "InRelease", "Release")
	_, other := signingKey(t)
	root := debroot.Root(t, rootPackages...)
	if err := os.Remove(filepath.Join(root, "etc/apt/sources.list")); err != nil {
		t.Fatal(err)
	}
	url := serve(t, repoDir)
	install := func(key string) (*bytes.Buffer, error) {
		env, out := realEnv(root, false)
		_, err := commands.Run(context.Background(), env, &v1alpha1.Command{InstallPackages: &v1alpha1.InstallPackagesCommand{
			Packages: []string{"kubeadm"}, Version: "v1.37.2", Manager: "auto",
			Repository: &v1alpha1.PackageRepository{Name: "kubernetes", URL: url, SigningKey: key}}})
		return out, err
	}
	if out, err := install(other); err == nil {
		t.Fatalf("a repository signed by another key was installed from:\n%s", out)
	} else if !strings.Contains(out.String(), "NO_PUBKEY") && !strings.Contains(out.String(), "is not signed") {
		t.Errorf("the refusal does not say why: %v\n%s", err, out)
	}
	if hosttest.ReadFile(t, root, "/usr/bin/kubeadm") != "" {
		t.Fatalf("kubeadm was installed from a repository signed by another key")
	}
	out, err := install(public)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got := hosttest.ReadFile(t, root, "/etc/apt/sources.list.d/kubernetes.list"); !strings.Contains(got, "deb [signed-by=/etc/apt/keyrings/nodeops-kubernetes.asc] "+url+" /") {
		t.Errorf("sources.list.d/kubernetes.list is %q", got)
	}
	if got := inRoot(t, root, "/usr/bin/kubeadm"); got != "kubeadm v1.37.2-1.1\n" {
		t.Errorf("/usr/bin/kubeadm says %q", got)
	}
}

// TestInstallPackagesZypper: the SUSE family's zypper (Debian packages it) inside a root that has it,
// from a local rpm-md repository the command adds; the hold is zypper's lock, which zypper's own
// update obeys, and the next install lifts it for itself and puts it back.
func TestInstallPackagesZypper(t *testing.T) {
	start := time.Now()
	defer func() { t.Logf("TestInstallPackagesZypper took %s", time.Since(start).Round(time.Millisecond)) }()
	repoDir := buildRPMRepo(t, "1.36.4-1.1", "1.37.2-1.1")
	root := debroot.Root(t, rootPackages...)
	repo := &v1alpha1.PackageRepository{Name: "kubernetes", URL: serve(t, repoDir), Trusted: true}
	// libzypp keeps its rpm database in /var/lib/rpm; Debian's rpm alone would look in ~/.rpmdb.
	rpmQuery := func() string {
		return inRoot(t, root, "/usr/bin/rpm", "--dbpath", "/var/lib/rpm", "-q", "--qf", "%{NAME} %{VERSION}-%{RELEASE}\n", "kubeadm", "kubelet", "kubectl")
	}
	install := func(version string) {
		t.Helper()
		env, out := realEnv(root, false)
		cmd := v1alpha1.Command{InstallPackages: &v1alpha1.InstallPackagesCommand{
			Packages: kubePackages, Version: version, Manager: "zypper", Hold: true, Repository: repo}}
		if _, err := commands.Run(context.Background(), env, &cmd); err != nil {
			t.Fatalf("zypper install %s: %v\n%s", version, err, out)
		}
		if !strings.Contains(out.String(), "$ /usr/bin/zypper --non-interactive addlock kubeadm kubelet kubectl") {
			t.Errorf("the task's output lacks the lock:\n%s", out)
		}
		t.Logf("zypper's own output:\n%s", out)
	}

	install("v1.36.4")
	if got := rpmQuery(); got != "kubeadm 1.36.4-1.1\nkubelet 1.36.4-1.1\nkubectl 1.36.4-1.1\n" {
		t.Errorf("rpm -q: %q", got)
	}
	if got := inRoot(t, root, "/usr/bin/zypper", "--non-interactive", "locks"); !strings.Contains(got, "kubelet") {
		t.Errorf("zypper locks lists no kubelet:\n%s", got)
	}
	// Held: zypper's own update leaves them although the repository has 1.37.2.
	inRoot(t, root, "/usr/bin/zypper", "--non-interactive", "update")
	if got := rpmQuery(); got != "kubeadm 1.36.4-1.1\nkubelet 1.36.4-1.1\nkubectl 1.36.4-1.1\n" {
		t.Errorf("after zypper update, rpm -q: %q: the lock did not hold", got)
	}

	install("v1.37.2")
	if got := rpmQuery(); got != "kubeadm 1.37.2-1.1\nkubelet 1.37.2-1.1\nkubectl 1.37.2-1.1\n" {
		t.Errorf("after the install of v1.37.2, rpm -q: %q", got)
	}
	if got := inRoot(t, root, "/usr/bin/kubelet"); got != "kubelet v1.37.2-1.1\n" {
		t.Errorf("/usr/bin/kubelet says %q", got)
	}
	if got := inRoot(t, root, "/usr/bin/zypper", "--non-interactive", "locks"); !strings.Contains(got, "kubelet") {
		t.Errorf("after the second install zypper locks lists no kubelet:\n%s", got)
	}
}
