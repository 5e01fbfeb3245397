package commands

import (
	"strings"
	"testing"

	"github.com/nodeops/nodeops/internal/host"
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
