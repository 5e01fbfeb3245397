package host

import (
	"bufio"
	"bytes"
	"strings"
)

// OSInfo is what the agent knows of a host's operating system.
type OSInfo struct {
	// ID and VersionID come from os-release.
	ID        string
	VersionID string
	// Family is one of debian, rhel, suse, alpine, arch, unknown.
	Family string
	// InitSystem is systemd, openrc, sysvinit or unknown.
	InitSystem string
	// PackageManager is apt, dnf, yum, zypper, apk, pacman or unknown.
	PackageManager string
}

// DetectOS reads the OS from the files under a root.
func DetectOS(f Files) OSInfo {
	return detectOS(func(p string) ([]byte, bool) {
		b, err := f.ReadFile(p)
		if err != nil {
			return nil, f.Exists(p)
		}
		return b, true
	})
}

// detectOS is the pure part: read returns a file's content and whether it exists.
func detectOS(read func(p string) ([]byte, bool)) OSInfo {
	info := OSInfo{Family: "unknown", InitSystem: "unknown", PackageManager: "unknown"}
	release, ok := read("/etc/os-release")
	if !ok {
		release, _ = read("/usr/lib/os-release")
	}
	fields := parseOSRelease(release)
	info.ID, info.VersionID = fields["ID"], fields["VERSION_ID"]
	info.Family = osFamily(fields["ID"], fields["ID_LIKE"])

	exists := func(p string) bool { _, ok := read(p); return ok }
	switch {
	case exists("/run/systemd/system"), exists("/usr/lib/systemd/systemd"), exists("/lib/systemd/systemd"):
		info.InitSystem = "systemd"
	case exists("/sbin/openrc"), exists("/usr/sbin/openrc"), exists("/sbin/openrc-run"):
		info.InitSystem = "openrc"
	case exists("/etc/inittab"):
		info.InitSystem = "sysvinit"
	}
	for _, pm := range []struct{ name, path string }{
		{"apt", "/usr/bin/apt-get"}, {"dnf", "/usr/bin/dnf"}, {"yum", "/usr/bin/yum"},
		{"zypper", "/usr/bin/zypper"}, {"apk", "/sbin/apk"}, {"apk", "/usr/sbin/apk"}, {"pacman", "/usr/bin/pacman"},
	} {
		if exists(pm.path) {
			info.PackageManager = pm.name
			break
		}
	}
	return info
}

func parseOSRelease(b []byte) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		out[k] = strings.Trim(v, `"'`)
	}
	return out
}

func osFamily(id, idLike string) string {
	for _, w := range append([]string{id}, strings.Fields(idLike)...) {
		switch w {
		case "debian", "ubuntu", "raspbian", "linuxmint":
			return "debian"
		case "rhel", "centos", "fedora", "rocky", "almalinux", "amzn", "ol":
			return "rhel"
		case "suse", "sles", "opensuse", "opensuse-leap", "opensuse-tumbleweed":
			return "suse"
		case "alpine":
			return "alpine"
		case "arch", "manjaro":
			return "arch"
		}
	}
	return "unknown"
}
