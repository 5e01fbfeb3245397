package main

import (
	"os"
	"regexp"
	"testing"
)

// TestSafetyRule6_ManagerPodsKnowTheirOwnName: every way the manager is deployed tells it its pod's
// name and namespace (--pod-name and --pod-namespace defaults), so the drains it makes for the agents
// leave it: on a one-node cluster its replacement could not schedule on the cordoned node.
func TestSafetyRule6_ManagerPodsKnowTheirOwnName(t *testing.T) {
	want := map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
	for _, file := range []string{"../../config/manager/manager.yaml", "../../charts/nodeops/templates/manager-deployment.yaml"} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for name, path := range want {
			re := regexp.MustCompile(`- name: ` + name + `\s+valueFrom:\s+fieldRef:\s+fieldPath: ` + regexp.QuoteMeta(path))
			if !re.Match(data) {
				t.Errorf("%s does not set %s from %s", file, name, path)
			}
		}
	}
}
