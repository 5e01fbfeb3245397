package commands

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func parseMode(s string, def fs.FileMode) (fs.FileMode, error) {
	if s == "" {
		return def, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("mode %q: not an octal file mode", s)
	}
	// fs.FileMode keeps setuid, setgid and sticky in bits of its own, not in 07000 as chmod(2) does;
	// admission lets them through only with allowUnsafeMode.
	mode := fs.FileMode(m & 0o777)
	for bit, fm := range map[uint64]fs.FileMode{0o4000: fs.ModeSetuid, 0o2000: fs.ModeSetgid, 0o1000: fs.ModeSticky} {
		if m&bit != 0 {
			mode |= fm
		}
	}
	return mode, nil
}

// namesFile refuses a path whose last element is empty or ".": "/" or a directory's name with a
// trailing slash would have remove act on a directory, the host's root among them. Admission
// refuses them too; a task may predate the rule.
func namesFile(p string) error {
	if p == "" || strings.HasSuffix(p, "/") || strings.HasSuffix(p, "/.") || path.Clean(p) == "/" {
		return fmt.Errorf("installFile path %q must name a file: not /, and not ending in / or in /. (it is refused before anything is removed or written)", p)
	}
	return nil
}

func runInstallFile(ctx context.Context, env *Env, f *v1alpha1.InstallFileCommand) (Result, error) {
	if err := namesFile(f.Path); err != nil {
		return Result{}, err
	}
	if f.Remove {
		if err := env.Host.Files.Remove(f.Path); err != nil {
			return Result{}, err
		}
		return Result{Message: fmt.Sprintf("removed %s", f.Path)}, nil
	}
	mode, err := parseMode(f.Mode, 0o644)
	if err != nil {
		return Result{}, err
	}
	if _, err := env.Host.Files.Path(f.Path); err != nil {
		return Result{}, err
	}
	url, sum, platform := f.URL, f.SHA256, ""
	if len(f.Platforms) > 0 {
		p, err := pickPlatform(ctx, env, f.Platforms)
		if err != nil {
			return Result{}, err
		}
		url, sum, platform = p.URL, p.SHA256, " for "+p.Platform()
	}
	if fileSHA256(env, f.Path) == sum {
		if err := env.Host.Files.Chmod(f.Path, mode); err != nil {
			return Result{}, err
		}
		return Result{Message: fmt.Sprintf("%s already has sha256 %s%s", f.Path, sum, platform)}, nil
	}
	if err := installVerified(ctx, env, url, sum, f.Path, mode, transport{insecureHTTP: f.InsecureHTTP, caBundle: f.CABundle}); err != nil {
		return Result{}, err
	}
	env.printf("installed %s at %s mode %04o\n", url, f.Path, mode)
	return Result{Message: fmt.Sprintf("installed %s%s (sha256 %s)", f.Path, platform, sum)}, nil
}

// pickPlatform is the artifact for the node's platform, from its Node's kubernetes.io/os and
// kubernetes.io/arch labels (as the kubelet sets them); with no match it fails, naming both,
// before anything is downloaded.
func pickPlatform(ctx context.Context, env *Env, platforms []v1alpha1.InstallFilePlatform) (v1alpha1.InstallFilePlatform, error) {
	var node corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: env.NodeName}, &node); err != nil {
		return v1alpha1.InstallFilePlatform{}, fmt.Errorf("reading node %s's platform: %w", env.NodeName, err)
	}
	os, arch := node.Labels[corev1.LabelOSStable], node.Labels[corev1.LabelArchStable]
	if arch == "" {
		return v1alpha1.InstallFilePlatform{}, fmt.Errorf("node %s has no %s label: its platform is unknown, so no artifact can be chosen", env.NodeName, corev1.LabelArchStable)
	}
	if os == "" {
		os = "linux"
	}
	want := v1alpha1.InstallFilePlatform{OS: os, Arch: arch}.Platform()
	var have []string
	for _, p := range platforms {
		if p.Platform() == want {
			return p, nil
		}
		have = append(have, p.Platform())
	}
	return v1alpha1.InstallFilePlatform{}, fmt.Errorf("no artifact for node %s's platform %s (this installFile has %s); nothing was downloaded",
		env.NodeName, want, strings.Join(have, ", "))
}
