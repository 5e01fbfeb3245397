package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
)

const (
	statusOK     = "ok"
	statusFailed = "FAILED"
	statusNotRun = "not run"
)

// result is one row of the summary.
type result struct {
	name   string
	status string
	took   time.Duration
	err    error
}

func (d *demo) printSummary(results []result, total time.Duration, failed bool) {
	d.heading("Summary", "")
	fmt.Fprint(d.out, summaryTable(results, total, failed))
}

// summaryTable renders the rows, the errors of failed ones under the table, and a last line with the outcome.
func summaryTable(results []result, total time.Duration, failed bool) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tRESULT\tTOOK")
	for _, r := range results {
		took := "-"
		if r.status == statusOK || r.status == statusFailed {
			took = roundDuration(r.took).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.name, r.status, took)
	}
	fmt.Fprintf(tw, "total\t\t%s\n", roundDuration(total))
	_ = tw.Flush()
	for _, r := range results {
		if r.err != nil {
			fmt.Fprintf(&b, "\n%s: %v\n", r.name, r.err)
		}
	}
	if failed {
		fmt.Fprintln(&b, "\ndemo: FAILED")
	} else {
		fmt.Fprintln(&b, "\ndemo: every step succeeded")
	}
	return b.String()
}

// roundDuration keeps a tenth of a second below a minute and whole seconds above.
func roundDuration(d time.Duration) time.Duration {
	if d < time.Minute {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}
