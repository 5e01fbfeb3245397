// Package containerdtoml edits containerd's TOML config: it adds and removes CRI runtime handlers and
// keeps the rest of the file as it was. It imports nothing of nodeops or Kubernetes, so that its fuzz
// target builds in seconds (go test -fuzz instruments every package the test binary holds).
package containerdtoml

import (
	"bytes"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// RuntimeHandler is a containerd CRI runtime handler.
type RuntimeHandler struct {
	Name        string
	RuntimeType string
	// BinaryPath becomes runtime_path, the shim binary containerd runs.
	BinaryPath string
	// PodAnnotations becomes pod_annotations.
	PodAnnotations []string
	// Options is the handler's options table; values are strings, bools, int64s or float64s.
	Options map[string]any
}

// settings is the handler's table as the TOML decoder gives it back.
func (h RuntimeHandler) settings() map[string]any {
	m := map[string]any{"runtime_type": h.RuntimeType}
	if h.BinaryPath != "" {
		m["runtime_path"] = h.BinaryPath
	}
	if len(h.PodAnnotations) > 0 {
		a := make([]any, len(h.PodAnnotations))
		for i, s := range h.PodAnnotations {
			a[i] = s
		}
		m["pod_annotations"] = a
	}
	if len(h.Options) > 0 {
		o := make(map[string]any, len(h.Options))
		for k, v := range h.Options {
			o[k] = v
		}
		m["options"] = o
	}
	return m
}

// RuntimesPath is where CRI runtime handlers live in each config version.
func RuntimesPath(version int64) ([]string, error) {
	switch version {
	case 2:
		return []string{"plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes"}, nil
	case 3:
		return []string{"plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes"}, nil
	}
	return nil, fmt.Errorf("containerd config version %d is not supported (versions 2 and 3 are)", version)
}

// ConfigEdit is the outcome of editing a containerd config.
type ConfigEdit struct {
	Data    []byte
	Changed bool
	// Rewritten is set when the file's layout could not be kept and it was re-encoded whole
	// (same settings, comments and order lost).
	Rewritten bool
	Version   int64
}

// Edit adds (or, with remove, takes out) a runtime handler in a containerd config of version 2 or
// 3. Everything else in the file is kept byte for byte: the edit is made on the text at the table
// boundaries the TOML parser reports, and the result is parsed again and compared with the intended
// settings; only if they differ is the whole document re-encoded. Editing twice changes nothing. A
// file may lack its version line (a k3s template that starts from k3s' base template): then
// defaultVersion, when not 0, is the version.
func Edit(data []byte, h RuntimeHandler, remove bool, defaultVersion int64) (ConfigEdit, error) {
	doc := map[string]any{}
	if err := toml.Unmarshal(data, &doc); err != nil {
		return ConfigEdit{}, fmt.Errorf("parsing containerd config: %w", err)
	}
	version, ok := doc["version"].(int64)
	if !ok && defaultVersion != 0 {
		version = defaultVersion
	}
	base, err := RuntimesPath(version)
	if err != nil {
		return ConfigEdit{}, err
	}
	entryPath := append(append([]string{}, base...), h.Name)
	existing, _ := Lookup(doc, entryPath).(map[string]any)
	desired := h.settings()
	edit := ConfigEdit{Data: data, Version: version}
	switch {
	case remove && existing == nil:
		return edit, nil
	case !remove && existing != nil && reflect.DeepEqual(existing, desired):
		return edit, nil
	}

	want := deepCopy(doc)
	if remove {
		deleteAt(want, entryPath)
	} else {
		setAt(want, entryPath, desired)
	}

	text := data
	if existing != nil {
		if text, err = removeTables(text, entryPath); err != nil {
			return ConfigEdit{}, err
		}
	}
	if !remove {
		if text, err = insertHandler(text, base, h); err != nil {
			return ConfigEdit{}, err
		}
	}
	edit.Changed = true
	got := map[string]any{}
	// Empty tables mean nothing to containerd; removing a handler that was added without its parent tables leaves none.
	if err := toml.Unmarshal(text, &got); err == nil && reflect.DeepEqual(Pruned(got), Pruned(want)) {
		edit.Data = text
		return edit, nil
	}
	// The handler was written in a form the text edit cannot follow (inline or dotted keys): re-encode.
	out, err := toml.Marshal(want)
	if err != nil {
		return ConfigEdit{}, fmt.Errorf("encoding containerd config: %w", err)
	}
	edit.Data, edit.Rewritten = out, true
	return edit, nil
}

// table is one [table] or [[array table]] header of a document.
type table struct {
	path []string
	// start is the offset of the header's line; end that of the next header's line (or the end).
	start, end int
	// keyStart is the offset of the header's last key part, for reusing its quoting.
	lastKeyStart int
	// bodyIndent is the indentation of the first key/value line in the table.
	bodyIndent string
}

func parseTables(data []byte) ([]table, error) {
	var p unstable.Parser
	p.Reset(data)
	var tables []table
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			var path []string
			last := 0
			it := e.Key()
			for it.Next() {
				k := it.Node()
				path = append(path, string(k.Data))
				last = int(k.Raw.Offset)
			}
			start := lineStart(data, last)
			if n := len(tables); n > 0 {
				tables[n-1].end = start
			}
			tables = append(tables, table{path: path, start: start, end: len(data), lastKeyStart: last, bodyIndent: "\x00"})
		case unstable.KeyValue:
			if n := len(tables); n > 0 && tables[n-1].bodyIndent == "\x00" {
				off := lineStart(data, int(e.Raw.Offset))
				tables[n-1].bodyIndent = string(data[off:int(e.Raw.Offset)])
			}
		}
	}
	if err := p.Error(); err != nil {
		return nil, fmt.Errorf("parsing containerd config: %w", err)
	}
	return tables, nil
}

