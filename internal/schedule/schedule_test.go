package schedule

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeops/nodeops/api/v1alpha1"
)

func at(t *testing.T, zone, s string) time.Time {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	v, err := time.ParseInLocation("2006-01-02 15:04", s, loc)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func daily(days []v1alpha1.Weekday, start, end, zone string) v1alpha1.MaintenanceWindow {
	return v1alpha1.MaintenanceWindow{Days: days, Start: start, End: end, TimeZone: zone}
}

func cronWindow(s string, d time.Duration, zone string) v1alpha1.MaintenanceWindow {
	return v1alpha1.MaintenanceWindow{Schedule: s, Duration: &metav1.Duration{Duration: d}, TimeZone: zone}
}

func TestWindowsAt(t *testing.T) {
	weekdaysOnly := []v1alpha1.Weekday{"Monday", "Tuesday", "Wednesday", "Thursday", "Friday"}
	cases := []struct {
		name    string
		windows []v1alpha1.MaintenanceWindow
		now     time.Time
		open    bool
		next    time.Time // the close when open, the next opening when closed
	}{
		{"no windows is always open", nil, at(t, "UTC", "2026-12-02 12:00"), true, time.Time{}},
		{"inside a daily span", []v1alpha1.MaintenanceWindow{daily(nil, "09:00", "17:00", "")},
			at(t, "UTC", "2026-12-02 12:00"), true, at(t, "UTC", "2026-12-02 17:00")},
		{"the end is outside", []v1alpha1.MaintenanceWindow{daily(nil, "09:00", "17:00", "")},
			at(t, "UTC", "2026-12-02 17:00"), false, at(t, "UTC", "2026-12-03 09:00")},
		{"the start is inside", []v1alpha1.MaintenanceWindow{daily(nil, "09:00", "17:00", "")},
			at(t, "UTC", "2026-12-02 09:00"), true, at(t, "UTC", "2026-12-02 17:00")},
		{"before today's opening", []v1alpha1.MaintenanceWindow{daily(nil, "09:00", "17:00", "")},
			at(t, "UTC", "2026-12-02 08:59"), false, at(t, "UTC", "2026-12-02 09:00")},
		{"a span across midnight, after midnight", []v1alpha1.MaintenanceWindow{daily(nil, "22:00", "04:00", "Europe/Berlin")},
			at(t, "Europe/Berlin", "2026-12-03 03:00"), true, at(t, "Europe/Berlin", "2026-12-03 04:00")},
		{"a span across midnight, before it", []v1alpha1.MaintenanceWindow{daily(nil, "22:00", "04:00", "Europe/Berlin")},
			at(t, "Europe/Berlin", "2026-12-02 23:00"), true, at(t, "Europe/Berlin", "2026-12-03 04:00")},
		{"the zone decides, not UTC", []v1alpha1.MaintenanceWindow{daily(nil, "22:00", "04:00", "Europe/Berlin")},
			at(t, "UTC", "2026-12-02 21:30"), true, at(t, "Europe/Berlin", "2026-12-03 04:00")},
		{"weekdays only: Saturday waits for Monday", []v1alpha1.MaintenanceWindow{daily(weekdaysOnly, "22:00", "04:00", "America/New_York")},
			at(t, "America/New_York", "2026-12-05 23:00"), false, at(t, "America/New_York", "2026-12-07 22:00")},
		{"weekdays only: Friday's span runs into Saturday", []v1alpha1.MaintenanceWindow{daily(weekdaysOnly, "22:00", "04:00", "America/New_York")},
			at(t, "America/New_York", "2026-12-05 02:00"), true, at(t, "America/New_York", "2026-12-05 04:00")},
		// Berlin springs forward on 2026-03-29 at 02:00 (to 03:00): a span 01:00-05:00 that day is
		// three hours long, and the next day's 01:00 is 23:00 UTC (summer time).
		{"spring forward: the wall clock decides the close", []v1alpha1.MaintenanceWindow{daily(nil, "01:00", "05:00", "Europe/Berlin")},
			at(t, "UTC", "2026-03-29 01:30"), true, at(t, "UTC", "2026-03-29 03:00")},
		{"spring forward: closed after the wall-clock end", []v1alpha1.MaintenanceWindow{daily(nil, "01:00", "05:00", "Europe/Berlin")},
			at(t, "UTC", "2026-03-29 03:00"), false, at(t, "UTC", "2026-03-29 23:00")},
		// Berlin falls back on 2026-10-25 at 03:00 (to 02:00): 01:00-05:00 lasts five hours.
		{"fall back: open five hours", []v1alpha1.MaintenanceWindow{daily(nil, "01:00", "05:00", "Europe/Berlin")},
			at(t, "UTC", "2026-10-25 03:30"), true, at(t, "UTC", "2026-10-25 04:00")},
		{"fall back: the next opening is an hour later in UTC", []v1alpha1.MaintenanceWindow{daily(nil, "01:00", "05:00", "Europe/Berlin")},
			at(t, "UTC", "2026-10-25 12:00"), false, at(t, "UTC", "2026-10-26 00:00")},
		{"the earliest of two windows opens next", []v1alpha1.MaintenanceWindow{daily(nil, "20:00", "21:00", "UTC"), daily(nil, "14:00", "15:00", "UTC")},
			at(t, "UTC", "2026-12-02 12:00"), false, at(t, "UTC", "2026-12-02 14:00")},
		{"the latest close of two open windows", []v1alpha1.MaintenanceWindow{daily(nil, "10:00", "13:00", "UTC"), daily(nil, "11:00", "16:00", "UTC")},
			at(t, "UTC", "2026-12-02 12:00"), true, at(t, "UTC", "2026-12-02 16:00")},
		{"cron: inside the duration", []v1alpha1.MaintenanceWindow{cronWindow("0 2 * * 6", 4*time.Hour, "UTC")},
			at(t, "UTC", "2026-12-05 05:59"), true, at(t, "UTC", "2026-12-05 06:00")},
		{"cron: after the duration", []v1alpha1.MaintenanceWindow{cronWindow("0 2 * * 6", 4*time.Hour, "UTC")},
			at(t, "UTC", "2026-12-05 06:00"), false, at(t, "UTC", "2026-12-12 02:00")},
		{"cron: at its time", []v1alpha1.MaintenanceWindow{cronWindow("30 1 * * *", time.Hour, "UTC")},
			at(t, "UTC", "2026-12-05 01:30"), true, at(t, "UTC", "2026-12-05 02:30")},
		{"cron: in its own time zone", []v1alpha1.MaintenanceWindow{cronWindow("0 22 * * 1-5", 6*time.Hour, "Asia/Tokyo")},
			at(t, "UTC", "2026-12-02 12:00"), false, at(t, "Asia/Tokyo", "2026-12-02 22:00")},
		{"cron: open across midnight", []v1alpha1.MaintenanceWindow{cronWindow("0 22 * * 1-5", 6*time.Hour, "Asia/Tokyo")},
			at(t, "Asia/Tokyo", "2026-12-03 01:00"), true, at(t, "Asia/Tokyo", "2026-12-03 04:00")},
		// New York springs forward on 2026-03-08 at 02:00: "0 1 * * *" at 01:00 EST, then 01:00 EDT.
		{"cron: across a daylight-saving change", []v1alpha1.MaintenanceWindow{cronWindow("0 1 * * *", time.Hour, "America/New_York")},
			at(t, "UTC", "2026-03-07 12:00"), false, at(t, "UTC", "2026-03-08 06:00")},
		{"cron: the day after the change", []v1alpha1.MaintenanceWindow{cronWindow("0 1 * * *", time.Hour, "America/New_York")},
			at(t, "UTC", "2026-03-08 12:00"), false, at(t, "UTC", "2026-03-09 05:00")},
		// A start or end the clocks skip is the change itself.
		{"a start in the spring-forward gap opens at the change", []v1alpha1.MaintenanceWindow{daily(nil, "02:30", "03:30", "Europe/Berlin")},
			at(t, "UTC", "2026-03-29 01:15"), true, at(t, "UTC", "2026-03-29 01:30")},
		{"an end in the gap closes at the change", []v1alpha1.MaintenanceWindow{daily([]v1alpha1.Weekday{"Sunday"}, "01:45", "02:10", "America/New_York")},
			at(t, "UTC", "2026-03-08 06:50"), true, at(t, "UTC", "2026-03-08 07:00")},
		{"the next opening before a gap day is real", []v1alpha1.MaintenanceWindow{daily([]v1alpha1.Weekday{"Sunday"}, "01:45", "02:10", "America/New_York")},
			at(t, "UTC", "2026-03-07 12:00"), false, at(t, "UTC", "2026-03-08 06:45")},
		{"cron: the first of the month", []v1alpha1.MaintenanceWindow{cronWindow("0 0 1 * *", 2*time.Hour, "UTC")},
			at(t, "UTC", "2026-12-02 12:00"), false, at(t, "UTC", "2027-01-01 00:00")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, err := Compile("spec.windows", c.windows)
			if err != nil {
				t.Fatal(err)
			}
			open, next := w.At(c.now)
			if open != c.open || !next.Equal(c.next) {
				t.Errorf("At(%s) = %v, %s; want %v, %s", c.now.UTC(), open, next.UTC(), c.open, c.next.UTC())
			}
		})
	}
}

