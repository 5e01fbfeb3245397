package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func TestSubstituteSample(t *testing.T) {
	sample, err := os.ReadFile(filepath.Join("..", "..", sampleFile))
	if err != nil {
		t.Fatal(err)
	}
	digests := map[string]string{
		"containerd-shim-wasmedge-v1": strings.Repeat("a", 64),
		"containerd-shim-wasmtime-v1": strings.Repeat("b", 64),
		"containerd-shim-spin-v2":     strings.Repeat("c", 64),
	}
	const base = "http://127.0.0.1:4242/v0.x/"
	got, err := substituteSample(string(sample), base, digests)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(got, sampleBaseURL) || strings.Contains(got, strings.Repeat("0", 63)) {
		t.Errorf("placeholders left:\n%s", got)
	}
	var profile struct {
		Spec struct {
			Install []struct {
				InstallFile *struct {
					URL          string `json:"url"`
					SHA256       string `json:"sha256"`
					InsecureHTTP bool   `json:"insecureHTTP"`
				} `json:"installFile"`
			} `json:"install"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(got), &profile); err != nil {
		t.Fatalf("the substituted sample is no longer YAML: %v", err)
	}
	files := 0
	for _, c := range profile.Spec.Install {
		if c.InstallFile == nil {
			continue
		}
		files++
		name := strings.TrimPrefix(c.InstallFile.URL, base)
		if want, ok := digests[name]; !ok || c.InstallFile.SHA256 != want {
			t.Errorf("install %s: sha256 %s, want %s", c.InstallFile.URL, c.InstallFile.SHA256, want)
		}
		if !c.InstallFile.InsecureHTTP {
			t.Errorf("install %s over plain http without insecureHTTP: true: admission refuses it", c.InstallFile.URL)
		}
	}
	if files != len(sampleShims()) {
		t.Errorf("%d installFile commands, want %d", files, len(sampleShims()))
	}
}

func TestSubstituteSampleRefusesAChangedSample(t *testing.T) {
	digests := map[string]string{}
	for _, s := range sampleShims() {
		digests[s.name] = strings.Repeat("a", 64)
	}
	for name, sample := range map[string]string{
		"no placeholder URL":  "url: https://mirror.internal/x\n",
		"a digest is missing": "url: " + sampleBaseURL + "x\nsha256: " + sampleShims()[0].placeholder + "\n",
	} {
		if _, err := substituteSample(sample, "http://127.0.0.1:1/v0.x/", digests); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestWriteShims(t *testing.T) {
	dir := t.TempDir()
	digests, err := writeShims(dir, time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sampleShims() {
		got, err := fileSHA256(filepath.Join(dir, s.name))
		if err != nil {
			t.Fatal(err)
		}
		if got != digests[s.name] {
			t.Errorf("%s: file sha256 %s, reported %s", s.name, got, digests[s.name])
		}
		data, _ := os.ReadFile(filepath.Join(dir, s.name))
		if !strings.Contains(string(data), "placeholder") {
			t.Errorf("%s does not say it is a placeholder:\n%s", s.name, data)
		}
	}
}

func TestSummaryTable(t *testing.T) {
	results := []result{
		{name: "cluster  up", status: statusOK, took: 11430 * time.Millisecond},
		{name: "1  renew", status: statusFailed, took: 2 * time.Second, err: errors.New("cp-2 not renewed")},
		{name: "2  upgrade", status: statusNotRun},
		{name: "-  stop everything", status: statusOK, took: 1500 * time.Millisecond},
	}
	got := summaryTable(results, 75*time.Second+400*time.Millisecond, true)
	want := `STEP                RESULT   TOOK
cluster  up         ok       11.4s
1  renew            FAILED   2s
2  upgrade          not run  -
-  stop everything  ok       1.5s
total                        1m15s

1  renew: cp-2 not renewed

demo: FAILED
`
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if ok := summaryTable(results[:1], time.Second, false); !strings.HasSuffix(ok, "demo: every step succeeded\n") {
		t.Errorf("success summary:\n%s", ok)
	}
}

func TestShellJoin(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"kubectl", "nodeops", "watch", "x"}, "kubectl nodeops watch x"},
		{[]string{"kubectl", "get", "-o", "jsonpath={.a}"}, "kubectl get -o 'jsonpath={.a}'"},
		{[]string{"echo", "it's"}, `echo 'it'\''s'`},
		{[]string{"echo", ""}, "echo ''"},
	} {
		if got := shellJoin(tc.args); got != tc.want {
			t.Errorf("shellJoin(%q) = %s, want %s", tc.args, got, tc.want)
		}
	}
}
