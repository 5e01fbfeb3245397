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

// gateCases are health gates, refused at admission with the field path.
func gateCases() []admission {
	const g = "spec.gates[0]"
	return []admission{
		{"an alertmanager gate holding a silence", scheduled("g0", "gates:\n- name: no-pages\n  alertmanager:\n    url: http://am:9093\n    matchers: [severity=critical]\n    silence: {matchers: [\"instance={{node}}\"], maxDuration: 2h, comment: \"work on {{node}}\"}"), "", ""},
		{"every other kind of gate", scheduled("g00", "gates:\n- {name: a, approval: {}}\n- {name: b, clusterHealth: {}}\n- {name: c, timeout: 5m, prometheus: {url: \"http://prom:9090\", query: up == 0}}\n- {name: d, cel: {apiVersion: apps/v1, kind: Deployment, namespace: x, name: web, expression: \"true\"}}"), "", ""},
		{"a gate of two kinds", scheduled("g1", "gates:\n- {name: a, approval: {}, clusterHealth: {}}"), g, "exactly one of cel, clusterHealth"},
		{"a gate name not a DNS label", scheduled("g2", "gates:\n- {name: No_Pages, approval: {}}"), g + ".name", "should match"},
		{"a silence without matchers", scheduled("g3", "gates:\n- name: a\n  alertmanager: {url: \"http://am:9093\", silence: {matchers: []}}"), g + ".alertmanager.silence.matchers", "should have at least 1 items"},
		{"a silence matcher without an operator", scheduled("g4", "gates:\n- name: a\n  alertmanager: {url: \"http://am:9093\", silence: {matchers: [\"{{node}}\"]}}"), g + ".alertmanager.silence.matchers[0]", "should match"},
		{"a silence held too long", scheduled("g5", "gates:\n- name: a\n  alertmanager: {url: \"http://am:9093\", silence: {matchers: [\"instance={{node}}\"], maxDuration: 200h}}"), g + ".alertmanager.silence.maxDuration", "must be from 1m to 168h"},
		{"an alertmanager URL not http", scheduled("g6", "gates:\n- name: a\n  alertmanager: {url: \"ftp://am\"}"), g + ".alertmanager.url", "must be an http or https URL"},
		{"a gate timeout too long", scheduled("g7", "gates:\n- {name: a, timeout: 200h, approval: {}}"), g + ".timeout", "must be from 1s to 168h"},
		{"a command gate", scheduled("g8", "gates:\n- {name: a, command: {script: \"test -f /done\"}}\n- {name: b, timeout: 1h, command: {script: \"mdadm --detail /dev/md0 | grep -q 'State : clean'\", node: storage-1}}"), "", ""},
		{"a command gate without a script", scheduled("g9", "gates:\n- {name: a, command: {script: \"\"}}"), g + ".command.script", "should be at least 1 chars long"},
		// A NodeProfile's gates are the same type under the same rules.
		{"a profile's gates", profiled("pg0", "gates:\n- {name: a, approval: {}}\n- {name: d, timeout: 5m, cel: {apiVersion: apps/v1, kind: Deployment, namespace: x, name: web, expression: \"true\"}}"), "", ""},
		{"a profile's command gate", profiled("pg1", "gates:\n- {name: a, approval: {}}\n- {name: b, command: {script: \"test -f /done\"}}\n- {name: c, timeout: 1h, command: {script: \"true\", node: storage-1}}"), "", ""},
		{"a profile's alertmanager silence", profiled("pg8", "gates:\n- {name: a, alertmanager: {url: 'http://am:9093', silence: {matchers: ['instance={{node}}'], maxDuration: 2h, comment: \"work on {{node}}\"}}}"), "", ""},
		{"a profile's command gate without a script", profiled("pg9", "gates:\n- {name: a, command: {script: \"\"}}"), g + ".command.script", "should be at least 1 chars long"},
		{"a profile's silence held too long", profiled("pg10", "gates:\n- name: a\n  alertmanager: {url: \"http://am:9093\", silence: {matchers: [\"instance={{node}}\"], maxDuration: 200h}}"), g + ".alertmanager.silence.maxDuration", "must be from 1m to 168h"},
		{"a profile's silence without matchers", profiled("pg11", "gates:\n- name: a\n  alertmanager: {url: \"http://am:9093\", silence: {matchers: []}}"), g + ".alertmanager.silence.matchers", "should have at least 1 items"},
		{"a profile's gate of two kinds", profiled("pg2", "gates:\n- {name: a, approval: {}, clusterHealth: {}}"), g, "exactly one of cel, clusterHealth"},
		{"a profile's gate name not a DNS label", profiled("pg3", "gates:\n- {name: No_Pages, approval: {}}"), g + ".name", "should match"},
		{"a profile's gate timeout too short", profiled("pg4", "gates:\n- {name: a, timeout: 500ms, approval: {}}"), g + ".timeout", "must be from 1s to 168h"},
		{"a profile's CEL gate with name and selector", profiled("pg5", "gates:\n- {name: a, cel: {apiVersion: v1, kind: ConfigMap, name: x, selector: {matchLabels: {a: b}}, expression: \"true\"}}"), g + ".cel", "set exactly one of name or selector"},
		{"a profile's prometheus URL not http", profiled("pg6", "gates:\n- {name: a, prometheus: {url: \"ftp://prom\", query: up}}"), g + ".prometheus.url", "must be an http or https URL"},
		{"a profile's two gates of one name", profiled("pg7", "gates:\n- {name: a, approval: {}}\n- {name: a, clusterHealth: {}}"), "spec.gates[1]", "Duplicate value"},
	}
}

// profiled is profile's NodeProfile with one wait command and the given fields (YAML, indented as under spec:).
func profiled(name, fields string) string {
	return profile(name, "- wait: {duration: 1s}") + indent(fields, "  ")
}
