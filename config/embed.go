// Package config embeds nodeops' manifests so binaries (nodeops-local, tests) install exactly what is committed.
//
// It holds manifests and no logic; its generated files (crd/, rbac/role.yaml) come from make generate
// and are never edited by hand.
package config

import "embed"

// CRDs holds the generated CustomResourceDefinitions, crd/nodeops.io_*.yaml (not the directory's
// kustomization.yaml, which readers of crd/*.yaml would take for a CRD).
//
//go:embed crd/nodeops.io_*.yaml
var CRDs embed.FS

// Admission holds the admission policies of a real install, admission/*.yaml less the
// kustomization (TestAdmissionKustomizationListsEveryPolicy keeps the two in step).
//
//go:embed admission/agent-confinement.yaml admission/nodetask-creation.yaml admission/manager-pods.yaml admission/manager-nodetask-status.yaml
var Admission embed.FS

// Manager holds the manager's Namespace, ServiceAccount, bindings and Deployment, and its
// generated roles (rbac/role.yaml).
//
//go:embed manager/manager.yaml rbac/role.yaml
var Manager embed.FS

// Agent holds the agent's ServiceAccount, ClusterRole, Roles and DaemonSet, and the installer pods' ServiceAccount.
//
//go:embed agent/daemonset.yaml
var Agent embed.FS
