// Package confinement proves agents confined to their own node (rule 10) on a real API server (envtest): an
// agent's pod-bound ServiceAccount token acts only on its own node and its own tasks' status, and
// only the manager creates NodeTasks. The tokens are real (TokenRequest), and so are the RBAC and
// admission policies: the committed config/agent and config/admission files.
//
// It changes nothing outside its own envtest.
package confinement