func TestCompileNamesTheField(t *testing.T) {
	cases := []struct {
		w    v1alpha1.MaintenanceWindow
		want string
	}{
		{daily(nil, "09:00", "17:00", "Europe/Berln"), `spec.windows[1].timeZone: unknown time zone "Europe/Berln"`},
		{cronWindow("61 * * * *", time.Hour, ""), "spec.windows[1].schedule:"},
		{cronWindow("@daily", time.Hour, ""), "spec.windows[1].schedule"},
		{cronWindow("0 22-3 * * *", time.Hour, ""), "spec.windows[1].schedule"},
		{cronWindow("0 0 30 2 *", time.Hour, ""), "spec.windows[1].schedule: \"0 0 30 2 *\" never fires"},
		{v1alpha1.MaintenanceWindow{Schedule: "0 1 * * *"}, "spec.windows[1].duration: must be set"},
		{daily(nil, "9am", "17:00", ""), `spec.windows[1].start: "9am" is not HH:MM`},
		{daily(nil, "09:00", "09:00", ""), "spec.windows[1].end: must differ from start"},
		{daily([]v1alpha1.Weekday{"Mon"}, "09:00", "10:00", ""), `spec.windows[1].days: unknown day "Mon"`},
	}
	for _, c := range cases {
		_, err := Compile("spec.windows", []v1alpha1.MaintenanceWindow{daily(nil, "01:00", "02:00", ""), c.w})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Compile(%+v) = %v, want an error containing %q", c.w, err, c.want)
		}
	}
}