func lineStart(data []byte, off int) int {
	return bytes.LastIndexByte(data[:off], '\n') + 1
}

// contentEnd moves a table's end back over the blank and comment lines before the next header:
// those belong to what follows.
func contentEnd(data []byte, t table) int {
	end := t.end
	for end > t.start {
		prev := lineStart(data, end-1)
		line := strings.TrimSpace(string(data[prev:end]))
		if line != "" && !strings.HasPrefix(line, "#") {
			break
		}
		end = prev
	}
	return end
}

func hasPrefix(path, prefix []string) bool {
	if len(path) < len(prefix) {
		return false
	}
	for i := range prefix {
		if path[i] != prefix[i] {
			return false
		}
	}
	return true
}

// removeTables cuts every table at or under prefix, with the blank line that separated it.
func removeTables(data []byte, prefix []string) ([]byte, error) {
	tables, err := parseTables(data)
	if err != nil {
		return nil, err
	}
	out := append([]byte{}, data...)
	for i := len(tables) - 1; i >= 0; i-- {
		t := tables[i]
		if !hasPrefix(t.path, prefix) {
			continue
		}
		start, end := t.start, contentEnd(data, t)
		if start >= 2 && data[start-1] == '\n' && data[start-2] == '\n' {
			start--
		}
		out = append(out[:start], out[end:]...)
	}
	return out, nil
}

