package alerting

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Matcher is one label matcher, as Alertmanager's silences hold them.
type Matcher struct {
	Name    string `json:"name"`
	Value   string `json:"value"`
	IsRegex bool   `json:"isRegex"`
	IsEqual bool   `json:"isEqual"`
}

// labelName is a Prometheus label name.
var labelName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// ParseMatcher reads "name=value", "name!=value", "name=~regex" or "name!~regex"; the value may be
// double-quoted ("name=\"a b\""). A regex must compile, as Alertmanager anchors and compiles it
// the same way (RE2).
func ParseMatcher(s string) (Matcher, error) {
	i := strings.IndexAny(s, "=!")
	if i < 0 {
		return Matcher{}, fmt.Errorf("matcher %q: want name=value, name!=value, name=~regex or name!~regex", s)
	}
	m := Matcher{Name: strings.TrimSpace(s[:i])}
	rest := s[i:]
	switch {
	case strings.HasPrefix(rest, "=~"):
		m.IsRegex, m.IsEqual, rest = true, true, rest[2:]
	case strings.HasPrefix(rest, "!~"):
		m.IsRegex, rest = true, rest[2:]
	case strings.HasPrefix(rest, "!="):
		rest = rest[2:]
	case strings.HasPrefix(rest, "="):
		m.IsEqual, rest = true, rest[1:]
	default:
		return Matcher{}, fmt.Errorf("matcher %q: want name=value, name!=value, name=~regex or name!~regex", s)
	}
	if !labelName.MatchString(m.Name) {
		return Matcher{}, fmt.Errorf("matcher %q: %q is not a label name", s, m.Name)
	}
	m.Value = strings.TrimSpace(rest)
	if len(m.Value) >= 2 && strings.HasPrefix(m.Value, `"`) && strings.HasSuffix(m.Value, `"`) {
		v, err := strconv.Unquote(m.Value)
		if err != nil {
			return Matcher{}, fmt.Errorf("matcher %q: quoted value: %w", s, err)
		}
		m.Value = v
	}
	if m.IsRegex {
		if _, err := regexp.Compile("^(?:" + m.Value + ")$"); err != nil {
			return Matcher{}, fmt.Errorf("matcher %q: %w", s, err)
		}
	}
	return m, nil
}

// ParseMatchers reads each of ss with ParseMatcher.
func ParseMatchers(ss []string) ([]Matcher, error) {
	out := make([]Matcher, 0, len(ss))
	for _, s := range ss {
		m, err := ParseMatcher(s)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// String is the matcher in Alertmanager's filter syntax, its value quoted with the escapes
// Alertmanager reads (\\, \" and \n).
func (m Matcher) String() string {
	op := "="
	switch {
	case m.IsRegex && m.IsEqual:
		op = "=~"
	case m.IsRegex:
		op = "!~"
	case !m.IsEqual:
		op = "!="
	}
	v := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(m.Value)
	return m.Name + op + `"` + v + `"`
}
