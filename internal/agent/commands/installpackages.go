package commands

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// runInstallPackages installs packages with the host's own package manager, chrooted into the host
// root, with the manager's output in the command's output. Every program it runs is printed in full
// first, so a DryRun (whose runner runs nothing) shows the exact commands.
func runInstallPackages(ctx context.Context, env *Env, p *v1alpha1.InstallPackagesCommand) (Result, error) {
	info := host.DetectOS(env.Host.Files)
	manager, err := choosePackageManager(p.Manager, info)
	if err != nil {
		return Result{}, err
	}
	if !env.Host.Files.Exists(manager.binary) {
		return Result{}, fmt.Errorf("package manager %s: %s is not in the host root (OS %s, family %s)", manager.name, manager.binary, info.ID, info.Family)
	}
	env.printf("os: id=%s version=%s family=%s; package manager %s\n", info.ID, info.VersionID, info.Family, manager.name)
	steps, files, err := manager.plan(env, p)
	if err != nil {
		return Result{}, err
	}
	for _, f := range files {
		env.printf("file %s:\n%s", f.path, f.data)
		if err := env.Host.Files.WriteFileAtomic(f.path, []byte(f.data), 0o644); err != nil {
			return Result{}, fmt.Errorf("writing %s: %w", f.path, err)
		}
	}
	for _, s := range steps {
		if s.run == nil {
			env.printf("$ %s\n", strings.Join(s.argv, " "))
			if err := env.Host.Exec.Run(ctx, host.Cmd{Path: s.argv[0], Args: s.argv[1:], Env: manager.env, Output: env.out()}); err != nil {
				return Result{}, fmt.Errorf("%s: %w", strings.Join(s.argv, " "), err)
			}
			continue
		}
		if err := s.run(); err != nil {
			return Result{}, err
		}
	}
	msg := fmt.Sprintf("installed %s with %s", strings.Join(manager.specs(p), " "), manager.name)
	if p.Hold {
		msg += ", held"
	}
	return Result{Message: msg}, nil
}

// packageManager is what runInstallPackages knows of one package manager.
type packageManager struct {
	name, binary string
	env          []string
	plan         func(env *Env, p *v1alpha1.InstallPackagesCommand) ([]step, []repoFile, error)
	specs        func(p *v1alpha1.InstallPackagesCommand) []string
}

// step is a program to run, or (run set) a change to a file made through the host's Files.
type step struct {
	argv []string
	run  func() error
}

type repoFile struct{ path, data string }

var baseEnv = []string{"PATH=" + host.DefaultPath, "HOME=/root", "LC_ALL=C"}

// choosePackageManager picks by the OS family for auto: a family it does not know fails, as the
// wrong package manager could half-install Kubernetes.
func choosePackageManager(name string, info host.OSInfo) (packageManager, error) {
	if name == "" || name == "auto" {
		switch info.Family {
		case "debian":
			name = "apt"
		case "rhel":
			name = "dnf"
			if info.PackageManager == "yum" {
				name = "yum"
			}
		case "suse":
			name = "zypper"
		default:
			return packageManager{}, fmt.Errorf("manager auto: OS family %q (os-release ID %q) is not Debian, RedHat or SUSE, so nodeops does not know its package manager; set manager to apt, dnf, yum or zypper if one of them is right for it", info.Family, info.ID)
		}
	}
	switch name {
	case "apt":
		return packageManager{name: "apt", binary: "/usr/bin/apt-get", env: append(slices.Clone(baseEnv), "DEBIAN_FRONTEND=noninteractive"), plan: planApt, specs: aptSpecs}, nil
	case "dnf", "yum":
		return packageManager{name: name, binary: "/usr/bin/" + name, env: baseEnv, plan: planRPM(name), specs: rpmSpecs}, nil
	case "zypper":
		return packageManager{name: "zypper", binary: "/usr/bin/zypper", env: baseEnv, plan: planZypper, specs: zypperSpecs}, nil
	}
	return packageManager{}, fmt.Errorf("manager %q is none of auto, apt, dnf, yum, zypper", name)
}

// packageVersion splits the version into what the package managers match: a bare upstream version
// (v1.37.2 -> 1.37.2) matches any packaging revision, one with a revision matches exactly.
func packageVersion(v string) (version string, exact bool) {
	v = strings.TrimPrefix(v, "v")
	return v, strings.Contains(v, "-")
}

