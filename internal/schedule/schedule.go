// Package schedule answers "may a new task start now, and if not, when?" for maintenance
// windows and soak delays. It is pure: it reads the clock it is given, never the machine's, and
// touches no API object. The controllers own what they do with the answer.
package schedule

import (
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/robfig/cron/v3"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

// horizon is how far ahead Next looks for an opening; a window set that opens less often than
// this (a cron schedule for one day a year, say) reports none.
const horizon = 400 * 24 * time.Hour

// Windows are compiled maintenance windows. The zero value (no windows) is always open.
type Windows struct {
	ws []window
}

type window struct {
	loc *time.Location
	// a daily span: start and end as minutes after midnight; days empty means every day.
	days       map[time.Weekday]bool
	start, end int
	// or a cron schedule held open for dur after each of its times.
	cron cron.Schedule
	dur  time.Duration
	text string
}

var weekdays = map[v1alpha1.Weekday]time.Weekday{
	"Sunday": time.Sunday, "Monday": time.Monday, "Tuesday": time.Tuesday, "Wednesday": time.Wednesday,
	"Thursday": time.Thursday, "Friday": time.Friday, "Saturday": time.Saturday,
}

// Compile checks and compiles windows; an error names the window by its index in field, for
// example "spec.windows[1].timeZone: unknown time zone Europe/Berln".
func Compile(field string, in []v1alpha1.MaintenanceWindow) (Windows, error) {
	out := Windows{ws: make([]window, 0, len(in))}
	for i, w := range in {
		path := fmt.Sprintf("%s[%d]", field, i)
		loc := time.UTC
		if w.TimeZone != "" {
			l, err := time.LoadLocation(w.TimeZone)
			if err != nil {
				return Windows{}, fmt.Errorf("%s.timeZone: unknown time zone %q", path, w.TimeZone)
			}
			loc = l
		}
		c := window{loc: loc, text: Describe(w)}
		switch {
		case w.Schedule != "":
			if strings.IndexFunc(w.Schedule, unicode.IsLetter) >= 0 || len(strings.Fields(w.Schedule)) != 5 {
				return Windows{}, fmt.Errorf("%s.schedule: %q is not five numeric cron fields (minute hour day-of-month month day-of-week)", path, w.Schedule)
			}
			s, err := cron.ParseStandard(w.Schedule)
			if err != nil {
				return Windows{}, fmt.Errorf("%s.schedule: %w", path, err)
			}
			spec, ok := s.(*cron.SpecSchedule)
			if !ok {
				return Windows{}, fmt.Errorf("%s.schedule: %q is not a five-field cron expression", path, w.Schedule)
			}
			spec.Location = loc
			if first := spec.Next(time.Date(2026, 1, 1, 0, 0, 0, 0, loc)); first.IsZero() {
				return Windows{}, fmt.Errorf("%s.schedule: %q never fires (a day that no month has?)", path, w.Schedule)
			}
			c.cron = spec
			if w.Duration == nil || w.Duration.Duration <= 0 {
				return Windows{}, fmt.Errorf("%s.duration: must be set and positive with a schedule", path)
			}
			c.dur = w.Duration.Duration
		default:
			var err error
			if c.start, err = clock(w.Start); err != nil {
				return Windows{}, fmt.Errorf("%s.start: %w", path, err)
			}
			if c.end, err = clock(w.End); err != nil {
				return Windows{}, fmt.Errorf("%s.end: %w", path, err)
			}
			if c.start == c.end {
				return Windows{}, fmt.Errorf("%s.end: must differ from start", path)
			}
			for _, d := range w.Days {
				wd, ok := weekdays[d]
				if !ok {
					return Windows{}, fmt.Errorf("%s.days: unknown day %q (Monday to Sunday)", path, d)
				}
				if c.days == nil {
					c.days = map[time.Weekday]bool{}
				}
				c.days[wd] = true
			}
		}
		out.ws = append(out.ws, c)
	}
	return out, nil
}

func clock(s string) (int, error) {
	t, err := time.Parse("15:04", s)
	if err != nil {
		return 0, fmt.Errorf("%q is not HH:MM", s)
	}
	return t.Hour()*60 + t.Minute(), nil
}

// Empty reports whether there are no windows, which means always open.
func (w Windows) Empty() bool { return len(w.ws) == 0 }

// At reports whether a window is open at t. When one is, next is when the last window open at t
// closes; when none is, next is the next opening within a year, or zero if there is none.
func (w Windows) At(t time.Time) (open bool, next time.Time) {
	if w.Empty() {
		return true, time.Time{}
	}
	for _, c := range w.ws {
		if _, e, ok := c.openAt(t); ok {
			if !open || e.After(next) {
				next = e
			}
			open = true
		}
	}
	if open {
		return true, next
	}
	for _, c := range w.ws {
		if o := c.nextOpening(t); !o.IsZero() && (next.IsZero() || o.Before(next)) {
			next = o
		}
	}
	return false, next
}

// openAt returns the opening of c that contains t, if any.
func (c window) openAt(t time.Time) (start, end time.Time, ok bool) {
	if c.cron != nil {
		// The latest time s <= t of the schedule is open if t < s+dur, that is if the first time
		// strictly after t-dur (what Next returns) is not after t.
		s := c.cron.Next(t.Add(-c.dur))
		if !s.IsZero() && !s.After(t) {
			return s, s.Add(c.dur), true
		}
		return time.Time{}, time.Time{}, false
	}
	local := t.In(c.loc)
	// A span that crosses midnight may have opened yesterday.
	for _, back := range []int{0, -1} {
		s, e, day := c.span(local, back)
		if e.After(s) && !s.After(t) && t.Before(e) && c.dayOK(day) {
			return s, e, true
		}
	}
	return time.Time{}, time.Time{}, false
}

// span is c's opening on the local day of t plus days, its close, and the weekday it opens on.
func (c window) span(t time.Time, days int) (start, end time.Time, day time.Weekday) {
	y, m, d := t.Date()
	start = wall(y, m, d+days, c.start, c.loc)
	endDay := d + days
	if c.end <= c.start {
		endDay++
	}
	end = wall(y, m, endDay, c.end, c.loc)
	return start, end, time.Date(y, m, d+days, 12, 0, 0, 0, time.UTC).Weekday()
}

// wall is the first instant at which loc's clock reads minutes after midnight on that date, or
// later: a time skipped by a daylight-saving change (02:30 when clocks go from 02:00 to 03:00) is
// the change itself. Go's time.Date leaves the choice of zone in that gap unspecified, so both
// offsets are tried here.
func wall(y int, m time.Month, d, minutes int, loc *time.Location) time.Time {
	naive := time.Date(y, m, d, minutes/60, minutes%60, 0, 0, time.UTC)
	var found []time.Time
	for _, probe := range []time.Duration{-36 * time.Hour, 36 * time.Hour} {
		_, off := naive.Add(probe).In(loc).Zone()
		at := naive.Add(-time.Duration(off) * time.Second)
		l := at.In(loc)
		if l.Hour()*60+l.Minute() == minutes && l.Day() == naive.Day() {
			found = append(found, at)
		}
	}
	if len(found) > 0 {
		// An hour that happens twice (clocks going back): its first occurrence.
		first := found[0]
		for _, f := range found[1:] {
			if f.Before(first) {
				first = f
			}
		}
		return first
	}
	// In the gap: read with the earlier offset, the time falls after the change, in the zone
	// that begins at the change.
	_, offBefore := naive.Add(-36 * time.Hour).In(loc).Zone()
	start, _ := naive.Add(-time.Duration(offBefore) * time.Second).In(loc).ZoneBounds()
	return start
}

func (c window) dayOK(day time.Weekday) bool {
	return c.days == nil || c.days[day]
}

// nextOpening is c's first opening after t, or zero within the horizon there is none.
func (c window) nextOpening(t time.Time) time.Time {
	if c.cron != nil {
		n := c.cron.Next(t)
		if n.IsZero() || n.Sub(t) > horizon {
			return time.Time{}
		}
		return n
	}
	local := t.In(c.loc)
	// Two weeks: a weekly window whose one day falls in a daylight-saving gap opens the week after.
	for days := -1; days <= 15; days++ {
		if s, e, day := c.span(local, days); e.After(s) && s.After(t) && c.dayOK(day) {
			return s
		}
	}
	return time.Time{}
}

// Describe is a window in a line, as status and the CLI show it: "Mon,Tue 22:00-04:00
// Europe/Berlin" or "cron '0 2 * * 6' for 4h UTC".
func Describe(w v1alpha1.MaintenanceWindow) string {
	zone := w.TimeZone
	if zone == "" {
		zone = "UTC"
	}
	if w.Schedule != "" {
		d := ""
		if w.Duration != nil {
			d = w.Duration.Duration.String()
		}
		return fmt.Sprintf("cron '%s' for %s %s", w.Schedule, d, zone)
	}
	days := "daily"
	if len(w.Days) > 0 {
		short := make([]string, 0, len(w.Days))
		sorted := append([]v1alpha1.Weekday(nil), w.Days...)
		sort.Slice(sorted, func(i, j int) bool { return weekdays[sorted[i]] < weekdays[sorted[j]] })
		for _, d := range sorted {
			short = append(short, string(d)[:3])
		}
		days = strings.Join(short, ",")
	}
	return fmt.Sprintf("%s %s-%s %s", days, w.Start, w.End, zone)
}

// DescribeAll is every window in one line, separated by "; ".
func DescribeAll(ws []v1alpha1.MaintenanceWindow) string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = Describe(w)
	}
	return strings.Join(out, "; ")
}
