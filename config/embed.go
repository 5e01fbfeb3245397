// Package config embeds nodeops' manifests so binaries (nodeops-local, tests) install exactly what is committed.
package config

import "embed"

// CRDs holds the generated CustomResourceDefinitions, crd/nodeops.io_*.yaml (not the directory's
// kustomization.yaml, which readers of crd/*.yaml would take for a CRD).
//
//go:embed crd/nodeops.io_*.yaml
var CRDs embed.FS
