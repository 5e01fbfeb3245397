package commands

import (
	"context"
	"fmt"
	"io/fs"
	"strconv"

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

func runInstallFile(ctx context.Context, env *Env, f *v1alpha1.InstallFileCommand) (Result, error) {
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
	if fileSHA256(env, f.Path) == f.SHA256 {
		if err := env.Host.Files.Chmod(f.Path, mode); err != nil {
			return Result{}, err
		}
		return Result{Message: fmt.Sprintf("%s already has sha256 %s", f.Path, f.SHA256)}, nil
	}
	if err := installVerified(ctx, env, f.URL, f.SHA256, f.Path, mode, transport{insecureHTTP: f.InsecureHTTP, caBundle: f.CABundle}); err != nil {
		return Result{}, err
	}
	env.printf("installed %s at %s mode %04o\n", f.URL, f.Path, mode)
	return Result{Message: fmt.Sprintf("installed %s (sha256 %s)", f.Path, f.SHA256)}, nil
}
