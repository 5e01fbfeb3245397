package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/taskpolicy"
)

// DefaultLeaseNamespace is the agent's namespace when it runs outside a pod: its pod commands'
// pods are there. (Its name is from when it also held node Leases.)
const DefaultLeaseNamespace = "nodeops-system"

// NodeLockFile is the node's lock file under its host root: the one exclusion on a node that
// nothing can bypass (safety rule 8).
const NodeLockFile = "var/lib/nodeops/node.lock"

// holdWait is how often a task waiting for its node looks again.
const holdWait = time.Second

// The node's hold is an exclusive flock(2) on the node's lock file, a file on the node itself
// (NodeLockFile under the host root; for --noop-host nodes, one per node in a directory of the
// machine that simulates them). Every agent of a node opens that one file: a DaemonSet pod, a
// Job's, a rollout's old and new pods, a restarted container, one process's workers. The kernel
// grants the lock to one open file at a time, so two managers, a stale cache, a hand-made task, an
// operation and a profile together all end at one command executing on the node; and it frees the
// lock when its process dies, so a dead agent needs no expiry and the API server no write per task.
// A task runs a command only while its agent holds the lock; the holder writes its task's name in
// the file and keeps the lock until it wrote the task finished (Succeeded, Failed or Aborted). The
// next taker reads the name: a task that did not finish (its agent died between two commands)
// keeps the node until it does, as its node's agent resumes it or the manager marks it AgentLost.

// heldNode is the agent's record of a node's lock it took last.
type heldNode struct {
	task string
	// f holds the lock; nil once released.
	f *os.File
}

// holdAnswer says whether a task may act on its node.
type holdAnswer struct {
	held bool
	// took: taken just now (not held from before).
	took bool
	// created: no task ever held the node, so nothing the task records can have been written by
	// another holder, and the cache needs no second look.
	created bool
	// stale: the task read from the API is already finished; the caller reads it again.
	stale bool
	// message, when not held: why, for the task's status; empty when another agent runs this same
	// task (that agent is the task's writer, so this one waits without writing).
	message string
}

// holdNeed is what an action needs of the node's lock.
type holdNeed int

const (
	holdNone holdNeed = iota
	// holdTake: a command runs.
	holdTake
	// holdCheck: a command recorded Running is ended without running (interrupted, aborted).
	holdCheck
)

func holdNeeded(a taskpolicy.Action, st *v1alpha1.NodeTaskStatus) holdNeed {
	switch a.Kind {
	case taskpolicy.ActStart:
		return holdTake
	case taskpolicy.ActInterrupted:
		return holdCheck
	case taskpolicy.ActAbort:
		for _, c := range st.Commands {
			if c.Phase == v1alpha1.CommandRunning {
				return holdCheck
			}
		}
	}
	return holdNone
}

func (r *Reconciler) hold(ctx context.Context, task *v1alpha1.NodeTask, need holdNeed) (holdAnswer, error) {
	if r.holds(task) {
		return holdAnswer{held: true}, nil
	}
	f, locked, err := r.lockNode(task.Spec.NodeName)
	if err != nil {
		return holdAnswer{}, err
	}
	holder, by, err := readHolder(f)
	if err != nil {
		_ = f.Close()
		return holdAnswer{}, fmt.Errorf("reading the lock of node %s: %w", task.Spec.NodeName, err)
	}
	if !locked {
		_ = f.Close()
		switch {
		case holder == task.Name || holder == "":
			// Another agent on the node runs this task (or is naming its task just now): wait,
			// without writing, for it to finish or to die.
			return holdAnswer{}, nil
		case need == holdCheck:
			// The lock is another task's: nothing of this one runs, so its Running command's runner is gone.
			return holdAnswer{held: true}, nil
		}
		return holdAnswer{message: "node busy: held by task " + holder}, nil
	}
	if need == holdCheck {
		// No agent runs anything on the node. Kept (the file unchanged) until this task's result
		// is written, so that no agent re-runs the command meanwhile.
		r.recordHold(task, f)
		return holdAnswer{held: true}, nil
	}
	ans := holdAnswer{held: true, took: true, created: holder == ""}
	if holder != "" && (holder != task.Name || by != r.stamp()) {
		// Another task's, or this task's under another agent (dead now, as the lock was free):
		// the node is free once that task finished or is gone; this task, if another agent
		// finished it, is stale.
		done, err := r.finishedOrGone(ctx, holder, task.Spec.NodeName)
		switch {
		case err != nil:
			_ = f.Close()
			return holdAnswer{}, err
		case holder == task.Name && done:
			_ = f.Close()
			return holdAnswer{stale: true}, nil
		case holder != task.Name && !done:
			_ = f.Close()
			return holdAnswer{message: "node busy: held by task " + holder}, nil
		}
	}
	if err := writeHolder(f, task.Name, r.stamp()); err != nil {
		_ = f.Close()
		return holdAnswer{}, fmt.Errorf("naming task %s in the lock of node %s: %w", task.Name, task.Spec.NodeName, err)
	}
	r.recordHold(task, f)
	return ans, nil
}

