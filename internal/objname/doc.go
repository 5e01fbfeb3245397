// Package objname names the objects nodeops creates: a NodeTask for an owner, group and node, a
// node's Lease, an installer pod, a secret holder and its volume, and the label values that stand
// for longer names. Every name is valid for its kind and distinct triples get distinct names.
//
// It is pure and imports nothing of nodeops, so that its fuzz target builds in seconds.
package objname