// insertHandler adds the handler's table after the last table under the runtimes table, in the
// indentation and quoting of a sibling handler, or at the end of the file when there is none.
func insertHandler(data []byte, base []string, h RuntimeHandler) ([]byte, error) {
	tables, err := parseTables(data)
	if err != nil {
		return nil, err
	}
	at := len(data)
	header := "[" + quotedPath(append(append([]string{}, base...), h.Name)) + "]"
	indent, bodyIndent := "", "  "
	for _, t := range tables {
		if !hasPrefix(t.path, base) || len(t.path) == len(base) {
			continue
		}
		at = contentEnd(data, t)
		if len(t.path) == len(base)+1 {
			start := t.start
			indent = string(data[start : start+len(leadingSpace(data[start:]))])
			raw := string(data[start+len(indent) : t.lastKeyStart])
			header = raw + h.Name + "]"
			if t.bodyIndent != "\x00" {
				bodyIndent = t.bodyIndent
			}
		}
	}
	if at == len(data) {
		bodyIndent = ""
	}
	var b strings.Builder
	if at > 0 && data[at-1] != '\n' {
		b.WriteString("\n")
	}
	b.WriteString("\n" + indent + header + "\n")
	b.WriteString(bodyIndent + "runtime_type = " + basicString(h.RuntimeType) + "\n")
	if h.BinaryPath != "" {
		b.WriteString(bodyIndent + "runtime_path = " + basicString(h.BinaryPath) + "\n")
	}
	if len(h.PodAnnotations) > 0 {
		quoted := make([]string, len(h.PodAnnotations))
		for i, a := range h.PodAnnotations {
			quoted[i] = basicString(a)
		}
		b.WriteString(bodyIndent + "pod_annotations = [" + strings.Join(quoted, ", ") + "]\n")
	}
	if len(h.Options) > 0 {
		// The options sub-table follows its handler, as containerd's own default config writes runc's.
		b.WriteString("\n" + indent + strings.TrimSuffix(header, "]") + ".options]\n")
		keys := make([]string, 0, len(h.Options))
		for k := range h.Options {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			b.WriteString(bodyIndent + quotedPath([]string{k}) + " = " + tomlValue(h.Options[k]) + "\n")
		}
	}
	out := make([]byte, 0, len(data)+b.Len())
	out = append(out, data[:at]...)
	out = append(out, b.String()...)
	return append(out, data[at:]...), nil
}

// tomlValue writes an option's value; a value of another type is written as its string, which the
// parse-and-compare check then sees differ, so the file is re-encoded rather than written wrong.
func tomlValue(v any) string {
	switch x := v.(type) {
	case bool:
		return strconv.FormatBool(x)
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		s := strconv.FormatFloat(x, 'g', -1, 64)
		if !strings.ContainsAny(s, ".eEnI") {
			s += ".0"
		}
		return s
	case string:
		return basicString(x)
	}
	return basicString(fmt.Sprint(v))
}

func leadingSpace(b []byte) []byte {
	i := 0
	for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
		i++
	}
	return b[:i]
}

func quotedPath(path []string) string {
	parts := make([]string, len(path))
	for i, p := range path {
		if isBareKey(p) {
			parts[i] = p
		} else {
			parts[i] = basicString(p)
		}
	}
	return strings.Join(parts, ".")
}

func isBareKey(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// basicString quotes s as a TOML basic string.
func basicString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, "\\u%04X", r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// Lookup is the value at path in a decoded TOML document, nil where a step on the way is missing or not a table.
func Lookup(doc map[string]any, path []string) any {
	var cur any = doc
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}

func setAt(doc map[string]any, path []string, v any) {
	cur := doc
	for _, p := range path[:len(path)-1] {
		next, ok := cur[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			cur[p] = next
		}
		cur = next
	}
	cur[path[len(path)-1]] = v
}

func deleteAt(doc map[string]any, path []string) {
	if parent, ok := Lookup(doc, path[:len(path)-1]).(map[string]any); ok {
		delete(parent, path[len(path)-1])
	}
}

func deepCopy(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		switch vv := v.(type) {
		case map[string]any:
			out[k] = deepCopy(vv)
		case []any:
			c := make([]any, len(vv))
			for i, e := range vv {
				if em, ok := e.(map[string]any); ok {
					c[i] = deepCopy(em)
				} else {
					c[i] = e
				}
			}
			out[k] = c
		default:
			out[k] = v
		}
	}
	return out
}

// Pruned drops empty tables, which removing a handler leaves behind.
func Pruned(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	out := map[string]any{}
	for k, x := range m {
		x = Pruned(x)
		if sub, ok := x.(map[string]any); ok && len(sub) == 0 {
			continue
		}
		out[k] = x
	}
	return out
}

var decimal = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)

// OptionValues types the API's option strings for TOML: true and false as booleans, decimals as
// numbers (docs/how-to/wasm-shims.md), the rest as strings.
func OptionValues(in map[string]string) map[string]any {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]any, len(in))
	for k, v := range in {
		out[k] = v
		switch {
		case v == "true" || v == "false":
			out[k] = v == "true"
		case decimal.MatchString(v):
			if i, err := strconv.ParseInt(v, 10, 64); err == nil {
				out[k] = i
			} else if f, err := strconv.ParseFloat(v, 64); err == nil {
				out[k] = f
			}
		}
	}
	return out
}