// finishedOrGone reads task name, which a node's lock file names, from the API server.
func (r *Reconciler) finishedOrGone(ctx context.Context, name, node string) (bool, error) {
	held := &v1alpha1.NodeTask{}
	err := r.Direct.Get(ctx, client.ObjectKey{Name: name}, held)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading task %s, which holds node %s: %w", name, node, err)
	}
	return finished(held.EffectivePhase()), nil
}

// lockNode opens node's lock file and tries its lock; locked reports whether it is now this
// process's (the file stays open: closing it frees the lock).
func (r *Reconciler) lockNode(node string) (f *os.File, locked bool, err error) {
	path := r.LockFile(node)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, false, fmt.Errorf("the lock of node %s: %w", node, err)
	}
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, false, fmt.Errorf("the lock of node %s: %w", node, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	switch {
	case err == nil:
		return f, true, nil
	case errors.Is(err, unix.EWOULDBLOCK):
		return f, false, nil
	}
	_ = f.Close()
	return nil, false, fmt.Errorf("locking %s for node %s: %w", path, node, err)
}

// readHolder is the task the lock file names ("" when none) and the agent that wrote it.
func readHolder(f *os.File) (task, by string, err error) {
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 4096))
	if err != nil {
		return "", "", err
	}
	task, by, _ = strings.Cut(string(b), "\n")
	return strings.TrimSpace(task), strings.TrimSpace(by), nil
}

// writeHolder names task in the lock file, with the agent that took it on a second line (for a
// person reading the file).
func writeHolder(f *os.File, task, agent string) error {
	b := []byte(task + "\n" + agent + "\n")
	if _, err := f.WriteAt(b, 0); err != nil {
		return err
	}
	// Cut what a longer name left after it. Not cut to zero first: on ext4 a file truncated to
	// zero and written again is flushed when closed (auto_da_alloc), a disk write per task.
	return f.Truncate(int64(len(b)))
}

// stamp names this agent in the lock files it writes: its identity, or its process.
func (r *Reconciler) stamp() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.instance == "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		r.instance = hex.EncodeToString(b)
	}
	who := r.Identity
	if who == "" {
		who = fmt.Sprintf("pid %d", os.Getpid())
	}
	return who + " " + r.instance
}

// holds reports whether this agent holds the node's lock for task.
func (r *Reconciler) holds(task *v1alpha1.NodeTask) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.nodes[task.Spec.NodeName]
	return ok && h.task == task.Name && h.f != nil
}

func (r *Reconciler) recordHold(task *v1alpha1.NodeTask, f *os.File) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodes == nil {
		r.nodes = map[string]heldNode{}
	}
	if h, ok := r.nodes[task.Spec.NodeName]; ok && h.f != nil && h.f != f {
		// Not reached: the lock is granted to one open file at a time.
		_ = h.f.Close()
	}
	r.nodes[task.Spec.NodeName] = heldNode{task: task.Name, f: f}
}

// releaseIfFinished frees the node's lock once task finished: its agent wrote so, or the manager
// marked it lost (nothing of it starts again). The file still names the task, which the next
// taker finds finished.
func (r *Reconciler) releaseIfFinished(task *v1alpha1.NodeTask) {
	if !finished(task.Status.Phase) && !finished(task.EffectivePhase()) {
		return
	}
	// A download for a command the task will not run now (it failed, was aborted or succeeded) is
	// stopped and removed before the node is free for another task.
	r.dropPrefetch(task.Name).p.Discard()
	r.mu.Lock()
	defer r.mu.Unlock()
	if h, ok := r.nodes[task.Spec.NodeName]; ok && h.task == task.Name && h.f != nil {
		_ = h.f.Close()
		h.f = nil
		r.nodes[task.Spec.NodeName] = h
	}
}

// releaseGone frees the node's lock held for a task that was deleted.
func (r *Reconciler) releaseGone(task string) {
	r.dropPrefetch(task).p.Discard()
	r.mu.Lock()
	defer r.mu.Unlock()
	for node, h := range r.nodes {
		if h.task == task && h.f != nil {
			_ = h.f.Close()
			h.f = nil
			r.nodes[node] = h
		}
	}
}

// finished: nothing of the task runs or starts again.
func finished(p v1alpha1.TaskPhase) bool {
	return p == v1alpha1.TaskSucceeded || p == v1alpha1.TaskFailed || p == v1alpha1.TaskAborted
}

// releaseHolds frees the nodes of tasks left unfinished when the agent stops with nothing running
// (their next command Pending), so that the agent that follows (a restart, a rollout) may give the
// node to another task first, as a node between two tasks.
func (r *Reconciler) releaseHolds(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for node, h := range r.nodes {
		if h.f == nil {
			continue
		}
		if err := h.f.Truncate(0); err != nil {
			log.FromContext(ctx).Info("could not clear the node's lock file; the next task waits for this one", "node", node, "task", h.task, "error", err.Error())
		}
		_ = h.f.Close()
		h.f = nil
		r.nodes[node] = h
	}
}
