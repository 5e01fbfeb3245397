package containerdtoml

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/pelletier/go-toml/v2"
)

// FuzzContainerdConfig: editing never panics; when it succeeds the result parses, holds the handler
// as asked (with an option and a pod annotation when given), a second edit changes nothing, and removing the handler again gives back the settings the
// file had without it.
func FuzzContainerdConfig(f *testing.F) {
	for _, name := range []string{"v2-default.toml", "v3-default.toml", "v2-minimal.toml"} {
		data, err := os.ReadFile(filepath.Join("testdata", "containerd", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, wasm.Name, wasm.RuntimeType, wasm.BinaryPath, "", "", "")
		f.Add(data, "runc", "io.containerd.runc.v2", "", "SystemdCgroup", "true", "io.kubernetes.cri.*")
	}
	f.Add([]byte("version = 3\n"), "spin", "io.containerd.spin.v2", "", "Weight", "2.5", "")
	f.Add([]byte("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.wasmedge]\nruntime_type = \"old\"\n"), "wasmedge", "io.containerd.wasmedge.v1", "/bin/x", "", "", "")
	f.Add([]byte("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.w]\nruntime_type = \"y\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.w.options]\nBinaryName = \"old\"\n"), "w", "y", "", "BinaryName", "/usr/bin/w", "")
	f.Add([]byte("version = 2\nplugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.w = { runtime_type = \"x\" }\n"), "w", "y", "", "", "", "")
	f.Fuzz(func(t *testing.T, data []byte, name, runtimeType, binaryPath, optKey, optValue, annotation string) {
		h := RuntimeHandler{Name: name, RuntimeType: runtimeType, BinaryPath: binaryPath}
		if optKey != "" {
			h.Options = OptionValues(map[string]string{optKey: optValue})
		}
		if annotation != "" {
			h.PodAnnotations = []string{annotation}
		}
		added, err := Edit(data, h, false, 0)
		// The API's strings are UTF-8 (JSON), and TOML has no other kind.
		if err != nil || name == "" || !allUTF8(name, runtimeType, binaryPath, optKey, optValue, annotation) {
			return
		}
		doc := parseTOML(t, "the added config", added.Data)
		base, _ := RuntimesPath(added.Version)
		entry := append(append([]string{}, base...), name)
		got, _ := Lookup(doc, entry).(map[string]any)
		if got == nil || !reflect.DeepEqual(got, h.settings()) {
			t.Fatalf("after adding, the handler is %v, want %v\n%s", got, h.settings(), added.Data)
		}
		again, err := Edit(added.Data, h, false, 0)
		if err != nil || again.Changed {
			t.Fatalf("adding twice changed the file again (err %v)", err)
		}
		removed, err := Edit(added.Data, h, true, 0)
		if err != nil {
			t.Fatalf("removing what was added: %v\n%s", err, added.Data)
		}
		after := parseTOML(t, "the config after removal", removed.Data)
		if Lookup(after, entry) != nil {
			t.Fatalf("the handler is still there after removal\n%s", removed.Data)
		}
		before := parseTOML(t, "the original config", data)
		deleteAt(before, entry)
		if !reflect.DeepEqual(Pruned(before), Pruned(after)) {
			t.Fatalf("add then remove did not give back the original settings:\n--- before\n%v\n--- after\n%v", Pruned(before), Pruned(after))
		}
	})
}

// allUTF8 checks each string alone: invalid halves may join into valid UTF-8.
func allUTF8(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

func parseTOML(t *testing.T, what string, data []byte) map[string]any {
	t.Helper()
	doc := map[string]any{}
	if err := toml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s does not parse: %v\n%s", what, err, data)
	}
	return doc
}
