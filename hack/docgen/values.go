package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// schema is the part of JSON Schema values.schema.json uses.
type schema struct {
	Type                 any                `json:"type"`
	Description          string             `json:"description"`
	Properties           map[string]*schema `json:"properties"`
	Required             []string           `json:"required"`
	Items                *schema            `json:"items"`
	AdditionalProperties any                `json:"additionalProperties"`
	Enum                 []any              `json:"enum"`
	Pattern              string             `json:"pattern"`
	MinLength            *int               `json:"minLength"`
	MaxLength            *int               `json:"maxLength"`
	Minimum              *float64           `json:"minimum"`
	Maximum              *float64           `json:"maximum"`
	ExclusiveMinimum     *float64           `json:"exclusiveMinimum"`
}

// valuesReference renders docs/reference/values.md: every value the schema knows, with its
// default and the comment above it from values.yaml, or the schema's description.
func valuesReference(schemaPath, valuesPath string) (string, error) {
	raw, err := os.ReadFile(schemaPath)
	if err != nil {
		return "", err
	}
	var root schema
	if err := json.Unmarshal(raw, &root); err != nil {
		return "", fmt.Errorf("%s: %w", schemaPath, err)
	}
	raw, err = os.ReadFile(valuesPath)
	if err != nil {
		return "", err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return "", fmt.Errorf("%s: %w", valuesPath, err)
	}
	var values *yaml.Node
	if len(doc.Content) == 1 {
		values = doc.Content[0]
	}

	var b strings.Builder
	b.WriteString(generatedHeader("charts/nodeops/values.schema.json and values.yaml"))
	b.WriteString("# Helm chart values\n\n")
	b.WriteString("The values of the chart in `charts/nodeops`. `helm install` checks every value against the chart's\n")
	b.WriteString("`values.schema.json` and refuses an unknown key or a wrong type, naming the value.\n\n")
	for _, key := range sortedProps(&root) {
		fmt.Fprintf(&b, "## %s\n\n", key)
		writeValue(&b, key, root.Properties[key], contains(root.Required, key), lookup(values, key))
		b.WriteString("\n")
	}
	return b.String(), nil
}

// sortedProps are a schema object's keys by name.
func sortedProps(s *schema) []string {
	keys := make([]string, 0, len(s.Properties))
	for k := range s.Properties {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

type yamlEntry struct {
	key, value *yaml.Node
}

func lookup(m *yaml.Node, key string) yamlEntry {
	if m == nil || m.Kind != yaml.MappingNode {
		return yamlEntry{}
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return yamlEntry{m.Content[i], m.Content[i+1]}
		}
	}
	return yamlEntry{}
}

func writeValue(b *strings.Builder, path string, s *schema, required bool, v yamlEntry) {
	nested := len(s.Properties) > 0
	fmt.Fprintf(b, "- **`%s`** %s", path, schemaType(s))
	if required {
		b.WriteString(", required")
	}
	if v.value != nil && !nested {
		fmt.Fprintf(b, ", default `%s`", compactYAML(v.value))
	}
	// values.yaml's comment says the most (it is what a reader of the chart sees); the schema's
	// description stands in where values.yaml has none.
	desc := s.Description
	if v.key != nil && v.key.HeadComment != "" {
		desc = comment(v.key.HeadComment)
	}
	if desc != "" {
		fmt.Fprintf(b, ": %s", escapeHTML(strings.TrimSuffix(desc, ".")+"."))
	}
	b.WriteString("\n")
	for _, c := range schemaConstraints(s) {
		fmt.Fprintf(b, "    - %s\n", c)
	}
	for _, k := range sortedProps(s) {
		var child yamlEntry
		if v.value != nil {
			child = lookup(v.value, k)
		}
		writeValue(b, path+"."+k, s.Properties[k], contains(s.Required, k), child)
	}
}

func schemaType(s *schema) string {
	var names []string
	switch t := s.Type.(type) {
	case string:
		names = []string{t}
	case []any:
		for _, x := range t {
			names = append(names, fmt.Sprint(x))
		}
	}
	for i, n := range names {
		switch {
		case n == "array" && s.Items != nil:
			names[i] = "list of " + schemaType(s.Items)
		case n == "object" && len(s.Properties) == 0:
			if ap, ok := s.AdditionalProperties.(map[string]any); ok {
				names[i] = fmt.Sprintf("map of %v", ap["type"])
			}
		}
	}
	if len(names) == 0 {
		return "any"
	}
	return strings.Join(names, " or ")
}

func schemaConstraints(s *schema) []string {
	var out []string
	if len(s.Enum) > 0 {
		vs := make([]string, len(s.Enum))
		for i, e := range s.Enum {
			vs[i] = fmt.Sprint(e)
		}
		out = append(out, fmt.Sprintf("One of: %s.", codeList(vs)))
	}
	if s.Minimum != nil {
		out = append(out, fmt.Sprintf("Minimum: %v.", *s.Minimum))
	}
	if s.ExclusiveMinimum != nil {
		out = append(out, fmt.Sprintf("Greater than %v.", *s.ExclusiveMinimum))
	}
	if s.Maximum != nil {
		out = append(out, fmt.Sprintf("Maximum: %v.", *s.Maximum))
	}
	if s.MinLength != nil {
		out = append(out, fmt.Sprintf("Minimum length: %d.", *s.MinLength))
	}
	if s.MaxLength != nil {
		out = append(out, fmt.Sprintf("Maximum length: %d.", *s.MaxLength))
	}
	if s.Pattern != "" {
		out = append(out, fmt.Sprintf("Pattern: `%s`.", s.Pattern))
	}
	if s.Items != nil && len(s.Items.Properties) > 0 {
		var fields []string
		for _, k := range sortedProps(s.Items) {
			f := "`" + k + "` " + schemaType(s.Items.Properties[k])
			if contains(s.Items.Required, k) {
				f += " (required)"
			}
			fields = append(fields, f)
		}
		out = append(out, fmt.Sprintf("Each item has: %s.", strings.Join(fields, ", ")))
	}
	return out
}

// compactYAML writes a default on one line, as JSON (which YAML reads), keys sorted.
func compactYAML(n *yaml.Node) string {
	var v any
	if err := n.Decode(&v); err != nil {
		return n.Value
	}
	out, err := json.Marshal(v)
	if err != nil {
		return n.Value
	}
	return string(out)
}

// comment turns a YAML head comment into one line of prose.
func comment(c string) string {
	var lines []string
	for _, l := range strings.Split(c, "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "#"))
		if l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, " ")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
