// Package images builds nodeops' container images without a container daemon: it cross-compiles
// the manager and the agent, puts each binary alone on scratch, and writes one OCI image layout per
// image holding an index of every platform. The same source, toolchain and created time give the
// same digests, so a digest names what was built (docs/operations/install.md, "Images").
//
// It is its own module so that the main go.mod does not carry go-containerregistry, which no
// nodeops binary links; hack/realnode (also its own module) can require it with a replace.
package images

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The OCI annotation and label keys the images carry (image-spec annotations.md).
const (
	LabelSource   = "org.opencontainers.image.source"
	LabelRevision = "org.opencontainers.image.revision"
	LabelVersion  = "org.opencontainers.image.version"
	LabelTitle    = "org.opencontainers.image.title"
	LabelCreated  = "org.opencontainers.image.created"
	// RefName names the index in a layout's index.json; containerd's import reads its own key.
	RefName           = "org.opencontainers.image.ref.name"
	containerdRefName = "io.containerd.image.name"
)

// Image is one nodeops image: a single static binary on scratch.
type Image struct {
	Name       string // the layout's directory and the repository's last element: manager, agent
	Package    string // the main package, relative to the repository root
	Entrypoint string // where the binary goes; config/manager and config/agent run it by this path
	User       string // uid:gid the process runs as
}

// Images are the images `make images` builds. The manager runs as the non-root user its Deployment
// names (runAsUser 65532 in config/manager/manager.yaml); the agent runs as root, privileged,
// because it works on the node's own root (docs/design.md, "How commands reach a host").
func Images() []Image {
	return []Image{
		{Name: "manager", Package: "./cmd/manager", Entrypoint: "/manager", User: "65532:65532"},
		{Name: "agent", Package: "./cmd/agent", Entrypoint: "/agent", User: "0:0"},
	}
}

// Platforms are the platforms every index holds.
func Platforms() []v1.Platform {
	return []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}}
}

// Options say what to build and how to stamp it.
type Options struct {
	Repo      string // the nodeops repository root (the main module)
	Registry  string // repository prefix the images are named under, e.g. ghcr.io/nodeops
	Source    string // org.opencontainers.image.source
	Revision  string // org.opencontainers.image.revision: the commit
	Version   string // org.opencontainers.image.version, also the tag in the layouts' ref names
	Created   time.Time
	Images    []Image
	Platforms []v1.Platform
	Logf      func(format string, args ...any)
}

func (o Options) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}

// Ref is an image's reference by tag under the options' registry.
func (o Options) Ref(img Image) string {
	return o.Registry + "/" + img.Name + ":" + o.Version
}

// versionPackage is where nodeops' binaries keep their version (internal/version, of the main
// module, which this module cannot import).
const versionPackage = "github.com/nodeops/nodeops/internal/version"

func (o Options) versionLDFlags() string {
	return fmt.Sprintf("-X %s.version=%s -X %s.revision=%s", versionPackage, o.Version, versionPackage, o.Revision)
}

// Labels are the OCI labels of every image, on each config and as annotations on each manifest and index.
func (o Options) Labels(img Image) map[string]string {
	return map[string]string{
		LabelSource:   o.Source,
		LabelRevision: o.Revision,
		LabelVersion:  o.Version,
		LabelTitle:    "nodeops-" + img.Name,
		LabelCreated:  o.Created.UTC().Format(time.RFC3339),
	}
}

// Binaries maps a platform ("linux/arm64") and an image name to the compiled binary.
type Binaries map[string]map[string]string

// Compile cross-compiles every image's binary for every platform into dir, one go build per
// platform. CGO is off, so each binary is static and runs on scratch; -trimpath and no VCS stamp
// keep the output independent of where the repository is checked out and of its git state. The
// version and revision the images are labelled with are stamped into the binaries as `make build`
// stamps them, so the image label, `manager --version` and nodeops_build_info agree.
func Compile(ctx context.Context, o Options, dir string) (Binaries, error) {
	bins := Binaries{}
	for _, p := range o.Platforms {
		out := filepath.Join(dir, p.OS+"-"+p.Architecture)
		if err := os.MkdirAll(out, 0o755); err != nil {
			return nil, fmt.Errorf("binary dir: %w", err)
		}
		args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w " + o.versionLDFlags(), "-o", out + "/"}
		names := make([]string, 0, len(o.Images))
		for _, img := range o.Images {
			args = append(args, img.Package)
			names = append(names, img.Name)
		}
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = o.Repo
		// GOAMD64/GOARM64 pinned to the baseline: a builder's own setting would change the binary.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture,
			"GOAMD64=v1", "GOARM64=v8.0", "GOFLAGS=-mod=readonly")
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		o.logf("images: compiling %s for %s", strings.Join(names, ", "), p)
		start := time.Now()
		if err := runWithProgress(cmd, func(d time.Duration) {
			o.logf("images: still compiling for %s (%s)", p, d.Round(time.Second))
		}); err != nil {
			return nil, fmt.Errorf("go build for %s: %w\n%s", p, err, stderr.String())
		}
		o.logf("images: compiled for %s in %s", p, time.Since(start).Round(100*time.Millisecond))
		bins[p.String()] = map[string]string{}
		for _, img := range o.Images {
			bins[p.String()][img.Name] = filepath.Join(out, filepath.Base(img.Package))
		}
	}
	return bins, nil
}

