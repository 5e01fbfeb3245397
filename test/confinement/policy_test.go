package confinement

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/nodeops/nodeops/config"
)

// TestNodeRuleNamesEveryNodeSpecField: the agent may change only spec.unschedulable, and the policy
// says so field by field (CEL cannot remove one field from a typed object); a field Kubernetes adds
// to NodeSpec must be added to the rule, or the agent could change it.
func TestNodeRuleNamesEveryNodeSpecField(t *testing.T) {
	data, err := config.Admission.ReadFile("admission/agent-confinement.yaml")
	if err != nil {
		t.Fatal(err)
	}
	policy := string(data)
	typ := reflect.TypeFor[corev1.NodeSpec]()
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if name == "unschedulable" {
			continue
		}
		ref := fmt.Sprintf("object.spec.%s == oldObject.spec.%s", name, name)
		if !strings.Contains(policy, ref) {
			t.Errorf("config/admission/agent-confinement.yaml does not compare spec.%s of a Node (%q)", name, ref)
		}
	}
}

// TestAdmissionKustomizationListsEveryPolicy: config/admission's kustomization (a real install),
// its files and what package config embeds (the tests) are the same set.
func TestAdmissionKustomizationListsEveryPolicy(t *testing.T) {
	dir := filepath.Join("..", "..", "config", "admission")
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	k := struct {
		Resources []string `json:"resources"`
	}{}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	var onDisk []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			onDisk = append(onDisk, b)
		}
	}
	embedded, _ := fs.Glob(config.Admission, "admission/*.yaml")
	for i := range embedded {
		embedded[i] = path.Base(embedded[i])
	}
	slices.Sort(k.Resources)
	if !slices.Equal(k.Resources, onDisk) || !slices.Equal(embedded, onDisk) {
		t.Errorf("config/admission has %v, its kustomization lists %v, package config embeds %v", onDisk, k.Resources, embedded)
	}
}
