package commands

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// dryRunFile is how kubeadm's dry runs print a file they would write (cmd/kubeadm/app/util/dryrun).
var dryRunFile = regexp.MustCompile(`\[dryrun\] Would write file "([^"]+)" with content:\n`)

// kubeadmNoise are lines of kubeadm's output that are no file's content: klog's (stderr shares the
// output), kubeadm's own "[phase] ..." messages, and what the run itself prints.
var kubeadmNoise = regexp.MustCompile(`^([IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^ ]+:\d+\] |\[[a-z][a-z/-]*\] |\$ kubeadm |removed kubeadm's dry-run files )`)

// ParseDryRunFiles reads the files a kubeadm dry run printed, by the path it would write them to.
func ParseDryRunFiles(out string) map[string]string {
	files := map[string]string{}
	at := dryRunFile.FindAllStringSubmatchIndex(out, -1)
	for i, m := range at {
		end := len(out)
		if i+1 < len(at) {
			end = at[i+1][0]
		}
		var keep []string
		for _, line := range strings.SplitAfter(out[m[1]:end], "\n") {
			if line != "" && !kubeadmNoise.MatchString(line) {
				keep = append(keep, line)
			}
		}
		files[out[m[2]:m[3]]] = strings.Join(keep, "")
	}
	return files
}

// maxDifferences is how many differences a reason names; the rest are counted.
const maxDifferences = 3

// DiffStaticPod compares a static pod manifest with the one kubeadm generates, on what decides how
// the component runs: each container's image, command and arguments (as flags: their order and
// kubeadm's own sorting do not matter), volume mounts, and the pod's host-path volumes. Labels,
// annotations, probes and resources, which kubeadm sets by itself, are left out. It returns a short
// reason, empty when they match.
func DiffStaticPod(have, want []byte) string {
	return summarize(staticPodDiffs(have, want, diffMaps))
}

// StaticPodChanges lists every difference between two renderings of a static pod manifest, on what
// DiffStaticPod compares, as "what: old -> new": what a reconfigure changes.
func StaticPodChanges(before, after []byte) []string {
	return staticPodDiffs(before, after, changeMaps)
}

func staticPodDiffs(have, want []byte, diffMaps func(what string, have, want map[string]string) []string) []string {
	var h, w corev1.Pod
	if err := yaml.Unmarshal(have, &h); err != nil {
		return []string{"manifest unreadable: " + err.Error()}
	}
	if err := yaml.Unmarshal(want, &w); err != nil {
		return []string{"kubeadm's manifest unreadable: " + err.Error()}
	}
	var diffs []string
	haveContainers := map[string]corev1.Container{}
	for _, c := range h.Spec.Containers {
		haveContainers[c.Name] = c
	}
	for _, wc := range w.Spec.Containers {
		hc, ok := haveContainers[wc.Name]
		if !ok {
			diffs = append(diffs, "container "+wc.Name+" missing")
			continue
		}
		delete(haveContainers, wc.Name)
		if hc.Image != wc.Image {
			diffs = append(diffs, fmt.Sprintf("image %s, kubeadm's %s", hc.Image, wc.Image))
		}
		diffs = append(diffs, diffMaps("flag ", flags(append(slices.Clone(hc.Command), hc.Args...)), flags(append(slices.Clone(wc.Command), wc.Args...)))...)
		diffs = append(diffs, diffMaps("mount ", mounts(hc.VolumeMounts), mounts(wc.VolumeMounts))...)
	}
	for _, name := range slices.Sorted(maps.Keys(haveContainers)) {
		diffs = append(diffs, "container "+name+" is not kubeadm's")
	}
	diffs = append(diffs, diffMaps("volume ", volumes(h.Spec.Volumes), volumes(w.Spec.Volumes))...)
	return diffs
}

// flags reads a command line as flag -> value; words that are no flag are kept by position.
func flags(argv []string) map[string]string {
	out := map[string]string{}
	for i, a := range argv {
		if !strings.HasPrefix(a, "-") {
			out[fmt.Sprintf("argument %d", i)] = a
			continue
		}
		k, v, _ := strings.Cut(a, "=")
		out[k] = v
	}
	return out
}

