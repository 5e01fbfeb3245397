package images

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// The real manager and agent, compiled for both platforms from this repository; the first run on
// an empty Go cache compiles everything for arm64 (minutes on 2 cores), later runs only link.
func TestMakeImagesTwiceGivesTheSameDigests(t *testing.T) {
	ctx := context.Background()
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	o, err := FromGit(ctx, Options{
		Repo: repo, Registry: "registry.invalid/nodeops", Source: "https://github.com/nodeops/nodeops",
		Images: Images(), Platforms: Platforms(), Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}

	// Two full builds, binaries compiled anew each time, into two directories.
	first, second := t.TempDir(), t.TempDir()
	bins, err := Compile(ctx, o, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	checkStampedVersion(t, o, bins)
	a, err := Write(o, bins, first)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(ctx, o, second)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 2 || len(b) != 2 {
		t.Fatalf("want the manager and the agent, got %d and %d images", len(a), len(b))
	}
	for i := range a {
		if a[i].Digest != b[i].Digest {
			t.Errorf("%s: first build %s, second build %s", a[i].Ref, a[i].Digest, b[i].Digest)
		}
		for _, f := range []string{"index.json", "oci-layout"} {
			x, _ := os.ReadFile(filepath.Join(first, a[i].Image.Name, f))
			y, _ := os.ReadFile(filepath.Join(second, a[i].Image.Name, f))
			if len(x) == 0 || !bytes.Equal(x, y) {
				t.Errorf("%s/%s differs between the builds or is empty:\n%s\n%s", a[i].Image.Name, f, x, y)
			}
		}
	}
	env, _ := os.ReadFile(filepath.Join(first, DigestsFile))
	for _, r := range a {
		if want := "NODEOPS_" + strings.ToUpper(r.Image.Name) + "_DIGEST=" + r.Digest.String() + "\n"; !strings.Contains(string(env), want) {
			t.Errorf("%s lacks %q:\n%s", DigestsFile, want, env)
		}
	}

	// The created time is in the digest: equal digests above are not equal by accident.
	later := o
	later.Created = o.Created.Add(time.Second)
	c, err := Write(later, bins, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if c[0].Digest == a[0].Digest {
		t.Errorf("a later created time gave the same digest %s", a[0].Digest)
	}

	for _, r := range a {
		t.Run(r.Image.Name, func(t *testing.T) { checkLayout(t, o, r, filepath.Join(first, r.Image.Name)) })
	}
	t.Run("kustomize", func(t *testing.T) { checkKustomize(t, a, first) })
	t.Run("helm", func(t *testing.T) { checkHelmValues(t, repo, a, first) })
}

// checkStampedVersion runs the binaries built for this machine's platform: each reports the
// version and revision its image is labelled with.
func checkStampedVersion(t *testing.T, o Options, bins Binaries) {
	here := bins[runtime.GOOS+"/"+runtime.GOARCH]
	if here == nil {
		t.Logf("no image binary runs on %s/%s; their versions are not checked", runtime.GOOS, runtime.GOARCH)
		return
	}
	want := o.Version + " (commit " + o.Revision[:12]
	for _, img := range o.Images {
		out, err := exec.Command(here[img.Name], "--version").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), want) {
			t.Errorf("%s --version printed %q (%v), want it to start with %q, as the image's labels say", img.Name, out, err, want)
		}
	}
}

// checkLayout reads the layout back with go-containerregistry and checks what a runtime would use.
func checkLayout(t *testing.T, o Options, r Result, dir string) {
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("read layout: %v", err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].Digest != r.Digest || tm.Manifests[0].Annotations[RefName] != o.Version {
		t.Fatalf("index.json should name one index %s tagged %s: %+v", r.Digest, o.Version, tm.Manifests)
	}
	idx, err := top.ImageIndex(r.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatalf("index does not match its blobs: %v", err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{LabelSource, LabelRevision, LabelVersion, LabelTitle} {
		if m.Annotations[k] == "" {
			t.Errorf("index has no %s", k)
		}
	}
	if rev := m.Annotations[LabelRevision]; !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(rev) {
		t.Errorf("revision %q is not a commit", rev)
	}
	if !maps.Equal(m.Annotations, o.Labels(r.Image)) {
		t.Errorf("index annotations %v, want %v", m.Annotations, o.Labels(r.Image))
	}
	machines := map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64": elf.EM_AARCH64}
	var platforms []string
	for _, d := range m.Manifests {
		p := d.Platform.String()
		platforms = append(platforms, p)
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.OS+"/"+cfg.Architecture != p {
			t.Errorf("%s: config says %s/%s", p, cfg.OS, cfg.Architecture)
		}
		if !cfg.Created.Equal(o.Created) {
			t.Errorf("%s: created %s, want %s", p, cfg.Created, o.Created)
		}
		if !maps.Equal(cfg.Config.Labels, o.Labels(r.Image)) {
			t.Errorf("%s: labels %v, want %v", p, cfg.Config.Labels, o.Labels(r.Image))
		}
		if len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != r.Image.Entrypoint || cfg.Config.User != r.Image.User {
			t.Errorf("%s: entrypoint %v user %q, want [%s] %q", p, cfg.Config.Entrypoint, cfg.Config.User, r.Image.Entrypoint, r.Image.User)
		}
		bin := fileInImage(t, img, strings.TrimPrefix(r.Image.Entrypoint, "/"))
		f, err := elf.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Fatalf("%s: %s is not an ELF binary: %v", p, r.Image.Entrypoint, err)
		}
		if f.Machine != machines[p] {
			t.Errorf("%s: %s is built for %s", p, r.Image.Entrypoint, f.Machine)
		}
		if f.FileHeader.Type != elf.ET_EXEC {
			t.Errorf("%s: %s is %s, want a static executable (CGO off)", p, r.Image.Entrypoint, f.FileHeader.Type)
		}
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				t.Errorf("%s: %s asks for a dynamic loader, which scratch lacks", p, r.Image.Entrypoint)
			}
		}
	}
	if strings.Join(platforms, ",") != "linux/amd64,linux/arm64" {
		t.Errorf("platforms %v, want linux/amd64 and linux/arm64", platforms)
	}
}

