package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// plugin is the part of krew's Plugin (krew.googlecontainertools.github.com/v1alpha2) checked here.
type plugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string `json:"version"`
		Homepage         string `json:"homepage"`
		ShortDescription string `json:"shortDescription"`
		Description      string `json:"description"`
		Platforms        []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Bin    string `json:"bin"`
			Files  []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
		} `json:"platforms"`
	} `json:"spec"`
}

func TestKrewManifest(t *testing.T) {
	t.Parallel()
	timed(t)
	data, err := os.ReadFile(filepath.Join(repoRoot, "plugins", "nodeops.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var p plugin
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		t.Fatalf("plugins/nodeops.yaml: %v", err)
	}
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" || p.Metadata.Name != "nodeops" {
		t.Errorf("apiVersion %q kind %q name %q", p.APIVersion, p.Kind, p.Metadata.Name)
	}
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+`).MatchString(p.Spec.Version) || p.Spec.ShortDescription == "" || p.Spec.Homepage == "" {
		t.Errorf("version %q, shortDescription %q, homepage %q", p.Spec.Version, p.Spec.ShortDescription, p.Spec.Homepage)
	}
	// The binary krew installs is the one `go build ./cmd/...` names kubectl-nodeops.
	if _, err := os.Stat(filepath.Join(repoRoot, "cmd", "kubectl-nodeops")); err != nil {
		t.Errorf("cmd/kubectl-nodeops: %v", err)
	}
	seen := map[string]bool{}
	hex := regexp.MustCompile(`^[0-9a-f]{64}$`)
	for _, pl := range p.Spec.Platforms {
		goos, arch := pl.Selector.MatchLabels["os"], pl.Selector.MatchLabels["arch"]
		seen[goos+"/"+arch] = true
		if pl.Bin != "kubectl-nodeops" {
			t.Errorf("%s/%s: bin %q, want kubectl-nodeops", goos, arch, pl.Bin)
		}
		asset := "kubectl-nodeops_" + p.Spec.Version + "_" + goos + "_" + arch + ".tar.gz"
		if want := "https://github.com/nodeops/nodeops/releases/download/" + p.Spec.Version + "/" + asset; pl.URI != want {
			t.Errorf("%s/%s: uri %q, want the release asset %q", goos, arch, pl.URI, want)
		}
		if !hex.MatchString(pl.SHA256) {
			t.Errorf("%s/%s: sha256 %q is not 64 hex digits", goos, arch, pl.SHA256)
		}
		if len(pl.Files) == 0 || pl.Files[0].From != "kubectl-nodeops" {
			t.Errorf("%s/%s: files %+v do not take kubectl-nodeops from the archive", goos, arch, pl.Files)
		}
	}
	for _, want := range []string{"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64"} {
		if !seen[want] {
			t.Errorf("no platform %s", want)
		}
	}
	// The all-zero digests are placeholders and say so, so nobody mistakes them for real ones.
	if strings.Count(string(data), "PLACEHOLDER") < len(p.Spec.Platforms) {
		t.Errorf("every placeholder sha256 must be marked PLACEHOLDER")
	}
}
