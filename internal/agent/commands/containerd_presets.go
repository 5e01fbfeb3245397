package commands

import (
	"fmt"
	"path"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// containerdPreset is where a distro keeps containerd's config and which unit runs containerd
// (docs/design.md, "containerd presets").
type containerdPreset struct {
	distro v1alpha1.ContainerdDistro
	// config is the file containerd reads, or for template distros the file the distro generates.
	config string
	// templates are the templates the distro renders config from, the one an existing file is preferred
	// first (config-v3.toml.tmpl, which k3s and rke2 with containerd 2 read); the last is created when none
	// exists, as every release reads config.toml.tmpl.
	templates []string
	// dropInDir, when set, is always written to instead of config (k0s merges it into its own CRI import).
	dropInDir string
	// units are the candidate units, the default first; the one enabled or installed is restarted.
	units []string
}

var containerdPresets = []containerdPreset{
	{distro: v1alpha1.ContainerdDistroK3s, config: "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
		templates: []string{"/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl", "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"},
		units:     []string{"k3s", "k3s-agent"}},
	{distro: v1alpha1.ContainerdDistroRKE2, config: "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
		templates: []string{"/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.tmpl", "/var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl"},
		units:     []string{"rke2-server", "rke2-agent"}},
	{distro: v1alpha1.ContainerdDistroK0s, config: "/etc/k0s/containerd.toml", dropInDir: "/etc/k0s/containerd.d",
		units: []string{"k0sworker", "k0scontroller"}},
	// microk8s renders args/containerd.toml from this template when its containerd starts; ${SNAP_DATA} and
	// the like are inside TOML strings, so the template parses as TOML.
	{distro: v1alpha1.ContainerdDistroMicroK8s, config: "/var/snap/microk8s/current/args/containerd-template.toml",
		units: []string{"snap.microk8s.daemon-containerd"}},
	{distro: v1alpha1.ContainerdDistroContainerd, config: defaultContainerdConfig, units: []string{"containerd"}},
}

// unitDirs are where systemd finds units, the administrator's first.
var unitDirs = []string{"/etc/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system"}

func presetFor(d v1alpha1.ContainerdDistro) containerdPreset {
	for _, p := range containerdPresets {
		if p.distro == d {
			return p
		}
	}
	return containerdPresets[len(containerdPresets)-1]
}

// detectPreset picks the first distro whose files are in the host root, plain containerd last.
func detectPreset(files host.Files) containerdPreset {
	for _, p := range containerdPresets {
		if files.Exists(p.config) || (p.dropInDir != "" && files.Exists(p.dropInDir)) {
			return p
		}
		for _, t := range p.templates {
			if files.Exists(t) {
				return p
			}
		}
	}
	return presetFor(v1alpha1.ContainerdDistroContainerd)
}

// unit is the preset's unit that is enabled (wanted by multi-user.target), else the one installed, else the default.
func (p containerdPreset) unit(files host.Files) string {
	for _, u := range p.units {
		if files.Exists("/etc/systemd/system/multi-user.target.wants/" + u + ".service") {
			return u
		}
	}
	for _, u := range p.units {
		for _, d := range unitDirs {
			if files.Exists(d + "/" + u + ".service") {
				return u
			}
		}
	}
	return p.units[0]
}

// containerdTarget is the file a containerdRuntime command edits and how.
type containerdTarget struct {
	distro v1alpha1.ContainerdDistro
	unit   string
	// path is the file written.
	path string
	// seed is read when path does not exist: the generated config a new template starts from, or, for a
	// drop-in, "" (the drop-in starts as `version = N`).
	seed string
	// template is set when path is a k3s/rke2/microk8s template, whose {{ }} lines are kept as they are.
	template bool
	// dropIn is set when path is a drop-in: removing the last handler from it deletes it.
	dropIn bool
	// version is the main config's version, for a drop-in or a template without its own version line.
	version int64
}

// resolveContainerd finds what to edit: the distro's config (configPath overrides it), its template,
// or a drop-in in a directory the main config imports (or k0s' containerd.d).
func resolveContainerd(files host.Files, c *v1alpha1.ContainerdRuntimeCommand) (containerdTarget, error) {
	var p containerdPreset
	switch c.Distro {
	case "", v1alpha1.ContainerdDistroAuto:
		p = detectPreset(files)
	default:
		p = presetFor(c.Distro)
	}
	t := containerdTarget{distro: p.distro, unit: p.unit(files)}
	main := p.config
	if c.ConfigPath != "" {
		main = c.ConfigPath
		if strings.HasSuffix(main, ".tmpl") {
			t.path, t.template = main, true
			t.seed = strings.TrimSuffix(main, ".tmpl")
			t.version = configVersion(files, t.seed)
			return t, nil
		}
		p.templates, p.dropInDir = nil, ""
	}
	if len(p.templates) > 0 {
		t.path, t.template, t.seed = p.templates[len(p.templates)-1], true, main
		for _, tmpl := range p.templates {
			if files.Exists(tmpl) {
				t.path = tmpl
				break
			}
		}
		t.version = configVersion(files, main)
		return t, nil
	}
	if p.distro == v1alpha1.ContainerdDistroMicroK8s && c.ConfigPath == "" {
		t.path, t.template = main, true
		return t, nil
	}
	if p.dropInDir != "" {
		t.path, t.dropIn = path.Join(p.dropInDir, c.Name+".toml"), true
		t.version = configVersion(files, main)
		if t.version == 0 {
			t.version = 2
		}
		return t, nil
	}
	t.path = main
	data, err := files.ReadFile(main)
	if err != nil {
		return containerdTarget{}, fmt.Errorf("reading %s: %w", main, err)
	}
	doc := map[string]any{}
	if err := toml.Unmarshal(data, &doc); err != nil {
		return containerdTarget{}, fmt.Errorf("parsing %s: %w", main, err)
	}
	if dropIn := dropInPath(main, doc["imports"], c.Name); dropIn != "" {
		t.path, t.dropIn = dropIn, true
		t.version, _ = doc["version"].(int64)
	}
	return t, nil
}

// dropInPath is <dir>/<name>.toml for the first of the config's imports that is a pattern this name
// matches; containerd reads relative imports from the main config's directory.
func dropInPath(main string, imports any, name string) string {
	list, _ := imports.([]any)
	for _, i := range list {
		pattern, _ := i.(string)
		if !strings.ContainsAny(pattern, "*?[") {
			continue
		}
		if !path.IsAbs(pattern) {
			pattern = path.Join(path.Dir(main), pattern)
		}
		candidate := path.Join(path.Dir(pattern), name+".toml")
		if ok, err := path.Match(pattern, candidate); err == nil && ok && !strings.ContainsAny(path.Dir(pattern), "*?[") {
			return candidate
		}
	}
	return ""
}

// configVersion is the version a config file declares, 0 when it cannot be read.
func configVersion(files host.Files, p string) int64 {
	data, err := files.ReadFile(p)
	if err != nil {
		return 0
	}
	doc := map[string]any{}
	if toml.Unmarshal(maskTemplate(data), &doc) != nil {
		return 0
	}
	v, _ := doc["version"].(int64)
	return v
}

// maskTemplate turns each line that starts with a template action ({{ template "base" . }} in k3s'
// documented templates) into a comment of the same length, so the TOML editor can read the rest.
func maskTemplate(data []byte) []byte {
	out := append([]byte{}, data...)
	start := 0
	for start < len(out) {
		end := start
		for end < len(out) && out[end] != '\n' {
			end++
		}
		line := out[start:end]
		trimmed := strings.TrimLeft(string(line), " \t")
		if strings.HasPrefix(trimmed, "{{") {
			out[start+len(line)-len(trimmed)] = '#'
		}
		start = end + 1
	}
	return out
}

// unmaskTemplate gives back the masked lines of the original, which the editor kept byte for byte.
func unmaskTemplate(original, edited []byte) []byte {
	masked := map[string]string{}
	for _, line := range strings.Split(string(original), "\n") {
		if strings.HasPrefix(strings.TrimLeft(line, " \t"), "{{") {
			masked[string(maskTemplate([]byte(line)))] = line
		}
	}
	if len(masked) == 0 {
		return edited
	}
	lines := strings.Split(string(edited), "\n")
	for i, l := range lines {
		if o, ok := masked[l]; ok {
			lines[i] = o
		}
	}
	return []byte(strings.Join(lines, "\n"))
}

// hasTemplateActions says whether a template has actions that a re-encode would lose.
func hasTemplateActions(data []byte) bool {
	return strings.Contains(string(data), "{{")
}