// fileInImage is the content of name in the image's filesystem.
func fileInImage(t *testing.T, img v1.Image, name string) []byte {
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("%s is not in the image", name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == name {
			if h.Mode&0o111 == 0 {
				t.Errorf("%s is not executable: mode %o", name, h.Mode)
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

// tool is one of the binaries `make tools` builds into bin/.
func tool(t *testing.T, name string) string {
	dir := os.Getenv("NODEOPS_BIN")
	if dir == "" {
		dir = "../../bin"
	}
	path, err := filepath.Abs(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s not built: run make tools (%v)", name, err)
	}
	return path
}

// checkKustomize renders the written kustomization: config/default with both images by digest.
func checkKustomize(t *testing.T, results []Result, dir string) {
	out, err := exec.Command(tool(t, "kubectl"), "kustomize", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, out)
	}
	for _, r := range results {
		if want := "image: " + r.DigestRef() + "\n"; !strings.Contains(string(out), want) {
			t.Errorf("rendered config/default lacks %q", want)
		}
	}
	for _, r := range results {
		if r.Image.Name == "agent" && !strings.Contains(string(out), "- --agent-image="+r.DigestRef()+"\n") {
			t.Errorf("rendered config/default does not pass the manager --agent-image=%s", r.DigestRef())
		}
	}
	if strings.Contains(string(out), "ghcr.io/nodeops/") {
		t.Errorf("rendered config/default still names a ghcr.io/nodeops image")
	}
}

// checkHelmValues renders the chart with the written values: both images by digest.
func checkHelmValues(t *testing.T, repo string, results []Result, dir string) {
	out, err := exec.Command(tool(t, "helm"), "template", "nodeops", filepath.Join(repo, "charts", "nodeops"),
		"-n", "nodeops-system", "-f", filepath.Join(dir, HelmValuesFile)).CombinedOutput()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	for _, r := range results {
		if want := "image: " + r.DigestRef() + "\n"; !strings.Contains(string(out), want) {
			t.Errorf("rendered chart lacks %q", want)
		}
	}
}

// A version that is no valid tag is refused before anything is compiled or written.
func TestBadReferenceIsRefused(t *testing.T) {
	out := filepath.Join(t.TempDir(), "images")
	o := Options{Repo: "../..", Registry: "registry.invalid/nodeops", Version: "bad tag!", Images: Images(), Platforms: Platforms()}
	_, err := Build(context.Background(), o, out)
	if err == nil || !strings.Contains(err.Error(), "must make a reference") {
		t.Fatalf("want a reference error, got %v", err)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s was created: %v", out, err)
	}
}
