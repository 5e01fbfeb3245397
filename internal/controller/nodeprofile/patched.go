package nodeprofile

import (
	"strings"
	"sync"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// patchedNodes remembers the nodes this controller labelled or unlabelled until the informer
// cache shows the patch, so that a reconcile on a cache behind its own write does not patch the
// node again (a write the budget counts). Tasks need no such memory: the lock table's
// reservations stand for them (addReserved); a node patch is no create, and the table knows tasks only.
type patchedNodes struct {
	mu sync.Mutex
	// nodes: profile key -> node -> the node's resourceVersion in the cache when it was patched.
	nodes map[string]map[string]string
}

func newPatchedNodes() *patchedNodes {
	return &patchedNodes{nodes: map[string]map[string]string{}}
}

// patched records that node was patched while the cache showed it at resourceVersion rv.
func (e *patchedNodes) patched(profile string, node, rv string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.nodes[profile] == nil {
		e.nodes[profile] = map[string]string{}
	}
	e.nodes[profile][node] = rv
}

// stale reports whether the cache still shows node as it was before this controller patched it;
// a node whose cached version moved on is forgotten.
func (e *patchedNodes) stale(profile string, node, rv string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	before, ok := e.nodes[profile][node]
	if !ok {
		return false
	}
	if before == rv {
		return true
	}
	delete(e.nodes[profile], node)
	return false
}

// profileKey keys the memory by name and UID, so that a profile deleted and created again
// under the same name starts afresh.
func profileKey(p *v1alpha1.NodeProfile) string { return p.Name + "/" + string(p.UID) }

// forget drops everything about the profile named name, which is gone.
func (e *patchedNodes) forget(name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.nodes {
		if strings.HasPrefix(k, name+"/") {
			delete(e.nodes, k)
		}
	}
}