func TestDescribe(t *testing.T) {
	got := DescribeAll([]v1alpha1.MaintenanceWindow{
		daily([]v1alpha1.Weekday{"Tuesday", "Monday"}, "22:00", "04:00", "Europe/Berlin"),
		cronWindow("0 2 * * 6", 4*time.Hour, ""),
	})
	want := "Mon,Tue 22:00-04:00 Europe/Berlin; cron '0 2 * * 6' for 4h0m0s UTC"
	if got != want {
		t.Errorf("DescribeAll = %q, want %q", got, want)
	}
}

// TestNextOpeningIsOpen: wherever a window set is closed, the opening it announces is open and
// later, across a year of daylight-saving changes in several zones. A window that promises an
// opening that never comes would keep an operation waiting.
func TestNextOpeningIsOpen(t *testing.T) {
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "America/Havana", "America/Santiago", "Australia/Lord_Howe", "Asia/Kolkata"}
	spans := [][2]string{{"22:00", "04:00"}, {"01:45", "02:10"}, {"02:30", "03:30"}, {"00:00", "01:00"}, {"23:30", "00:30"}, {"09:00", "17:00"}}
	days := [][]v1alpha1.Weekday{nil, {"Sunday"}, {"Saturday", "Sunday"}}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, z := range zones {
		for _, sp := range spans {
			for _, d := range days {
				ws, err := Compile("w", []v1alpha1.MaintenanceWindow{daily(d, sp[0], sp[1], z)})
				if err != nil {
					t.Fatal(err)
				}
				for at := start; at.Before(start.AddDate(1, 0, 0)); at = at.Add(97 * time.Minute) {
					open, next := ws.At(at)
					if open {
						if !next.After(at) {
							t.Fatalf("%s %v %v at %s: open, closing at %s, not after", z, sp, d, at, next)
						}
						continue
					}
					if next.IsZero() || !next.After(at) {
						t.Fatalf("%s %v %v at %s: closed, next opening %s", z, sp, d, at, next)
					}
					if o, _ := ws.At(next); !o {
						t.Fatalf("%s %v %v at %s: announced opening %s is closed", z, sp, d, at, next)
					}
				}
			}
		}
	}
}