func aptSpecs(p *v1alpha1.InstallPackagesCommand) []string {
	out := make([]string, 0, len(p.Packages))
	for _, name := range p.Packages {
		switch v, exact := packageVersion(p.Version); {
		case v == "":
			out = append(out, name)
		case exact:
			out = append(out, name+"="+v)
		default:
			out = append(out, name+"="+v+"-*")
		}
	}
	return out
}

func planApt(env *Env, p *v1alpha1.InstallPackagesCommand) ([]step, []repoFile, error) {
	var files []repoFile
	update := []string{"/usr/bin/apt-get", "update", "-q"}
	if r := p.Repository; r != nil {
		options := "trusted=yes"
		if !r.Trusted {
			key := "/etc/apt/keyrings/nodeops-" + r.Name + ".asc"
			files = append(files, repoFile{key, strings.TrimSpace(r.SigningKey) + "\n"})
			options = "signed-by=" + key
		}
		suite := r.Suite
		if suite == "" {
			suite = "/"
		}
		list := "/etc/apt/sources.list.d/" + r.Name + ".list"
		line := strings.Join(append([]string{"deb", "[" + options + "]", r.URL, suite}, r.Components...), " ")
		files = append(files, repoFile{list, "# written by nodeops installPackages\n" + line + "\n"})
		// Only the new source is refreshed: the node's other sources are its own business, and may be unreachable.
		update = append(update, "-o", "Dir::Etc::sourcelist="+strings.TrimPrefix(list, "/etc/apt/"),
			"-o", "Dir::Etc::sourceparts=-", "-o", "APT::Get::List-Cleanup=0")
	}
	// A held package is installed only with --allow-change-held-packages: the install names its version.
	install := append([]string{"/usr/bin/apt-get", "install", "-y", "-q", "--allow-downgrades", "--allow-change-held-packages",
		"-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"}, aptSpecs(p)...)
	steps := []step{{argv: update}, {argv: install}}
	if p.Hold {
		steps = append(steps, step{argv: append([]string{"/usr/bin/apt-mark", "hold"}, p.Packages...)})
	}
	return steps, files, nil
}

// rpmSpecs: name-version matches any release; name-version-release exactly.
func rpmSpecs(p *v1alpha1.InstallPackagesCommand) []string { return versionedSpecs(p, "-") }

// versionedSpecs are the packages each joined to the version asked for by sep, as the package
// manager spells it; bare names when no version is asked for.
func versionedSpecs(p *v1alpha1.InstallPackagesCommand, sep string) []string {
	v, _ := packageVersion(p.Version)
	out := make([]string, 0, len(p.Packages))
	for _, name := range p.Packages {
		if v != "" {
			name += sep + v
		}
		out = append(out, name)
	}
	return out
}

// rpmRepoFile is an rpm-md repository as dnf, yum and zypper read it.
func rpmRepoFile(r *v1alpha1.PackageRepository, keyPath string, extra ...string) string {
	lines := []string{"# written by nodeops installPackages", "[" + r.Name + "]", "name=" + r.Name, "baseurl=" + r.URL, "enabled=1"}
	if r.Trusted {
		lines = append(lines, "gpgcheck=0", "repo_gpgcheck=0")
	} else {
		lines = append(lines, "gpgcheck=1", "gpgkey=file://"+keyPath)
	}
	return strings.Join(append(lines, extra...), "\n") + "\n"
}

// planRPM installs with dnf or yum. The hold is the exclude list of the [main] section of the
// manager's configuration (the versionlock plugin is not installed everywhere); installs pass
// --disableexcludes=main so a hold this command made does not hide the packages from the next one.
func planRPM(name string) func(env *Env, p *v1alpha1.InstallPackagesCommand) ([]step, []repoFile, error) {
	return func(env *Env, p *v1alpha1.InstallPackagesCommand) ([]step, []repoFile, error) {
		var files []repoFile
		bin := "/usr/bin/" + name
		install := []string{bin, "install", "-y", "--disableexcludes=main"}
		if r := p.Repository; r != nil {
			key := "/etc/pki/rpm-gpg/nodeops-" + r.Name + ".asc"
			if !r.Trusted {
				files = append(files, repoFile{key, strings.TrimSpace(r.SigningKey) + "\n"})
			}
			files = append(files, repoFile{"/etc/yum.repos.d/" + r.Name + ".repo", rpmRepoFile(r, key)})
			if name == "dnf" {
				// The new repository's metadata is fetched now, not when the node's cache expires.
				install = append(install, "--refresh")
			}
		}
		// A version named is installed whether it is newer or older than the one there.
		steps := []step{{argv: append(install, rpmSpecs(p)...)}}
		if p.Hold {
			conf := "/etc/dnf/dnf.conf"
			if name == "yum" {
				conf = "/etc/yum.conf"
			}
			steps = append(steps, step{run: func() error { return excludeInConfig(env, conf, p.Packages) }})
		}
		return steps, files, nil
	}
}

