// Package kubeadmconfig patches the configuration kubeadm keeps in kube-system (the ClusterConfiguration
// in kubeadm-config, the KubeletConfiguration in kubelet-config) with a reconfigure's patches: pure
// text in, text out, so the agent that writes them and the ClusterTarget that asks whether they already
// hold a patch agree on what "patched" means.
package kubeadmconfig

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// APIVersion is the only ClusterConfiguration version a reconfigure changes (kubeadm v1.31 and later).
const APIVersion = "kubeadm.k8s.io/v1beta4"

// PatchClusterConfiguration applies p to a ClusterConfiguration in kubeadm's v1beta4 YAML. It
// returns the text as it was when the patch changes nothing, so that patching twice is patching once.
func PatchClusterConfiguration(text string, p *v1alpha1.ClusterConfigurationPatch) (string, error) {
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		return "", fmt.Errorf("ClusterConfiguration unreadable: %w", err)
	}
	if v := doc["apiVersion"]; v != APIVersion {
		return "", fmt.Errorf("ClusterConfiguration is %v: only %s (kubeadm v1.31 and later) can be reconfigured", v, APIVersion)
	}
	if k := doc["kind"]; k != "ClusterConfiguration" {
		return "", fmt.Errorf("kind %v, want ClusterConfiguration", k)
	}
	before, err := json.Marshal(doc)
	if err != nil {
		return "", err
	}
	if p.APIServer != nil {
		patchComponent(section(doc, "apiServer"), &p.APIServer.ControlPlaneComponentPatch)
		if len(p.APIServer.CertSANs) > 0 {
			s := section(doc, "apiServer")
			sans, _ := s["certSANs"].([]any)
			for _, san := range p.APIServer.CertSANs {
				if !slices.Contains(sans, any(san)) {
					sans = append(sans, san)
				}
			}
			s["certSANs"] = sans
		}
	}
	if p.ControllerManager != nil {
		patchComponent(section(doc, "controllerManager"), p.ControllerManager)
	}
	if p.Scheduler != nil {
		patchComponent(section(doc, "scheduler"), p.Scheduler)
	}
	if p.Etcd != nil {
		if _, external := section(doc, "etcd")["external"]; external {
			return "", fmt.Errorf("clusterConfiguration.etcd patches a local (stacked) etcd's flags, and this cluster's etcd is external (etcd.external): a reconfigure does not change an external etcd")
		}
		local := section(section(doc, "etcd"), "local")
		local["extraArgs"] = patchArgs(local["extraArgs"], p.Etcd.ExtraArgs, p.Etcd.RemoveExtraArgs)
	}
	if len(p.FeatureGates) > 0 {
		gates := section(doc, "featureGates")
		for _, name := range slices.Sorted(maps.Keys(p.FeatureGates)) {
			gates[name] = p.FeatureGates[name]
		}
	}
	after, err := json.Marshal(doc)
	if err != nil {
		return "", err
	}
	if bytes.Equal(before, after) {
		return text, nil
	}
	out, err := yaml.JSONToYAML(after)
	if err != nil {
		return "", err
	}
	return string(out), nil
}

// section is doc[key] as a map, made when missing.
func section(doc map[string]any, key string) map[string]any {
	s, ok := doc[key].(map[string]any)
	if !ok {
		s = map[string]any{}
		doc[key] = s
	}
	return s
}

func patchComponent(s map[string]any, p *v1alpha1.ControlPlaneComponentPatch) {
	if len(p.ExtraArgs) > 0 || len(p.RemoveExtraArgs) > 0 {
		s["extraArgs"] = patchArgs(s["extraArgs"], p.ExtraArgs, p.RemoveExtraArgs)
	}
	if len(p.ExtraVolumes) == 0 {
		return
	}
	vols, _ := s["extraVolumes"].([]any)
	for _, v := range p.ExtraVolumes {
		m := map[string]any{"name": v.Name, "hostPath": v.HostPath, "mountPath": v.MountPath}
		if v.ReadOnly {
			m["readOnly"] = true
		}
		if v.PathType != "" {
			m["pathType"] = string(v.PathType)
		}
		i := slices.IndexFunc(vols, func(o any) bool { om, _ := o.(map[string]any); return om["name"] == v.Name })
		if i >= 0 {
			vols[i] = m
		} else {
			vols = append(vols, m)
		}
	}
	s["extraVolumes"] = vols
}

// patchArgs sets each flag of set by name (every entry of that name replaced by one, in the first's
// place) and drops those named in remove: kubeadm v1beta4's extraArgs are a list of {name, value}.
func patchArgs(existing any, set []v1alpha1.ExtraArg, remove []string) []any {
	args, _ := existing.([]any)
	name := func(a any) string { m, _ := a.(map[string]any); n, _ := m["name"].(string); return n }
	for _, a := range set {
		entry := map[string]any{"name": a.Name, "value": a.Value}
		i := slices.IndexFunc(args, func(o any) bool { return name(o) == a.Name })
		if i < 0 {
			args = append(args, entry)
			continue
		}
		args[i] = entry
		args = slices.Concat(args[:i+1], slices.DeleteFunc(slices.Clone(args[i+1:]), func(o any) bool { return name(o) == a.Name }))
	}
	args = slices.DeleteFunc(args, func(o any) bool { return slices.Contains(remove, name(o)) })
	if args == nil {
		args = []any{}
	}
	return args
}

// PatchKubeletConfiguration applies a JSON merge patch to a KubeletConfiguration in YAML; the text is
// returned as it was when the patch changes nothing.
func PatchKubeletConfiguration(text, patch string) (string, error) {
	doc, err := yaml.YAMLToJSON([]byte(text))
	if err != nil {
		return "", fmt.Errorf("KubeletConfiguration unreadable: %w", err)
	}
	parsed, err := v1alpha1.KubeletPatch(patch)
	if err != nil {
		return "", err
	}
	p, err := json.Marshal(parsed)
	if err != nil {
		return "", err
	}
	merged, err := jsonpatch.MergePatch(doc, p)
	if err != nil {
		return "", fmt.Errorf("applying the kubelet patch: %w", err)
	}
	var a, b any
	if err := json.Unmarshal(doc, &a); err != nil {
		return "", err
	}
	if err := json.Unmarshal(merged, &b); err != nil {
		return "", err
	}
	if reflect.DeepEqual(a, b) {
		return text, nil
	}
	out, err := yaml.JSONToYAML(merged)
	if err != nil {
		return "", err
	}
	return string(out), nil
}

// LineDiff shows the lines of b not in a (+) and of a not in b (-), in order, by a longest common
// subsequence: enough for a configuration of a few hundred lines.
func LineDiff(a, b string) string {
	x, y := strings.Split(strings.TrimSuffix(a, "\n"), "\n"), strings.Split(strings.TrimSuffix(b, "\n"), "\n")
	lcs := make([][]int, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out strings.Builder
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			i, j = i+1, j+1
		case j < len(y) && (i == len(x) || lcs[i][j+1] >= lcs[i+1][j]):
			fmt.Fprintf(&out, "+ %s\n", y[j])
			j++
		default:
			fmt.Fprintf(&out, "- %s\n", x[i])
			i++
		}
	}
	return out.String()
}
