package plan

// Select is the one maxUnavailable selector: of candidates, given in the caller's stable sorted
// order (system-upgrade-controller issue 77: an unstable order let too many jobs run), it
// returns those that start now. budget is the maxUnavailable limit; unavailable counts the nodes
// already unavailable that are not candidates (an unfinished or failed task, or NotReady:
// unavailable nodes count against maxUnavailable, rule 2). A candidate for which down reports true (NotReady, or held by
// another task: budgets are cluster-wide, rule 11) counts against the budget too and waits. The
// other candidates start in order while the unavailable count stays within budget.
func Select[C any](candidates []C, budget, unavailable int, down func(C) bool) []C {
	room := budget - unavailable
	for _, c := range candidates {
		if down(c) {
			room--
		}
	}
	if room <= 0 {
		return nil
	}
	out := make([]C, 0, min(room, len(candidates)))
	for _, c := range candidates {
		if len(out) == room {
			break
		}
		if !down(c) {
			out = append(out, c)
		}
	}
	return out
}
