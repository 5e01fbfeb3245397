// Package faults is test layer 5 of docs/design.md: nodeops-local with local nodes, two operations and a
// profile racing over the same nodes while the manager, agents and kube-apiserver are killed, a node is
// deleted, a second manager runs and a fault proxy answers 503 (see faults_test.go, build tag faults,
// `make test-faults`). This file is the pure part: the journal the nodes' scripts write and the checks
// computed from it.
//
// It changes nothing outside the nodeops-local cluster it starts.
package faults

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strings"
)

// JournalPath is the journal inside every node root. All node roots hold hard links to one file, so its
// lines are in the one order in which the nodes' scripts (and the test's fault markers) appended them;
// busybox's date has no nanoseconds, so the order of lines, not their timestamps, is what the checks use.
const JournalPath = "/journal"

// Line kinds of the journal.
const (
	Start = "start"
	End   = "end"
	// Killed is the test's marker "- killed <node> <unix>": the node's agent got SIGKILL, and with it
	// (Pdeathsig, internal/host/exec.go) the script it ran, which therefore writes no end line.
	Killed = "killed"
	// Created is the fault proxy's marker "- create <task> on <node> by <manager>: 201 <unix>": a NodeTask
	// the API server accepted (Command holds the task's name, Operation the manager).
	Created = "create"
	// Deleted is the test's marker "- deleted <node> <unix>": the node's object is gone, so it is in
	// no operation's selection any more (its agent may still end a command there).
	Deleted = "deleted"
	// Managers is the test's marker "- second-manager started|stopped <unix>" (Command holds which).
	Managers = "second-manager"
)

// Entry is one journal line: "<node> <operation> <command> start|end <unix-seconds>", or a marker.
type Entry struct {
	Node, Operation, Command, Kind string
}

// ParseJournal reads the journal's entries in order; a torn or unknown line is an error.
func ParseJournal(r io.Reader) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 0:
			continue
		case len(f) == 4 && f[0] == "-" && (f[1] == Killed || f[1] == Deleted):
			out = append(out, Entry{Node: f[2], Kind: f[1]})
		case len(f) == 4 && f[0] == "-" && f[1] == Managers:
			out = append(out, Entry{Command: f[2], Kind: Managers})
		case len(f) == 9 && f[0] == "-" && f[1] == Created:
			if f[7] == "201" {
				out = append(out, Entry{Node: f[4], Operation: strings.TrimSuffix(f[6], ":"), Command: f[2], Kind: Created})
			}
		case len(f) == 5 && f[0] != "-" && (f[3] == Start || f[3] == End):
			out = append(out, Entry{Node: f[0], Operation: f[1], Command: f[2], Kind: f[3]})
		case f[0] == "-":
			// Other markers (faults injected) are for people reading the journal.
		default:
			return nil, fmt.Errorf("journal line %d: %q is not <node> <operation> <command> start|end <unix>", n, sc.Text())
		}
	}
	return out, sc.Err()
}

// Spec is what the checks need to know about the work: which (operation, command) pairs are
// idempotent (v1alpha1.CommandKind.IsIdempotent of the scripts), the last command of each
// operation's task, and each operation's maxUnavailable. Every operation and the profile select the
// same nodes, so each one's budget counts what the others hold too (budgets are cluster-wide, rule 11).
type Spec struct {
	Idempotent     map[string]bool // key "operation/command"
	LastCommand    map[string]string
	MaxUnavailable map[string]int
}

// Result is what the checks found; each finding names where, for the report.
type Result struct {
	// RunTwice: second (or later) starts of a non-idempotent command on one node for one operation.
	RunTwice []string
	// MostAtOnce is the most tasks executing on one node at once, and where: a task executes from its
	// first journal line to its last, so one resumed after its agent was killed executes through the gap.
	MostAtOnce int
	MostAt     string
	// MostHeldAtOnce is the most tasks on one node at once from their create to their last line, and where.
	MostHeldAtOnce int
	MostHeldAt     string
	// MostCommandsAtOnce is the most operations with a command running on one node at once, and where.
	MostCommandsAtOnce int
	MostCommandsAt     string
	// MaxUnavailable: each time an operation had more nodes unavailable at once than its maxUnavailable:
	// the nodes its tasks hold and those where another operation or the profile runs a command,
	// while one manager runs or two (the budget ledger orders their decisions: internal/nodelock/ledger.go).
	MaxUnavailable []string
}