// excludeInConfig adds names to the exclude list of conf's [main] section, keeping what it held.
func excludeInConfig(env *Env, conf string, names []string) error {
	old, err := env.Host.Files.ReadFile(conf)
	if err != nil && env.Host.Files.Exists(conf) {
		return fmt.Errorf("reading %s: %w", conf, err)
	}
	updated := withExcludes(string(old), names)
	env.printf("hold: %s [main] %s\n", conf, excludeLine(updated))
	if err := env.Host.Files.WriteFileAtomic(conf, []byte(updated), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", conf, err)
	}
	return nil
}

func excludeLine(conf string) string {
	sc := bufio.NewScanner(strings.NewReader(conf))
	for sc.Scan() {
		if k, _, ok := strings.Cut(sc.Text(), "="); ok && isExcludeKey(k) {
			return strings.TrimSpace(sc.Text())
		}
	}
	return ""
}

func isExcludeKey(k string) bool {
	k = strings.TrimSpace(k)
	return k == "exclude" || k == "excludepkgs"
}

// withExcludes is conf with names in its [main] section's exclude (or excludepkgs) list, a [main]
// section added when it has none.
func withExcludes(conf string, names []string) string {
	var out bytes.Buffer
	lines := strings.SplitAfter(conf, "\n")
	if conf == "" {
		lines = nil
	}
	section, mainAt, done := "", -1, false
	for i, line := range lines {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "[") && strings.HasSuffix(t, "]") {
			section = t
			if t == "[main]" {
				mainAt = i
			}
		}
		if k, v, ok := strings.Cut(t, "="); ok && section == "[main]" && isExcludeKey(k) && !done {
			held := strings.FieldsFunc(v, func(r rune) bool { return r == ' ' || r == ',' })
			for _, n := range names {
				if !slices.Contains(held, n) {
					held = append(held, n)
				}
			}
			lines[i] = strings.TrimSpace(k) + "=" + strings.Join(held, " ") + "\n"
			done = true
		}
	}
	if !done {
		add := "exclude=" + strings.Join(names, " ") + "\n"
		if mainAt < 0 {
			lines = append([]string{"[main]\n", add}, lines...)
		} else {
			lines = slices.Insert(lines, mainAt+1, add)
		}
	}
	for i, l := range lines {
		if i > 0 && !strings.HasSuffix(lines[i-1], "\n") {
			out.WriteString("\n")
		}
		out.WriteString(l)
	}
	return out.String()
}

// zypperSpecs: zypper matches name=version against any release, name=version-release exactly.
func zypperSpecs(p *v1alpha1.InstallPackagesCommand) []string { return versionedSpecs(p, "=") }

// planZypper installs with zypper: a lock from an earlier hold is lifted for the install (zypper
// refuses to change a locked package) and put back after it.
func planZypper(_ *Env, p *v1alpha1.InstallPackagesCommand) ([]step, []repoFile, error) {
	var files []repoFile
	zypper := []string{"/usr/bin/zypper", "--non-interactive"}
	steps := []step{{argv: append(append(slices.Clone(zypper), "removelock"), p.Packages...)}}
	if r := p.Repository; r != nil {
		key := "/etc/pki/rpm-gpg/nodeops-" + r.Name + ".asc"
		if !r.Trusted {
			files = append(files, repoFile{key, strings.TrimSpace(r.SigningKey) + "\n"})
		}
		files = append(files, repoFile{"/etc/zypp/repos.d/" + r.Name + ".repo", rpmRepoFile(r, key, "autorefresh=1", "type=rpm-md")})
		refresh := append(slices.Clone(zypper), "refresh", r.Name)
		if !r.Trusted {
			refresh = append(slices.Clone(zypper), "--gpg-auto-import-keys", "refresh", r.Name)
		}
		steps = append(steps, step{argv: refresh})
	}
	steps = append(steps, step{argv: append(append(slices.Clone(zypper), "install", "--oldpackage"), zypperSpecs(p)...)})
	if p.Hold {
		steps = append(steps, step{argv: append(append(slices.Clone(zypper), "addlock"), p.Packages...)})
	}
	return steps, files, nil
}
