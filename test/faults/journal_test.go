package faults

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	spec := Spec{
		Idempotent:     map[string]bool{"a/work": true},
		LastCommand:    map[string]string{"a": "finish", "b": "finish"},
		MaxUnavailable: map[string]int{"a": 1, "b": 1},
	}
	for _, tc := range []struct {
		name                     string
		journal                  string
		twice, most, unavailable int
		commands, held           int // held counts only tasks with a create marker
	}{
		{"one task after another", `
w1 a begin start 1
w1 a begin end 1
w1 a finish start 1
w1 a finish end 1
w2 a begin start 2
w2 a finish start 2
w2 a finish end 2
w1 b begin start 3
w1 b begin end 3
`, 0, 1, 0, 1, 0},
		{"a killed agent ends its command; the rerun of an idempotent one is no violation", `
w1 a work start 1
- killed w1 2
w1 a work start 3
w1 a work end 4
`, 0, 1, 0, 1, 0},
		{"a non-idempotent command started twice", `
w1 a begin start 1
- killed w1 2
w1 a begin start 3
`, 1, 1, 0, 1, 0},
		{"two operations on one node at once", `
w1 a work start 1
w1 b begin start 1
w1 b begin end 2
w1 a work end 2
`, 0, 2, 0, 2, 0},
		{"another operation's task between a killed task's commands", `
w1 a work start 1
- killed w1 2
w1 b begin start 3
w1 b begin end 3
w1 b finish start 4
w1 b finish end 4
w1 a work start 5
w1 a finish end 6
`, 0, 2, 0, 1, 0},
		{"a second node before the first one finished", `
w1 a begin start 1
w1 a begin end 1
w2 a begin start 2
w2 a begin end 2
w3 a begin start 2
`, 0, 1, 1, 1, 0},
		{"two operations on two nodes at once: each budget counts the other's node", `
w1 a work start 1
w2 b begin start 1
w2 b begin end 2
w1 a work end 2
`, 0, 1, 1, 1, 0},
		{"the other operation's node is free again once its task ended", `
w1 a begin start 1
w1 a finish start 1
w1 a finish end 1
w2 b begin start 2
w2 b begin end 2
`, 0, 1, 0, 1, 0},
		{"a deleted node is in no operation's selection", `
w1 a work start 1
- deleted w1 2
w2 b begin start 3
w2 b begin end 3
`, 0, 1, 0, 1, 0},
		{"while two managers run, another operation's node over the budget counts too", `
- second-manager started 1
w1 a work start 1
w2 b begin start 1
w2 b begin end 2
w1 a work end 2
- second-manager stopped 3
`, 0, 1, 1, 1, 0},
		{"while two managers run, an operation's own nodes over its budget still count", `
- second-manager started 1
w1 a begin start 1
w1 a begin end 1
w2 a begin start 2
`, 0, 1, 1, 1, 0},
		{"two tasks created for one node, run one after the other", `
- create a-w-w1 on w1 by manager: 201 1
- create b-w-w1 on w1 by manager-2: 201 1
- create b-w-w2 on w2 by manager-2: 409 1
w1 a begin start 2
w1 a begin end 2
w1 a finish start 3
w1 a finish end 3
w1 b begin start 4
w1 b begin end 4
w1 b finish start 5
w1 b finish end 5
`, 0, 1, 0, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			entries, err := ParseJournal(strings.NewReader(tc.journal))
			if err != nil {
				t.Fatal(err)
			}
			r := Check(entries, spec)
			if len(r.RunTwice) != tc.twice || r.MostAtOnce != tc.most || len(r.MaxUnavailable) != tc.unavailable || r.MostCommandsAtOnce != tc.commands || r.MostHeldAtOnce != tc.held {
				t.Errorf("run twice %v, tasks at once %d (%s), maxUnavailable %v, commands at once %d, held at once %d (%s); want %d, %d, %d, %d, %d",
					r.RunTwice, r.MostAtOnce, r.MostAt, r.MaxUnavailable, r.MostCommandsAtOnce, r.MostHeldAtOnce, r.MostHeldAt, tc.twice, tc.most, tc.unavailable, tc.commands, tc.held)
			}
		})
	}
}

func TestParseJournalRefusesATornLine(t *testing.T) {
	if _, err := ParseJournal(strings.NewReader("w1 a begin sta\n")); err == nil {
		t.Error("a torn line was accepted")
	}
}
