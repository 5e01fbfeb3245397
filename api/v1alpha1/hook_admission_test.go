package v1alpha1_test

// hookCases are hooks, refused at admission with the field path.
func hookCases() []admission {
	const job = `{job: {template: {spec: {template: {spec: {containers: [{name: c, image: busybox}]}}}}}}`
	const secret = `signingKey: hmac`
	return []admission{
		{"a job hook and http hooks", scheduled("h0", "hooks:\n  preOperation:\n  - {name: tell, http: {url: \"https://events.example.com/x\", "+secret+"}}\n  preNode:\n  - {name: check, timeout: 5m, job: {template: {spec: {template: {spec: {containers: [{name: c, image: busybox}]}}}}}}\n  postNode:\n  - {name: local, http: {url: \"http://127.0.0.1:8080/e\", "+secret+"}}\n  postOperation:\n  - {name: six, http: {url: \"http://[::1]:9/e\", "+secret+"}}"), "", ""},
		{"hook with job and http", scheduled("h1", "hooks:\n  preNode:\n  - {name: both, http: {url: \"https://e.example.com\", "+secret+"}, job: {template: {spec: {template: {}}}}}"), "spec.hooks.preNode[0]", "exactly one of job or http must be set"},
		{"hook with neither", scheduled("h2", "hooks:\n  preNode:\n  - {name: none}"), "spec.hooks.preNode[0]", "exactly one of job or http must be set"},
		{"http hook over plain http to a remote host", scheduled("h3", "hooks:\n  postNode:\n  - {name: tell, http: {url: \"http://events.example.com/x\", "+secret+"}}"), "spec.hooks.postNode[0].http.url", "must be an https URL, or http to a loopback address"},
		{"http hook with no URL scheme", scheduled("h4", "hooks:\n  postNode:\n  - {name: tell, http: {url: \"events.example.com\", "+secret+"}}"), "spec.hooks.postNode[0].http.url", "must be an https URL"},
		{"http hook without a signing secret", scheduled("h5", "hooks:\n  postNode:\n  - {name: tell, http: {url: \"https://e.example.com\"}}"), "spec.hooks.postNode[0].http.signingKey", "Required value"},
		{"hook name with capitals", scheduled("h7", "hooks:\n  preNode:\n  - {name: Check, "+job[1:]), "spec.hooks.preNode[0].name", "should match"},
		{"hook timeout too long", scheduled("h8", "hooks:\n  preNode:\n  - {name: c, timeout: 25h, "+job[1:]), "spec.hooks.preNode[0].timeout", "must be from 1s to 24h"},
		{"two hooks of one name", scheduled("h9", "hooks:\n  preNode:\n  - {name: c, "+job[1:]+"\n  - {name: c, "+job[1:]), "spec.hooks.preNode[1]", "Duplicate value"},
		{"preOperation hook on a group", `apiVersion: nodeops.io/v1alpha1
kind: NodeOperation
metadata:
  name: h10
spec:
  custom:
    groups:
    - name: g
      hooks:
        preOperation:
        - {name: c, job: {template: {spec: {template: {spec: {containers: [{name: c, image: busybox}]}}}}}}
      commands:
      - wait: {duration: 1s}
`, "spec.custom.groups[0].hooks", "preOperation and postOperation hooks belong on the operation"},
	}
}
