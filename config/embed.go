// Package config embeds nodeops' manifests so binaries (nodeops-local, tests) install exactly what is committed.
package config

import "embed"

// CRDs holds the generated CustomResourceDefinitions, crd/*.yaml.
//
//go:embed crd/*.yaml
var CRDs embed.FS
