// Package e2e is test layer 3 of docs/design.md: nodeops end to end on nodeops-local (a real control
// plane, kwok nodes, local nodes with host roots, the manager and agents as processes), driven with the
// CLI and kubectl through the scenario functions of test/e2e/framework (`make test-e2e`).
//
// It changes nothing outside the nodeops-local clusters its tests start.
package e2e
