// Package architecture checks docs/architecture.md against the code, so that the drawing cannot drift:
// the "may import" column of its package table against each package's real imports (go list), and every
// function its walk of a NodeOperation names against the packages' source. It owns no code of its own and
// touches nothing but the source tree and the doc, which it only reads.
package architecture
