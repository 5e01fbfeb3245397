package images

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The files Write leaves beside the layouts, for the chart and kustomize.
const (
	DigestsFile       = "digests.env"        // shell/make-readable NAME=VALUE lines
	HelmValuesFile    = "values.yaml"        // helm install -f
	KustomizationFile = "kustomization.yaml" // kubectl apply -k: config/default with the digests
)

// configRegistry is the registry config/manager and config/agent name their images under, which
// the kustomization's images transformer matches.
const configRegistry = "ghcr.io/nodeops"

// Result is one written image: its index digest and each platform's manifest digest.
type Result struct {
	Image     Image
	Ref       string
	Digest    v1.Hash
	Platforms []PlatformDigest
}

// PlatformDigest is one platform's manifest in an index.
type PlatformDigest struct {
	Platform v1.Platform
	Digest   v1.Hash
}

// DigestRef is the image's reference by digest, what the chart and kustomize pin.
func (r Result) DigestRef() string {
	return r.Ref[:strings.LastIndex(r.Ref, ":")] + "@" + r.Digest.String()
}

// check fails when an image's name is no valid reference, before minutes of compiling.
func (o Options) check() error {
	for _, img := range o.Images {
		if _, err := name.NewTag(o.Ref(img), name.StrictValidation); err != nil {
			return fmt.Errorf("image %s: the registry and version must make a reference: %w", img.Name, err)
		}
	}
	return nil
}

// Build compiles the binaries into a temporary directory and writes the layouts into out.
func Build(ctx context.Context, o Options, out string) ([]Result, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "nodeops-images-")
	if err != nil {
		return nil, fmt.Errorf("work dir: %w", err)
	}
	defer func() { _ = os.RemoveAll(work) }()
	bins, err := Compile(ctx, o, work)
	if err != nil {
		return nil, err
	}
	return Write(o, bins, out)
}

// Write assembles the images from bins and writes out/<name>/ (one OCI layout each), the digests
// file, the Helm values and the kustomization.
func Write(o Options, bins Binaries, out string) ([]Result, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	idxs, err := Assemble(o, bins)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("image dir: %w", err)
	}
	var results []Result
	for i, img := range o.Images {
		r := Result{Image: img, Ref: o.Ref(img)}
		if r.Digest, err = idxs[i].Digest(); err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
		m, err := idxs[i].IndexManifest()
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
		for _, d := range m.Manifests {
			r.Platforms = append(r.Platforms, PlatformDigest{Platform: *d.Platform, Digest: d.Digest})
		}
		if err := WriteLayout(filepath.Join(out, img.Name), r.Ref, idxs[i]); err != nil {
			return nil, err
		}
		o.logf("images: wrote %s (%s)", filepath.Join(out, img.Name), r.Ref)
		results = append(results, r)
	}
	if err := writeOutputs(o, results, out); err != nil {
		return nil, err
	}
	return results, nil
}

func writeOutputs(o Options, results []Result, out string) error {
	var env, values, kust strings.Builder
	fmt.Fprintf(&env, "# Written by make images (hack/images) for revision %s; digests of OCI image indexes.\n", o.Revision)
	fmt.Fprintf(&env, "NODEOPS_IMAGE_VERSION=%s\n", o.Version)
	fmt.Fprintf(&values, "# helm install ... -f %s: pins the images `make images` built, by digest.\nimage:\n", filepath.Join(out, HelmValuesFile))
	rel, err := filepath.Rel(out, filepath.Join(o.Repo, "config", "default"))
	if err != nil {
		return fmt.Errorf("kustomization: %w", err)
	}
	fmt.Fprintf(&kust, "# kubectl apply --server-side -k %s: config/default with the images `make images` built, by digest.\n", out)
	fmt.Fprintf(&kust, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\nimages:\n", filepath.ToSlash(rel))
	for _, r := range results {
		key := strings.ToUpper(r.Image.Name)
		repo := r.Ref[:strings.LastIndex(r.Ref, ":")]
		fmt.Fprintf(&env, "NODEOPS_%s_IMAGE=%s\nNODEOPS_%s_DIGEST=%s\n", key, r.DigestRef(), key, r.Digest)
		fmt.Fprintf(&values, "  %s:\n    repository: %s\n    digest: %s\n", r.Image.Name, repo, r.Digest)
		fmt.Fprintf(&kust, "- name: %s/%s\n  newName: %s\n  digest: %s\n", configRegistry, r.Image.Name, repo, r.Digest)
	}
	// The manager's --agent-image (the secret holder pods run the agent's image) is an argument, which
	// the images transformer leaves: a replacement, applied after it, copies the agent's pinned image
	// there. args.2 is that argument in config/manager/manager.yaml (TestMakeImagesTwiceGivesTheSameDigests
	// fails on any ghcr.io/nodeops left in the rendered tree).
	kust.WriteString("replacements:\n- source:\n    kind: DaemonSet\n    name: nodeops-agent\n    fieldPath: spec.template.spec.containers.[name=agent].image\n" +
		"  targets:\n  - select:\n      kind: Deployment\n      name: nodeops-manager\n    fieldPaths:\n    - spec.template.spec.containers.[name=manager].args.2\n" +
		"    options:\n      delimiter: \"=\"\n      index: 1\n")
	for name, content := range map[string]string{DigestsFile: env.String(), HelmValuesFile: values.String(), KustomizationFile: kust.String()} {
		if err := os.WriteFile(filepath.Join(out, name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// PrintTable writes one row per index and per platform manifest.
func PrintTable(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tPLATFORM\tDIGEST")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Ref, "index", r.Digest)
		for _, p := range r.Platforms {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Ref, p.Platform.String(), p.Digest)
		}
	}
	return tw.Flush()
}

// FromGit fills the revision, version and created time from the repository: the commit, `git
// describe --always --dirty`, and SOURCE_DATE_EPOCH when set (reproducible-builds.org), else the
// commit's time, so rebuilding one commit gives the same digests.
func FromGit(ctx context.Context, o Options) (Options, error) {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = o.Repo
		b, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	var err error
	if o.Revision == "" {
		if o.Revision, err = git("rev-parse", "HEAD"); err != nil {
			return o, err
		}
	}
	if o.Version == "" {
		if o.Version, err = git("describe", "--always", "--dirty"); err != nil {
			return o, err
		}
	}
	if o.Created.IsZero() {
		epoch := os.Getenv("SOURCE_DATE_EPOCH")
		if epoch == "" {
			if epoch, err = git("log", "-1", "--format=%ct"); err != nil {
				return o, err
			}
		}
		sec, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil {
			return o, fmt.Errorf("created time %q: %w", epoch, err)
		}
		o.Created = time.Unix(sec, 0).UTC()
	}
	return o, nil
}
