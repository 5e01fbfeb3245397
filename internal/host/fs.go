package host

import "github.com/nodeops/nodeops/internal/hostfs"

// The host's files as commands see them, confined to the host root: package hostfs.
type (
	// Files is the host's files as commands see them. *FS changes them; DryRunFiles reads through and
	// reports each change instead of making it.
	Files = hostfs.Files
	// TempFile is a file being written beside its destination.
	TempFile = hostfs.TempFile
	// FS reads and writes files under a host root, never outside it.
	FS = hostfs.FS
)
