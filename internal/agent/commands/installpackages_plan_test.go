package commands

import (
	"strings"
	"testing"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
	"github.com/nodeops/nodeops/internal/host/hosttest"
)

// auto picks by family and fails on any family it does not know; an explicit manager is taken as said.
func TestChoosePackageManager(t *testing.T) {
	tests := []struct {
		manager string
		info    host.OSInfo
		want    string // "" for a refusal
	}{
		{"auto", host.OSInfo{ID: "ubuntu", Family: "debian", PackageManager: "apt"}, "apt"},
		{"", host.OSInfo{ID: "rocky", Family: "rhel", PackageManager: "dnf"}, "dnf"},
		{"auto", host.OSInfo{ID: "centos", Family: "rhel", PackageManager: "yum"}, "yum"},
		{"auto", host.OSInfo{ID: "sles", Family: "suse", PackageManager: "zypper"}, "zypper"},
		{"auto", host.OSInfo{ID: "alpine", Family: "alpine", PackageManager: "apk"}, ""},
		{"auto", host.OSInfo{ID: "", Family: "unknown", PackageManager: "apt"}, ""},
		{"dnf", host.OSInfo{ID: "debian", Family: "debian", PackageManager: "apt"}, "dnf"},
		{"pacman", host.OSInfo{Family: "arch"}, ""},
	}
	for _, tt := range tests {
		got, err := choosePackageManager(tt.manager, tt.info)
		if tt.want == "" {
			if err == nil {
				t.Errorf("%s on %+v chose %s, want a refusal", tt.manager, tt.info, got.name)
			}
			continue
		}
		if err != nil || got.name != tt.want {
			t.Errorf("%s on %+v: %q, %v; want %s", tt.manager, tt.info, got.name, err, tt.want)
		}
	}
}

// The hold is added to [main]'s exclude list, keeping what it held and every other line.
func TestWithExcludes(t *testing.T) {
	tests := []struct{ conf, want string }{
		{"", "[main]\nexclude=kubeadm kubelet\n"},
		{"[main]\ngpgcheck=1\n", "[main]\nexclude=kubeadm kubelet\ngpgcheck=1\n"},
		{"[main]\nexcludepkgs=docker*,kubelet\n[other]\nexclude=x\n", "[main]\nexcludepkgs=docker* kubelet kubeadm\n[other]\nexclude=x\n"},
		{"[repo]\nexclude=x\n", "[main]\nexclude=kubeadm kubelet\n[repo]\nexclude=x\n"},
		{"[main]\nexclude=kubeadm kubelet", "[main]\nexclude=kubeadm kubelet\n"},
	}
	for _, tt := range tests {
		if got := withExcludes(tt.conf, []string{"kubeadm", "kubelet"}); got != tt.want {
			t.Errorf("withExcludes(%q) =\n%s\nwant\n%s", tt.conf, got, strings.TrimSpace(tt.want))
		}
	}
}

// auto's choice from real os-release files and the package managers' programs in the root, through
// the same DetectOS the command and the preflight use; an unknown family refuses, in both.
func TestPackageManagerByOSRelease(t *testing.T) {
	tests := []struct {
		name      string
		osRelease string
		programs  []string
		want      string // "" for a refusal
	}{
		{"debian", "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n", []string{"/usr/bin/apt-get"}, "apt"},
		{"ubuntu", "NAME=\"Ubuntu\"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID=\"24.04\"\n", []string{"/usr/bin/apt-get"}, "apt"},
		{"rocky", "NAME=\"Rocky Linux\"\nID=\"rocky\"\nID_LIKE=\"rhel centos fedora\"\nVERSION_ID=\"9.4\"\n", []string{"/usr/bin/dnf", "/usr/bin/yum"}, "dnf"},
		{"centos 7, yum only", "NAME=\"CentOS Linux\"\nID=\"centos\"\nID_LIKE=\"rhel fedora\"\nVERSION_ID=\"7\"\n", []string{"/usr/bin/yum"}, "yum"},
		{"opensuse leap", "NAME=\"openSUSE Leap\"\nID=\"opensuse-leap\"\nID_LIKE=\"suse opensuse\"\nVERSION_ID=\"15.6\"\n", []string{"/usr/bin/zypper"}, "zypper"},
		{"sles", "NAME=\"SLES\"\nID=\"sles\"\nID_LIKE=\"suse\"\nVERSION_ID=\"15.6\"\n", []string{"/usr/bin/zypper"}, "zypper"},
		{"alpine", "NAME=\"Alpine Linux\"\nID=alpine\nVERSION_ID=3.20.0\n", []string{"/sbin/apk"}, ""},
		{"arch", "NAME=\"Arch Linux\"\nID=arch\n", []string{"/usr/bin/pacman"}, ""},
		{"unknown ID", "NAME=\"Plan 9\"\nID=plan9\n", []string{"/usr/bin/apt-get"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string]string{}
			if tt.osRelease != "" {
				files["/etc/os-release"] = tt.osRelease
			}
			for _, p := range tt.programs {
				files[p] = ""
			}
			info := host.DetectOS(&host.FS{Root: hosttest.NewRoot(t, files)})
			got, err := choosePackageManager("auto", info)
			if tt.want == "" {
				if err == nil || !strings.Contains(err.Error(), "is not Debian, RedHat or SUSE") {
					t.Errorf("auto on %+v: %q, %v; want a refusal", info, got.name, err)
				}
				return
			}
			if err != nil || got.name != tt.want {
				t.Errorf("auto on %+v: %q, %v; want %s", info, got.name, err, tt.want)
			}
		})
	}
}

// yum cannot be run here (Debian does not package it): its command lines are checked as built.
func TestInstallPackagesYumCommandLines(t *testing.T) {
	m, err := choosePackageManager("yum", host.OSInfo{})
	if err != nil {
		t.Fatal(err)
	}
	p := &v1alpha1.InstallPackagesCommand{Packages: []string{"kubeadm", "kubelet"}, Version: "v1.37.2", Manager: "yum", Hold: true,
		Repository: &v1alpha1.PackageRepository{Name: "kubernetes", URL: "https://pkgs.example/rpm/", Trusted: true}}
	steps, files, err := m.plan(&Env{}, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 2 || strings.Join(steps[0].argv, " ") != "/usr/bin/yum install -y --disableexcludes=main kubeadm-1.37.2 kubelet-1.37.2" || steps[1].run == nil {
		t.Errorf("steps %+v: want yum install without dnf's --refresh, then the hold", steps)
	}
	if len(files) != 1 || files[0].path != "/etc/yum.repos.d/kubernetes.repo" || !strings.Contains(files[0].data, "baseurl=https://pkgs.example/rpm/\n") {
		t.Errorf("files %+v", files)
	}
	if got := withExcludes("[main]\ngpgcheck=1\n", p.Packages); got != "[main]\nexclude=kubeadm kubelet\ngpgcheck=1\n" {
		t.Errorf("/etc/yum.conf after the hold: %q", got)
	}
}