// Check computes the journal's findings.
//
// A command runs from its start line to its end line, or to a Killed marker of its node. An operation's
// task holds its node from its first command's start to its last command's end: a task that stopped
// half-way (failed, or its agent killed) keeps its node, as the planner counts a failed node against
// maxUnavailable (unavailable nodes count against maxUnavailable, rule 2), so an operation may start no other node meanwhile.
func Check(entries []Entry, spec Spec) Result {
	var r Result
	starts := map[string]int{}
	running := map[string]map[string]bool{} // node -> "operation/command" running
	holding := map[string]map[string]bool{} // operation -> nodes its tasks hold
	over := map[string]bool{}
	for i, e := range entries {
		switch e.Kind {
		case Killed:
			delete(running, e.Node)
			continue
		case Deleted:
			delete(running, e.Node)
			for _, nodes := range holding {
				delete(nodes, e.Node)
			}
			continue
		case Managers, Created:
			continue
		case Start:
			key := e.Operation + "/" + e.Command
			id := e.Node + " " + key
			starts[id]++
			if starts[id] > 1 && !spec.Idempotent[key] {
				r.RunTwice = append(r.RunTwice, fmt.Sprintf("%s started %d times (journal entry %d)", id, starts[id], i+1))
			}
			if running[e.Node] == nil {
				running[e.Node] = map[string]bool{}
			}
			running[e.Node][key] = true
			if holding[e.Operation] == nil {
				holding[e.Operation] = map[string]bool{}
			}
			holding[e.Operation][e.Node] = true
		case End:
			delete(running[e.Node], e.Operation+"/"+e.Command)
			if spec.LastCommand[e.Operation] == e.Command {
				delete(holding[e.Operation], e.Node)
				for key := range running[e.Node] { // the task ended: nothing of it runs on
					if strings.HasPrefix(key, e.Operation+"/") {
						delete(running[e.Node], key)
					}
				}
			}
		}
		ops := map[string]bool{}
		for key := range running[e.Node] {
			ops[strings.SplitN(key, "/", 2)[0]] = true
		}
		if len(ops) > r.MostCommandsAtOnce {
			r.MostCommandsAtOnce, r.MostCommandsAt = len(ops), fmt.Sprintf("%s at journal entry %d: %s", e.Node, i+1, strings.Join(sortedKeys(running[e.Node]), ", "))
		}
		if limit, ok := spec.MaxUnavailable[e.Operation]; ok {
			// Its budget counts the nodes its own tasks hold and every node where another
			// operation or the profile runs a command (they all select the same nodes; budgets are cluster-wide, rule 11).
			unavailable := map[string]string{}
			for n := range holding[e.Operation] {
				unavailable[n] = e.Operation
			}
			for n, keys := range running {
				for key := range keys {
					if op := strings.SplitN(key, "/", 2)[0]; op != e.Operation && unavailable[n] == "" {
						unavailable[n] = op
					}
				}
			}
			n := len(unavailable)
			if n > limit && !over[e.Operation] {
				var who []string
				for _, node := range sortedKeys(unavailable) {
					who = append(who, node+" ("+unavailable[node]+")")
				}
				r.MaxUnavailable = append(r.MaxUnavailable, fmt.Sprintf("%s had %d nodes unavailable (maxUnavailable %d) at journal entry %d: %s",
					e.Operation, n, limit, i+1, strings.Join(who, ", ")))
			}
			over[e.Operation] = n > limit
		}
	}
	r.MostAtOnce, r.MostAt = mostTasksAtOnce(entries)
	r.MostHeldAtOnce, r.MostHeldAt = mostHeldAtOnce(entries, spec)
	return r
}

// mostHeldAtOnce sweeps the spans from each task's create (the proxy's marker; the task is named after its
// operation) to its last journal line, or to the end when it never ran a command after its create.
func mostHeldAtOnce(entries []Entry, spec Spec) (int, string) {
	type span struct{ from, to int }
	spans := map[string]*span{} // "node operation"
	for i, e := range entries {
		switch e.Kind {
		case Created:
			for op := range spec.LastCommand {
				if strings.HasPrefix(e.Command, op+"-") {
					spans[e.Node+" "+op] = &span{i, len(entries)}
				}
			}
		case Start, End:
			if s := spans[e.Node+" "+e.Operation]; s != nil {
				s.to = i
			}
		}
	}
	most, at := 0, ""
	for i, e := range entries {
		var held []string
		for id, s := range spans {
			if strings.HasPrefix(id, e.Node+" ") && s.from <= i && i <= s.to {
				held = append(held, strings.TrimPrefix(id, e.Node+" "))
			}
		}
		if len(held) > most {
			sort.Strings(held)
			most, at = len(held), fmt.Sprintf("%s at journal entry %d: %s", e.Node, i+1, strings.Join(held, ", "))
		}
	}
	return most, at
}

// mostTasksAtOnce sweeps the tasks' spans, [first line, last line] of each (node, operation).
func mostTasksAtOnce(entries []Entry) (int, string) {
	first, last := map[string]int{}, map[string]int{}
	for i, e := range entries {
		if e.Kind != Start && e.Kind != End {
			continue
		}
		id := e.Node + " " + e.Operation
		if _, ok := first[id]; !ok {
			first[id] = i
		}
		last[id] = i
	}
	most, at := 0, ""
	for i, e := range entries {
		if e.Kind != Start && e.Kind != End {
			continue
		}
		var open []string
		for id, f := range first {
			if strings.HasPrefix(id, e.Node+" ") && f <= i && i <= last[id] {
				open = append(open, strings.TrimPrefix(id, e.Node+" "))
			}
		}
		if len(open) > most {
			sort.Strings(open)
			most, at = len(open), fmt.Sprintf("%s at journal entry %d: %s", e.Node, i+1, strings.Join(open, ", "))
		}
	}
	return most, at
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// JournalScript is a script command's inline text: it appends its start line, runs body, and appends its
// end line only when body succeeded.
func JournalScript(operation, command, body string) string {
	line := func(kind string) string {
		return fmt.Sprintf(`echo "$NODEOPS_NODE_NAME %s %s %s $(date +%%s)" >> %s`, operation, command, kind, JournalPath)
	}
	return line(Start) + "\n" + body + " || exit $?\n" + line(End) + "\n"
}

// Running is the sorted nodes on which a command is running at the end of entries.
func Running(entries []Entry) []string {
	running := map[string]map[string]bool{}
	for _, e := range entries {
		switch e.Kind {
		case Killed:
			delete(running, e.Node)
		case Start:
			if running[e.Node] == nil {
				running[e.Node] = map[string]bool{}
			}
			running[e.Node][e.Operation+"/"+e.Command] = true
		case End:
			delete(running[e.Node], e.Operation+"/"+e.Command)
		}
	}
	var out []string
	for n, cmds := range running {
		if len(cmds) > 0 {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}