// runWithProgress runs cmd, calling progress every 30 s while it runs.
func runWithProgress(cmd *exec.Cmd, progress func(time.Duration)) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	start := time.Now()
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			progress(time.Since(start))
		}
	}
}

// Assemble builds each image's index from the compiled binaries, in the order of o.Images.
func Assemble(o Options, bins Binaries) ([]v1.ImageIndex, error) {
	var out []v1.ImageIndex
	for _, img := range o.Images {
		idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
		for _, p := range o.Platforms {
			bin := bins[p.String()][img.Name]
			if bin == "" {
				return nil, fmt.Errorf("no %s binary for %s", img.Name, p)
			}
			im, err := platformImage(o, img, p, bin)
			if err != nil {
				return nil, fmt.Errorf("image %s for %s: %w", img.Name, p, err)
			}
			idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
				Add:        im,
				Descriptor: v1.Descriptor{Platform: &p},
			})
		}
		out = append(out, mutate.Annotations(idx, o.Labels(img)).(v1.ImageIndex))
	}
	return out, nil
}

// platformImage is the binary on scratch for one platform, with a fixed created time.
func platformImage(o Options, img Image, p v1.Platform, bin string) (v1.Image, error) {
	content, err := rootfs(img, bin, o.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(content)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	created := v1.Time{Time: o.Created.UTC()}
	im, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: created, CreatedBy: "nodeops hack/images: " + img.Package + " on scratch"},
	})
	if err != nil {
		return nil, err
	}
	cfg, err := im.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Created = created
	cfg.OS, cfg.Architecture, cfg.Variant = p.OS, p.Architecture, p.Variant
	cfg.Config = v1.Config{
		Entrypoint: []string{img.Entrypoint},
		User:       img.User,
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		WorkingDir: "/",
		Labels:     o.Labels(img),
	}
	im, err = mutate.ConfigFile(im, cfg)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(im, o.Labels(img)).(v1.Image), nil
}

// rootfs is the image's one layer: /tmp, an /etc/passwd and /etc/group naming the user (so tools
// that look the uid up find it), and the binary at its entrypoint, every entry stamped with created.
func rootfs(img Image, bin string, created time.Time) ([]byte, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", bin, err)
	}
	uid, gid, _ := strings.Cut(img.User, ":")
	user := "nonroot"
	if uid == "0" {
		user = "root"
	}
	files := []struct {
		name string
		mode int64
		data []byte
		dir  bool
	}{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: fmt.Appendf(nil, "%s:x:%s:\n", user, gid)},
		{name: "etc/passwd", mode: 0o644, data: fmt.Appendf(nil, "%s:x:%s:%s:%s:/:/sbin/nologin\n", user, uid, gid, user)},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: strings.TrimPrefix(img.Entrypoint, "/"), mode: 0o755, data: data},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		hdr := &tar.Header{Name: f.name, Mode: f.mode, ModTime: created, Format: tar.FormatPAX}
		if f.dir {
			hdr.Typeflag = tar.TypeDir
		} else {
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("layer %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("layer %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteLayout replaces dir with an OCI image layout whose index.json points at idx, named ref.
func WriteLayout(dir, ref string, idx v1.ImageIndex) error {
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("layout %s: %w", tmp, err)
	}
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return fmt.Errorf("layout %s: %w", tmp, err)
	}
	tag := ref[strings.LastIndex(ref, ":")+1:]
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{RefName: tag, containerdRefName: ref})); err != nil {
		return fmt.Errorf("layout %s: %w", tmp, err)
	}
	// go-containerregistry writes some blobs 0600; a layout is for reading by anyone.
	if err := filepath.WalkDir(tmp, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return os.Chmod(path, 0o644)
	}); err != nil {
		return fmt.Errorf("layout %s: %w", tmp, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("layout %s: %w", dir, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("layout %s: %w", dir, err)
	}
	return nil
}
