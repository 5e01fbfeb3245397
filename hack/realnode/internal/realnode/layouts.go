package realnode

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	images "github.com/nodeops/nodeops/hack/images"
)

// NodeopsImage is one image `make images` built (hack/images): an OCI layout holding a multi-arch
// index, and the repository and index digest its digests.env names.
type NodeopsImage struct {
	Name       string // manager, agent: the layout's directory in the images directory
	Repository string // e.g. ghcr.io/nodeops/manager
	Digest     string // the index's digest, sha256:...
}

// Ref is the image by digest, as the chart names it when image.<name>.digest is set.
func (i NodeopsImage) Ref() string { return i.Repository + "@" + i.Digest }

// ParseDigests reads `make images`' digests.env: for each image NODEOPS_<NAME>_IMAGE=repository@digest
// and NODEOPS_<NAME>_DIGEST=digest, which must agree.
func ParseDigests(content string) ([]NodeopsImage, error) {
	env, err := ParseEnvFile(content)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", images.DigestsFile, err)
	}
	var out []NodeopsImage
	for _, img := range images.Images() {
		key := "NODEOPS_" + strings.ToUpper(img.Name)
		ref, digest := env[key+"_IMAGE"], env[key+"_DIGEST"]
		if ref == "" || digest == "" {
			return nil, fmt.Errorf("%s names no %s image (%s_IMAGE and %s_DIGEST)", images.DigestsFile, img.Name, key, key)
		}
		repo, refDigest, ok := strings.Cut(ref, "@")
		if !ok || repo == "" || refDigest != digest {
			return nil, fmt.Errorf("%s: %s_IMAGE=%s is not the repository @ %s_DIGEST=%s", images.DigestsFile, key, ref, key, digest)
		}
		if _, err := v1.NewHash(digest); err != nil {
			return nil, fmt.Errorf("%s: %s_DIGEST: %w", images.DigestsFile, key, err)
		}
		out = append(out, NodeopsImage{Name: img.Name, Repository: repo, Digest: digest})
	}
	return out, nil
}

// ReadNodeopsImages reads the images directory's digests.env and checks that each image's layout
// there holds the index it names, so what is imported is what the chart will ask for.
func ReadNodeopsImages(dir string) ([]NodeopsImage, error) {
	data, err := os.ReadFile(filepath.Join(dir, images.DigestsFile))
	if err != nil {
		return nil, fmt.Errorf("nodeops' images: %w (run `make images`, or pass --images with its output)", err)
	}
	imgs, err := ParseDigests(string(data))
	if err != nil {
		return nil, err
	}
	for _, img := range imgs {
		f, err := os.Open(filepath.Join(dir, img.Name, "index.json"))
		if err != nil {
			return nil, fmt.Errorf("layout of %s: %w", img.Name, err)
		}
		m, err := v1.ParseIndexManifest(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("layout of %s: %w", img.Name, err)
		}
		if len(m.Manifests) != 1 || m.Manifests[0].Digest.String() != img.Digest {
			return nil, fmt.Errorf("layout %s does not hold the one index %s names (%s): run `make images` again",
				filepath.Join(dir, img.Name), images.DigestsFile, img.Digest)
		}
	}
	return imgs, nil
}

// TarDir writes the directory as a tar stream, entries named relative to it in lexical order:
// an OCI layout as the oci-archive `ctr images import` reads.
func TarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() && !info.IsDir() {
			return fmt.Errorf("%s is neither a file nor a directory", path)
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return fmt.Errorf("tar %s: %w", dir, err)
	}
	return tw.Close()
}

// ImportArgs are ctr's arguments to import one layout, streamed on stdin, into the CRI's namespace:
// every platform's content (the multi-arch index is kept as the image's target) under the
// repository's name, by tag and by the index's digest (--digests), the name the chart asks for.
func ImportArgs(img NodeopsImage) []string {
	return []string{"--address", ContainerdSock, "-n", "k8s.io", "images", "import", "--local",
		"--all-platforms", "--digests", "--base-name", img.Repository, "-"}
}

// importLayouts imports each layout `make images` wrote and checks that containerd names it by digest.
func importLayouts(ctx context.Context, dir string, imgs []NodeopsImage) error {
	start := time.Now()
	ctr := filepath.Join(RuntimeBinDir, "ctr")
	for _, img := range imgs {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(TarDir(pw, filepath.Join(dir, img.Name))) }()
		err := runIn(ctx, io.Discard, pr, ctr, ImportArgs(img)...)
		pr.Close() // a ctr that failed early stops the tar writer
		if err != nil {
			return fmt.Errorf("import the %s layout: %w", img.Name, err)
		}
	}
	var names bytes.Buffer
	if err := run(ctx, &names, ctr, "--address", ContainerdSock, "-n", "k8s.io", "images", "ls", "-q"); err != nil {
		return err
	}
	have := map[string]bool{}
	for _, n := range strings.Fields(names.String()) {
		have[n] = true
	}
	var refs []string
	for _, img := range imgs {
		if !have[img.Ref()] {
			return fmt.Errorf("containerd has no image %s after importing %s", img.Ref(), filepath.Join(dir, img.Name))
		}
		refs = append(refs, img.Ref())
	}
	Logf("imported make images' layouts (every platform, by digest) in %s: %s", time.Since(start).Round(100*time.Millisecond), strings.Join(refs, ", "))
	return nil
}