func mounts(ms []corev1.VolumeMount) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		v := m.MountPath
		if m.ReadOnly {
			v += " (read-only)"
		}
		out[m.Name] = v
	}
	return out
}

func volumes(vs []corev1.Volume) map[string]string {
	out := map[string]string{}
	for _, v := range vs {
		switch {
		case v.HostPath != nil:
			s := v.HostPath.Path
			if v.HostPath.Type != nil && *v.HostPath.Type != "" {
				s += " (" + string(*v.HostPath.Type) + ")"
			}
			out[v.Name] = s
		default:
			b, _ := json.Marshal(v.VolumeSource)
			out[v.Name] = string(b)
		}
	}
	return out
}

// diffMaps names every key whose value differs, sorted: "what=have, kubeadm's want".
func diffMaps(what string, have, want map[string]string) []string {
	var out []string
	keys := slices.Sorted(maps.Keys(have))
	for k := range want {
		if _, ok := have[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		h, inHave := have[k]
		w, inWant := want[k]
		switch {
		case inHave && !inWant:
			out = append(out, fmt.Sprintf("%s%s=%s, kubeadm's has none", what, k, h))
		case !inHave && inWant:
			out = append(out, fmt.Sprintf("%s%s missing, kubeadm's %s", what, k, w))
		case h != w:
			out = append(out, fmt.Sprintf("%s%s=%s, kubeadm's %s", what, k, h, w))
		}
	}
	return out
}

// changeMaps names every key whose value differs, sorted: "what: old -> new", (none) for a key absent.
func changeMaps(what string, before, after map[string]string) []string {
	keys := slices.Sorted(maps.Keys(before))
	for k := range after {
		if _, ok := before[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []string
	show := func(m map[string]string, k string) string {
		if v, ok := m[k]; ok {
			return v
		}
		return "(none)"
	}
	for _, k := range keys {
		if b, a := show(before, k), show(after, k); b != a {
			out = append(out, fmt.Sprintf("%s%s: %s -> %s", what, k, b, a))
		}
	}
	return out
}

func summarize(diffs []string) string {
	if len(diffs) <= maxDifferences {
		return strings.Join(diffs, "; ")
	}
	return strings.Join(diffs[:maxDifferences], "; ") + fmt.Sprintf("; and %d more", len(diffs)-maxDifferences)
}

// DiffKubeletConfig compares a kubelet configuration file with the one kubeadm generates, field by
// field; a field set to its zero value (0, "", false, "0s", {} or []) counts as absent, since
// kubeadm writes some of those and omits others. It returns a short reason, empty when they match.
func DiffKubeletConfig(have, want []byte) string {
	return summarize(kubeletConfigDiffs(have, want, diffMaps))
}

// KubeletConfigChanges lists every field two kubelet configurations differ in, as DiffKubeletConfig
// compares them, as "field: old -> new".
func KubeletConfigChanges(before, after []byte) []string {
	return kubeletConfigDiffs(before, after, changeMaps)
}

func kubeletConfigDiffs(have, want []byte, diffMaps func(what string, have, want map[string]string) []string) []string {
	var h, w map[string]any
	if err := yaml.Unmarshal(have, &h); err != nil {
		return []string{"configuration unreadable: " + err.Error()}
	}
	if err := yaml.Unmarshal(want, &w); err != nil {
		return []string{"kubeadm's configuration unreadable: " + err.Error()}
	}
	hf, wf := map[string]string{}, map[string]string{}
	flatten("", h, hf)
	flatten("", w, wf)
	return diffMaps("", hf, wf)
}

// flatten writes every non-zero leaf of v into out, keyed by its dotted path; lists are leaves.
func flatten(prefix string, v any, out map[string]string) {
	switch t := v.(type) {
	case map[string]any:
		for k, sub := range t {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			flatten(p, sub, out)
		}
	case nil:
	case []any:
		if len(t) > 0 {
			b, _ := json.Marshal(t)
			out[prefix] = string(b)
		}
	default:
		s := fmt.Sprint(t)
		if s == "" || s == "0" || s == "false" || s == "0s" {
			return
		}
		out[prefix] = s
	}
}
