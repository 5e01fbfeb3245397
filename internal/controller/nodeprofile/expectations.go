package nodeprofile

import (
	"strings"
	"sync"
	"time"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// expectationTTL bounds how long a write the cache has not shown yet is assumed to have happened.
const expectationTTL = 2 * time.Minute

// expectations remember this controller's own writes until the informer cache shows them, as the
// ReplicaSet controller does: a reconcile running on a cache that has not seen the tasks just
// created would otherwise count fewer nodes as busy and start more than maxUnavailable, and one
// that has not seen a node's new label would patch the node again.
type expectations struct {
	mu sync.Mutex
	// tasks: profile key -> task name -> the created task, as Decide sees it.
	tasks map[string]map[string]expectedTask
	// nodes: profile key -> node -> the node's resourceVersion in the cache when it was patched.
	nodes map[string]map[string]string
}

type expectedTask struct {
	view TaskView
	at   time.Time
}

func newExpectations() *expectations {
	return &expectations{tasks: map[string]map[string]expectedTask{}, nodes: map[string]map[string]string{}}
}

// created records a task this controller created.
func (e *expectations) created(profile string, t TaskView, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.tasks[profile] == nil {
		e.tasks[profile] = map[string]expectedTask{}
	}
	e.tasks[profile][t.Name] = expectedTask{view: t, at: now}
}

// addUnseenTasks returns listed plus the created tasks the cache does not show yet, and forgets
// those it shows (or that are too old to trust).
func (e *expectations) addUnseenTasks(profile string, listed []TaskView, now time.Time) []TaskView {
	e.mu.Lock()
	defer e.mu.Unlock()
	exp := e.tasks[profile]
	if len(exp) == 0 {
		return listed
	}
	for _, t := range listed {
		delete(exp, t.Name)
	}
	for name, x := range exp {
		if now.Sub(x.at) > expectationTTL {
			delete(exp, name)
			continue
		}
		listed = append(listed, x.view)
	}
	return listed
}

// patched records that node was patched while the cache showed it at resourceVersion rv.
func (e *expectations) patched(profile string, node, rv string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.nodes[profile] == nil {
		e.nodes[profile] = map[string]string{}
	}
	e.nodes[profile][node] = rv
}

// nodeStale reports whether the cache still shows node as it was before this controller patched it;
// a node whose cached version moved on is forgotten.
func (e *expectations) nodeStale(profile string, node, rv string) bool {
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

// profileKey keys expectations by name and UID, so that a profile deleted and created again
// under the same name starts afresh.
func profileKey(p *v1alpha1.NodeProfile) string { return p.Name + "/" + string(p.UID) }

// forget drops everything about the profile named name, which is gone.
func (e *expectations) forget(name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.tasks {
		if strings.HasPrefix(k, name+"/") {
			delete(e.tasks, k)
		}
	}
	for k := range e.nodes {
		if strings.HasPrefix(k, name+"/") {
			delete(e.nodes, k)
		}
	}
}
