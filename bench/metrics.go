package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"

	"k8s.io/client-go/rest"
)

// writeVerbs are the apiserver_request_total verbs that change state.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "DELETECOLLECTION": true}

// writeKey names one kind of write: resource (with its API group and subresource) and verb.
type writeKey struct {
	Group, Resource, Subresource, Verb string
}

func (k writeKey) String() string {
	r := k.Resource
	if k.Group != "" {
		r += "." + k.Group
	}
	if k.Subresource != "" {
		r += "/" + k.Subresource
	}
	return k.Verb + " " + r
}

// writeCounts is apiserver_request_total summed over codes, scopes and components, writes only.
type writeCounts map[writeKey]float64

// parseWriteCounts reads the API server's /metrics text and sums apiserver_request_total for
// write verbs by group, resource, subresource and verb. Dry-run requests are left out: they write nothing.
func parseWriteCounts(r io.Reader) (writeCounts, error) {
	out := writeCounts{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	const metric = "apiserver_request_total{"
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric) {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < 0 {
			return nil, fmt.Errorf("malformed metric line %q", line)
		}
		labels, err := parseLabels(line[len(metric):end])
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		if !writeVerbs[labels["verb"]] || labels["dry_run"] != "" {
			continue
		}
		fields := strings.Fields(line[end+1:])
		if len(fields) == 0 {
			return nil, fmt.Errorf("metric line %q has no value", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		out[writeKey{labels["group"], labels["resource"], labels["subresource"], labels["verb"]}] += v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading metrics: %w", err)
	}
	return out, nil
}

// parseLabels parses `a="x",b="y"` with Prometheus' escapes (\\, \", \n).
func parseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for len(s) > 0 {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return nil, fmt.Errorf("bad label list at %q", s)
		}
		name := strings.TrimSpace(s[:eq])
		var b strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				if s[i] == 'n' {
					b.WriteByte('\n')
					continue
				}
			}
			b.WriteByte(s[i])
		}
		if i >= len(s) {
			return nil, fmt.Errorf("unterminated label value at %q", s)
		}
		out[name] = b.String()
		s = strings.TrimPrefix(s[i+1:], ",")
	}
	return out, nil
}

// sub returns c - before, keeping only positive differences.
func (c writeCounts) sub(before writeCounts) writeCounts {
	out := writeCounts{}
	for k, v := range c {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// total sums the counts that keep selects (all when keep is nil).
func (c writeCounts) total(keep func(writeKey) bool) float64 {
	var t float64
	for k, v := range c {
		if keep == nil || keep(k) {
			t += v
		}
	}
	return t
}

// nodeopsWrite selects the writes nodeops' manager and agents make, everything counted: nodeops.io
// objects and their status, Node objects (the profile label; kwok writes only nodes/status), the
// budget ledger (the only ConfigMap written in a run's window: internal/nodelock/ledger.go) and
// events. The API server's counters do not say a Lease's namespace, so Leases (kwok's node
// heartbeats, and the agents' node Leases) count here among all writes only; the node Leases are
// counted by a watch instead (runResult.LeaseWrites) and added to the writes per node.
func nodeopsWrite(k writeKey) bool {
	switch {
	case k.Group == "nodeops.io":
		return true
	case k.Group == "" && k.Resource == "nodes" && k.Subresource == "":
		return true
	case k.Group == "" && k.Resource == "configmaps":
		return true
	case k.Resource == "events":
		return true
	}
	return false
}

// perNodeWrite selects the writes that nodeops makes once per node: NodeTasks (create, status),
// Node objects (the profile label) and the budget ledger (once per batch of creates, counted here
// as it grows with the batches); the node Lease's are added from runResult.LeaseWrites. nodeopsWrite less these are the writes per run.
func perNodeWrite(k writeKey) bool {
	return (k.Group == "nodeops.io" && k.Resource == "nodetasks") || (k.Group == "" && k.Resource == "nodes" && k.Subresource == "") ||
		(k.Group == "" && k.Resource == "configmaps")
}

// breakdown lists the counts, largest first, as "VERB resource.group/sub N".
func (c writeCounts) breakdown() []string {
	keys := make([]writeKey, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if c[keys[i]] != c[keys[j]] {
			return c[keys[i]] > c[keys[j]]
		}
		return keys[i].String() < keys[j].String()
	})
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%s %.0f", k, c[k]))
	}
	return out
}

// scrapeWrites reads the API server's own request counters.
func scrapeWrites(ctx context.Context, cfg *rest.Config) (writeCounts, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("building an HTTP client: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(cfg.Host, "/")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET /metrics: %s: %s", resp.Status, body)
	}
	return parseWriteCounts(resp.Body)
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat: 100 on every Linux
// architecture Go builds for (the kernel's CONFIG_HZ is hidden behind it).
const clockTicks = 100

// cpuSeconds is the user+system CPU time of a process so far.
func cpuSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("reading CPU time of pid %d: %w", pid, err)
	}
	return parseCPUSeconds(string(data))
}

// parseCPUSeconds reads utime and stime (fields 14 and 15) from a /proc/<pid>/stat line.
func parseCPUSeconds(stat string) (float64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed stat %q", stat)
	}
	// After ")": state(3) ppid(4) ... utime(14) stime(15); fields[0] is field 3.
	fields := strings.Fields(stat[i+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("short stat %q", stat)
	}
	u, err1 := strconv.ParseUint(fields[11], 10, 64)
	s, err2 := strconv.ParseUint(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad utime/stime in %q", stat)
	}
	return float64(u+s) / clockTicks, nil
}

// peakRSS is VmHWM of a process, in bytes.
func peakRSS(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("reading status of pid %d: %w", pid, err)
	}
	return parseStatusKB(string(data), "VmHWM")
}

// parseStatusKB reads a "Name:   123 kB" line of /proc/<pid>/status, in bytes.
func parseStatusKB(status, name string) (uint64, error) {
	for _, line := range strings.Split(status, "\n") {
		rest, ok := strings.CutPrefix(line, name+":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("malformed %s line %q", name, line)
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed %s line %q: %w", name, line, err)
		}
		return kb * 1024, nil
	}
	return 0, fmt.Errorf("no %s in status", name)
}

// resetPeakRSS sets a process's VmHWM back to its current RSS (Linux 4.0+: "5" to clear_refs),
// so that each run's peak is its own.
func resetPeakRSS(pid int) error {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		return fmt.Errorf("resetting the peak RSS of pid %d: %w", pid, err)
	}
	return nil
}

// readLoadAvg returns the 1, 5 and 15 minute load averages, or "" when /proc/loadavg is unreadable.
func readLoadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
