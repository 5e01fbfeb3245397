package realnode

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// InstallerTestImage is the stand-in installer a `pod` command runs on the node (cmd/installer-test).
// nodeops' own manager and agent images come from `make images` instead (layouts.go).
const InstallerTestImage = "localhost/nodeops/installer-test:realnode"

// ImageSpec is one single-binary image built from scratch.
type ImageSpec struct {
	Ref    string // full reference, e.g. registry.k8s.io/kube-apiserver:v1.36.3
	Binary string // the static binary on this machine
	Path   string // where it goes in the image; also the entrypoint
}

// kubeadmImageBinary maps an image's repository name, as `kubeadm config images list`
// prints it, to its binary. CoreDNS and kube-proxy are skipped: the node runs without both.
var kubeadmImageBinary = map[string]string{
	"kube-apiserver":          "kube-apiserver",
	"kube-controller-manager": "kube-controller-manager",
	"kube-scheduler":          "kube-scheduler",
	"etcd":                    "etcd",
	"pause":                   "pause",
}

// ImageSpecs turns kubeadm's image list for one version into specs: binaries come from kubeDir,
// pause from toolDir. Images kubeadm lists that the node does not run are left out.
func ImageSpecs(list []string, kubeDir, toolDir string) ([]ImageSpec, error) {
	var out []ImageSpec
	for _, ref := range list {
		ref = strings.TrimSpace(ref)
		if ref == "" {
			continue
		}
		repo := ref
		if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
			repo = repo[:i]
		}
		base := repo[strings.LastIndex(repo, "/")+1:]
		switch base {
		case "coredns", "kube-proxy":
			continue
		}
		bin, ok := kubeadmImageBinary[base]
		if !ok {
			return nil, fmt.Errorf("kubeadm lists image %s, which the real node does not know how to build", ref)
		}
		dir := kubeDir
		if bin == "pause" {
			dir = toolDir
		}
		path := "/usr/local/bin/" + bin
		if bin == "pause" {
			path = "/pause" // the container runtime's sandbox entrypoint
		}
		out = append(out, ImageSpec{Ref: ref, Binary: filepath.Join(dir, bin), Path: path})
	}
	return out, nil
}

// AllImageSpecs lists every image the node needs built here: both Kubernetes versions and the
// installer test image.
func AllImageSpecs(ctx context.Context, l Layout) ([]ImageSpec, error) {
	seen := map[string]bool{}
	var all []ImageSpec
	for _, v := range []string{FromVersion, ToVersion} {
		out, err := exec.CommandContext(ctx, filepath.Join(l.KubeDir(v), "kubeadm"), "config", "images", "list",
			"--kubernetes-version", v).Output()
		if err != nil {
			return nil, fmt.Errorf("kubeadm %s config images list: %w", v, err)
		}
		specs, err := ImageSpecs(strings.Split(string(out), "\n"), l.KubeDir(v), l.ToolOut())
		if err != nil {
			return nil, err
		}
		for _, s := range specs {
			if !seen[s.Ref] {
				seen[s.Ref] = true
				all = append(all, s)
			}
		}
	}
	all = append(all, ImageSpec{Ref: InstallerTestImage, Binary: filepath.Join(l.ToolOut(), "installer-test"), Path: "/installer-test"})
	return all, nil
}

// TarballName is the file an image is written to.
func TarballName(ref string) string {
	r := strings.NewReplacer("/", "_", ":", "_")
	return r.Replace(ref) + ".tar"
}

// BuildImages writes one tarball per image, rebuilding only those whose binary changed.
func BuildImages(ctx context.Context, l Layout) error {
	specs, err := AllImageSpecs(ctx, l)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(l.ImageOut(), 0o755); err != nil {
		return fmt.Errorf("image dir: %w", err)
	}
	for _, s := range specs {
		if err := checkImageBinary(ctx, s); err != nil {
			return err
		}
		sum, err := fileSHA256(s.Binary)
		if err != nil {
			return err
		}
		file := filepath.Join(l.ImageOut(), TarballName(s.Ref))
		stamp := file + ".stamp"
		want := sum + " " + s.Ref + " " + s.Path
		if have, _ := os.ReadFile(stamp); string(have) == want {
			if _, err := os.Stat(file); err == nil {
				continue
			}
		}
		start := time.Now()
		if err := WriteImage(s, file); err != nil {
			return err
		}
		if err := os.WriteFile(stamp, []byte(want), 0o644); err != nil {
			return fmt.Errorf("image stamp: %w", err)
		}
		Logf("image %s built in %s", s.Ref, time.Since(start).Round(100*time.Millisecond))
	}
	Logf("images up to date in %s", l.ImageOut())
	return nil
}

// checkImageBinary fails early when an etcd binary is not the version its tag names (kubeadm
// would then run, and later upgrade, an etcd other than the one it expects).
func checkImageBinary(ctx context.Context, s ImageSpec) error {
	if !strings.Contains(s.Ref, "/etcd:") {
		return nil
	}
	tag := s.Ref[strings.LastIndex(s.Ref, ":")+1:]
	want := strings.SplitN(tag, "-", 2)[0]
	out, err := exec.CommandContext(ctx, s.Binary, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %w", s.Binary, err)
	}
	if !strings.Contains(string(out), "etcd Version: "+want+"\n") {
		return fmt.Errorf("%s is not etcd %s (image %s): %s", s.Binary, want, s.Ref, strings.TrimSpace(string(out)))
	}
	return nil
}

// WriteImage builds a one-layer image holding the binary (plus /tmp) and writes it as a
// docker-archive tarball that `ctr images import` reads. The layer is left uncompressed: it
// only travels to the local containerd.
func WriteImage(s ImageSpec, file string) error {
	layerTar, err := binaryLayer(s.Binary, s.Path)
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, static.NewLayer(layerTar, types.DockerUncompressedLayer))
	if err != nil {
		return fmt.Errorf("image %s: %w", s.Ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image %s config: %w", s.Ref, err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config = v1.Config{
		Entrypoint: []string{s.Path},
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		WorkingDir: "/",
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return fmt.Errorf("image %s config: %w", s.Ref, err)
	}
	ref, err := name.ParseReference(s.Ref)
	if err != nil {
		return fmt.Errorf("image reference %s: %w", s.Ref, err)
	}
	tmp := file + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		return fmt.Errorf("write image %s: %w", s.Ref, err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return fmt.Errorf("write image %s: %w", s.Ref, err)
	}
	return nil
}

// binaryLayer is a tar of the binary at path (mode 0755, readable by any user: kubeadm's
// upgrade health check runs pause as uid 999), its parent directories and /tmp.
func binaryLayer(binary, path string) ([]byte, error) {
	f, err := os.Open(binary)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", binary, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", binary, err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(0, 0)
	dirs := []string{"tmp/"}
	for d := filepath.Dir(strings.TrimPrefix(path, "/")); d != "." && d != "/"; d = filepath.Dir(d) {
		dirs = append(dirs, d+"/")
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		mode := int64(0o755)
		if dirs[i] == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dirs[i], Mode: mode, ModTime: mtime}); err != nil {
			return nil, fmt.Errorf("layer: %w", err)
		}
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(path, "/"), Mode: 0o755, Size: st.Size(), ModTime: mtime}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	if _, err := io.Copy(tw, f); err != nil {
		return nil, fmt.Errorf("layer %s: %w", binary, err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return buf.Bytes(), nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
