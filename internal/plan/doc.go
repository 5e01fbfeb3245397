// Package plan is nodeops' pure planner: it expands built-in operations into groups, resolves each
// group's nodes, chooses which nodes start next under maxUnavailable, and checks the
// upgrade version policy. Nothing here does IO.
//
// It is pure: no API client, no clock, no IO.
package plan
