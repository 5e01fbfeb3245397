// Package chart tests what nodeops installs with: the Helm chart (charts/nodeops) linted, rendered
// and installed with the real helm, the kustomize tree (config/default) applied with the real
// kubectl, both against a real API server, and the krew manifest (plugins/nodeops.yaml).
//
// It installs only into the API server and the directories its tests start.
package chart
