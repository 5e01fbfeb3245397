package v1alpha1_test

// scheduled is op's NodeOperation with one wait command and the given scheduling fields (YAML,
// indented as under spec:).
func scheduled(name, scheduling string) string {
	return op(name, "- wait: {duration: 1s}") + indent(scheduling, "  ")
}

// windowCases are maintenance windows and soak delays, refused at admission with the field path.
func windowCases() []admission {
	const w = "spec.windows[0]"
	return []admission{
		{"a daily window", scheduled("w0", "windows:\n- {days: [Saturday, Sunday], start: \"22:00\", end: \"04:00\", timeZone: Europe/Berlin}\npostNodeDelay: 5m\npostGroupDelay: 1h"), "", ""},
		{"a cron window", scheduled("w00", "windows:\n- {schedule: \"0 2 * * 6\", duration: 4h, timeZone: America/New_York}\n- {schedule: \"*/15 1-3 1,15 1-12/2 0-6\", duration: 10m}"), "", ""},
		{"window start not HH:MM", scheduled("w1", "windows:\n- {start: \"9:00\", end: \"17:00\"}"), w + ".start", "should match"},
		{"window end at 24:00", scheduled("w2", "windows:\n- {start: \"09:00\", end: \"24:00\"}"), w + ".end", "should match"},
		{"window end equal to start", scheduled("w3", "windows:\n- {start: \"09:00\", end: \"09:00\"}"), w + ".end", "end must differ from start"},
		{"window without end", scheduled("w4", "windows:\n- {start: \"09:00\"}"), w, "set either start and end"},
		{"window with both forms", scheduled("w5", "windows:\n- {start: \"09:00\", end: \"10:00\", schedule: \"0 1 * * *\", duration: 1h}"), w, "set either start and end"},
		{"window day misspelt", scheduled("w6", "windows:\n- {days: [Mon], start: \"09:00\", end: \"10:00\"}"), w + ".days[0]", "Unsupported value"},
		{"cron with six fields", scheduled("w7", "windows:\n- {schedule: \"0 0 1 * * *\", duration: 1h}"), w + ".schedule", "must be a five-field cron expression"},
		{"cron minute 60", scheduled("w8", "windows:\n- {schedule: \"60 1 * * *\", duration: 1h}"), w + ".schedule", "must be a five-field cron expression"},
		{"cron hour 24", scheduled("w9", "windows:\n- {schedule: \"0 24 * * *\", duration: 1h}"), w + ".schedule", "must be a five-field cron expression"},
		{"cron descriptor", scheduled("w10", "windows:\n- {schedule: \"@daily\", duration: 1h}"), w + ".schedule", "must be a five-field cron expression"},
		{"cron day-of-week 7", scheduled("w11", "windows:\n- {schedule: \"0 1 * * 7\", duration: 1h}"), w + ".schedule", "must be a five-field cron expression"},
		{"cron step zero", scheduled("w18", "windows:\n- {schedule: \"*/0 * * * *\", duration: 1h}"), w + ".schedule", "must be a five-field cron expression"},
		{"cron without duration", scheduled("w12", "windows:\n- {schedule: \"0 1 * * *\"}"), w, "set either start and end"},
		{"cron duration too short", scheduled("w13", "windows:\n- {schedule: \"0 1 * * *\", duration: 30s}"), w + ".duration", "must be from 1m to 168h"},
		{"time zone with spaces", scheduled("w14", "windows:\n- {start: \"09:00\", end: \"10:00\", timeZone: \"Europe/ Berlin\"}"), w + ".timeZone", "should match"},
		{"negative postNodeDelay", scheduled("w15", "postNodeDelay: -1m"), "spec.postNodeDelay", "must be from 0s to 24h"},
		{"huge postGroupDelay", scheduled("w16", "postGroupDelay: 25h"), "spec.postGroupDelay", "must be from 0s to 24h"},
		{"group window malformed", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: w17
spec:
  custom:
    groups:
    - name: g
      windows:
      - {start: "09:00", end: "10:60"}
      commands:
      - wait: {duration: 1s}
`, "spec.custom.groups[0].windows[0].end", "should match"},
	}
}
