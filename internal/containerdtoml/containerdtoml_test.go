package containerdtoml

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

var update = flag.Bool("update", false, "rewrite golden files")

var wasm = RuntimeHandler{Name: "wasmedge", RuntimeType: "io.containerd.wasmedge.v1", BinaryPath: "/opt/kwasm/bin/containerd-shim-wasmedge-v1"}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", "containerd", name)
	if *update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("%s differs from the golden file:\n--- got\n%s", name, got)
	}
}

func TestContainerdConfigGolden(t *testing.T) {
	for _, tc := range []struct {
		file    string
		version int64
	}{
		{"v2-default.toml", 2}, {"v3-default.toml", 3}, {"v2-minimal.toml", 2},
	} {
		t.Run(tc.file, func(t *testing.T) {
			orig, err := os.ReadFile(filepath.Join("testdata", "containerd", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			added, err := Edit(orig, wasm, false, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !added.Changed || added.Rewritten || added.Version != tc.version {
				t.Fatalf("add: changed=%v rewritten=%v version=%d", added.Changed, added.Rewritten, added.Version)
			}
			golden(t, tc.file+".add.golden", added.Data)

			// The handler is where containerd reads it.
			doc := map[string]any{}
			if err := toml.Unmarshal(added.Data, &doc); err != nil {
				t.Fatal(err)
			}
			base, _ := RuntimesPath(tc.version)
			h, _ := Lookup(doc, append(base, "wasmedge")).(map[string]any)
			if h["runtime_type"] != wasm.RuntimeType || h["runtime_path"] != wasm.BinaryPath {
				t.Errorf("handler = %v", h)
			}

			again, err := Edit(added.Data, wasm, false, 0)
			if err != nil || again.Changed || string(again.Data) != string(added.Data) {
				t.Errorf("adding twice changed the file (changed=%v, err=%v)", again.Changed, err)
			}

			changedType := wasm
			changedType.RuntimeType = "io.containerd.wasmedge.v2"
			replaced, err := Edit(added.Data, changedType, false, 0)
			if err != nil || !replaced.Changed || replaced.Rewritten {
				t.Fatalf("replace: changed=%v rewritten=%v err=%v", replaced.Changed, replaced.Rewritten, err)
			}
			golden(t, tc.file+".replace.golden", replaced.Data)

			removed, err := Edit(added.Data, wasm, true, 0)
			if err != nil || !removed.Changed || removed.Rewritten {
				t.Fatalf("remove: changed=%v rewritten=%v err=%v", removed.Changed, removed.Rewritten, err)
			}
			if string(removed.Data) != string(orig) {
				t.Errorf("add then remove did not give back the original file:\n%s", removed.Data)
			}
			removedAgain, err := Edit(removed.Data, wasm, true, 0)
			if err != nil || removedAgain.Changed {
				t.Errorf("removing twice changed the file (changed=%v, err=%v)", removedAgain.Changed, err)
			}
		})
	}
}

func TestContainerdConfigEdgeCases(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		remove    bool
		want      string
		rewritten bool
		err       bool
	}{
		{
			name: "no runtimes yet: appended at the end",
			in:   "version = 3\nroot = '/var/lib/containerd'\n",
			want: "version = 3\nroot = '/var/lib/containerd'\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.wasmedge]\nruntime_type = \"io.containerd.wasmedge.v1\"\nruntime_path = \"/opt/kwasm/bin/containerd-shim-wasmedge-v1\"\n",
		},
		{
			name: "no trailing newline",
			in:   "version = 2",
			want: "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.wasmedge]\nruntime_type = \"io.containerd.wasmedge.v1\"\nruntime_path = \"/opt/kwasm/bin/containerd-shim-wasmedge-v1\"\n",
		},
		{
			name:      "inline table: re-encoded, settings kept",
			in:        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nruntimes = { runc = { runtime_type = \"io.containerd.runc.v2\" } }\n",
			rewritten: true,
		},
		{
			name:   "remove what is not there",
			in:     "version = 2\n",
			remove: true,
			want:   "version = 2\n",
		},
		{name: "version 1 refused", in: "[plugins.cri]\n", err: true},
		{name: "broken TOML refused", in: "version = = 2\n", err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Edit([]byte(tt.in), wasm, tt.remove, 0)
			if tt.err {
				if err == nil {
					t.Fatalf("want an error, got %s", got.Data)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Rewritten != tt.rewritten {
				t.Errorf("rewritten = %v", got.Rewritten)
			}
			if tt.want != "" && string(got.Data) != tt.want {
				t.Errorf("got\n%s\nwant\n%s", got.Data, tt.want)
			}
			if tt.rewritten {
				doc := map[string]any{}
				if err := toml.Unmarshal(got.Data, &doc); err != nil {
					t.Fatal(err)
				}
				if Lookup(doc, []string{"plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes", "runc", "runtime_type"}) != "io.containerd.runc.v2" ||
					Lookup(doc, []string{"plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes", "wasmedge", "runtime_type"}) != wasm.RuntimeType {
					t.Errorf("re-encoded config lost settings:\n%s", got.Data)
				}
			}
		})
	}
}
