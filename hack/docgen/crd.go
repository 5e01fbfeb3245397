package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// The kinds in the order a reader meets them (docs/design.md): an operation, its tasks, then the
// two kinds that generate operations and tasks.
var kindOrder = []string{"NodeOperation", "NodeTask", "NodeProfile", "ClusterTarget"}

// externalTypes are the types from other packages the API uses: what a reader types in YAML, and
// where Kubernetes documents it.
var externalTypes = map[string]string{
	"metav1.ObjectMeta":    "[ObjectMeta](https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/object-meta/)",
	"metav1.LabelSelector": "[LabelSelector](https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/label-selector/)",
	"metav1.Condition":     "[Condition](https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/condition/)",
	"metav1.Duration":      "duration string (`30s`, `5m`, `1h30m`)",
	"metav1.Time":          "time (RFC 3339)",
	"metav1.MicroTime":     "time (RFC 3339, microseconds)",
	"intstr.IntOrString":   "integer or string",
	"corev1.Toleration":    "[Toleration](https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#scheduling)",
	"corev1.PullPolicy":    "string (`Always`, `IfNotPresent`, `Never`)",
}

// apiType is one named type of api/v1alpha1 as its source declares it.
type apiType struct {
	name    string
	doc     []string // comment lines that are not markers
	markers []string // "+kubebuilder:...", "+optional", ... without the "+"
	strct   *ast.StructType
	under   string // the underlying type of a non-struct type (string for enums)
	consts  []apiConst
}

type apiConst struct {
	value string
	doc   string
}

// loadAPI parses the Go files of dir (not tests, not generated code) into its named types.
func loadAPI(dir string) (map[string]*apiType, error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	types := map[string]*apiType{}
	var files []*ast.File
	for _, e := range entries {
		n := e.Name()
		// Generated rule carriers (command kinds, immutability) are read for their markers.
		rulesOnly := n == "zz_generated.commandkinds.go" || n == "zz_generated.immutable.go"
		if !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") || strings.HasPrefix(n, "zz_generated") && !rulesOnly {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				ts := s.(*ast.TypeSpec)
				cg := ts.Doc
				if cg == nil {
					cg = g.Doc
				}
				t := &apiType{name: ts.Name.Name}
				t.doc, t.markers = splitComment(cg)
				if cg != nil {
					// Markers may sit in their own comment group just above the doc comment
					// (hack/commandkinds and hack/immutablerules write them so); controller-gen reads it.
					for i, c := range f.Comments {
						if c == cg && i > 0 && fset.Position(cg.Pos()).Line-fset.Position(f.Comments[i-1].End()).Line <= 2 {
							_, above := splitComment(f.Comments[i-1])
							t.markers = append(above, t.markers...)
						}
					}
				}
				switch u := ts.Type.(type) {
				case *ast.StructType:
					t.strct = u
				case *ast.Ident:
					t.under = u.Name
				default:
					continue // interfaces and the like are not part of the schema
				}
				types[t.name] = t
			}
		}
	}
	// Constants of a string type are its documented values (enums).
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				id, ok := vs.Type.(*ast.Ident)
				if !ok || len(vs.Values) != 1 {
					continue
				}
				t := types[id.Name]
				lit, ok := vs.Values[0].(*ast.BasicLit)
				if t == nil || !ok || lit.Kind != token.STRING {
					continue
				}
				v, err := strconv.Unquote(lit.Value)
				if err != nil {
					return nil, err
				}
				doc, _ := splitComment(vs.Doc)
				t.consts = append(t.consts, apiConst{value: v, doc: strings.Join(doc, " ")})
			}
		}
	}
	return types, nil
}

// splitComment separates a comment's prose from its markers (lines starting with "+").
func splitComment(cg *ast.CommentGroup) (doc, markers []string) {
	if cg == nil {
		return nil, nil
	}
	for _, l := range strings.Split(cg.Text(), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "":
		case strings.HasPrefix(l, "+"):
			markers = append(markers, l[1:])
		default:
			doc = append(doc, l)
		}
	}
	return doc, markers
}

func markerValue(markers []string, name string) (string, bool) {
	for _, m := range markers {
		if v, ok := strings.CutPrefix(m, name+"="); ok {
			return v, true
		}
		if m == name {
			return "", true
		}
	}
	return "", false
}

var messageRE = regexp.MustCompile(`message="((?:[^"\\]|\\.)*)"`)

// rules are the messages of a comment's CEL rules: what the API server answers when one fails.
func rules(markers []string) []string {
	var out []string
	for _, m := range markers {
		if !strings.HasPrefix(m, "kubebuilder:validation:XValidation:") {
			continue
		}
		if sm := messageRE.FindStringSubmatch(m); sm != nil {
			msg, err := strconv.Unquote(`"` + sm[1] + `"`)
			if err != nil {
				msg = sm[1]
			}
			out = append(out, msg)
		}
	}
	return out
}

// crdReference renders docs/reference/api.md from the types in apiDir.
func crdReference(apiDir string) (string, error) {
	types, err := loadAPI(apiDir)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(generatedHeader("api/v1alpha1 (the Go types the CRDs are generated from)"))
	b.WriteString("# API reference\n\n")
	b.WriteString("Every kind is in the API group `nodeops.io`, version `v1alpha1`, and is cluster-scoped.\n")
	b.WriteString("A field is required unless it says optional. Rules are checked by the API server: a\n")
	b.WriteString("request that breaks one is refused with the message shown.\n\n")

	// Types are listed after the kinds, each once, in the order the kinds first reach them.
	var order []string
	seen := map[string]bool{}
	var visit func(name string)
	visit = func(name string) {
		t := types[name]
		if t == nil || seen[name] || !ast.IsExported(name) {
			return // an unexported type only carries rules, shown on the type embedding it
		}
		seen[name] = true
		order = append(order, name)
		if t.strct == nil {
			return
		}
		for _, f := range t.strct.Fields.List {
			for _, n := range localTypes(f.Type) {
				visit(n)
			}
		}
	}
	for _, k := range kindOrder {
		kt := types[k]
		if kt == nil || kt.strct == nil {
			return "", fmt.Errorf("kind %s not found in %s", k, apiDir)
		}
		seen[k] = true
	}
	// A new kind must be placed in kindOrder, or it would silently be left out of the page.
	var roots []string
	for name, t := range types {
		if _, ok := markerValue(t.markers, "kubebuilder:object:root"); ok && !strings.HasSuffix(name, "List") {
			roots = append(roots, name)
		}
	}
	sort.Strings(roots)
	if want := append([]string(nil), kindOrder...); !equalSorted(roots, want) {
		return "", fmt.Errorf("the API's kinds are %v but hack/docgen's kindOrder is %v", roots, kindOrder)
	}

	b.WriteString("## Kinds\n\n")
	for _, k := range kindOrder {
		kt := types[k]
		fmt.Fprintf(&b, "### %s\n\n", k)
		writeDoc(&b, kt.doc)
		res, _ := markerValue(kt.markers, "kubebuilder:resource")
		for _, part := range strings.Split(res, ",") {
			if v, ok := strings.CutPrefix(part, "shortName="); ok {
				fmt.Fprintf(&b, "Short names: %s.\n\n", codeList(strings.Split(v, ";")))
			}
		}
		fmt.Fprintf(&b, "- **`apiVersion`** string: `nodeops.io/v1alpha1`\n")
		fmt.Fprintf(&b, "- **`kind`** string: `%s`\n", k)
		writeFields(&b, types, kt)
		b.WriteString("\n")
		for _, f := range kt.strct.Fields.List {
			for _, n := range localTypes(f.Type) {
				visit(n)
			}
		}
	}
	b.WriteString("## Types\n\n")
	for _, name := range order {
		t := types[name]
		fmt.Fprintf(&b, "### %s\n\n", name)
		writeDoc(&b, t.doc)
		if t.strct == nil {
			fmt.Fprintf(&b, "Type: %s.\n\n", t.under)
			if enum, ok := markerValue(t.markers, "kubebuilder:validation:Enum"); ok {
				fmt.Fprintf(&b, "One of: %s.\n\n", codeList(strings.Split(enum, ";")))
			}
			var documented []apiConst
			for _, c := range t.consts {
				if c.doc != "" {
					documented = append(documented, c)
				}
			}
			for _, c := range documented {
				fmt.Fprintf(&b, "- `%s`: %s\n", c.value, escapeHTML(c.doc))
			}
			if len(documented) > 0 {
				b.WriteString("\n")
			}
			continue
		}
		for _, r := range append(rules(t.markers), embeddedRules(types, t)...) {
			fmt.Fprintf(&b, "Rule: %s.\n\n", escapeHTML(strings.TrimSuffix(r, ".")))
		}
		if len(fieldsOf(t)) == 0 {
			b.WriteString("No fields: write it as `{}`.\n\n")
			continue
		}
		writeFields(&b, types, t)
		b.WriteString("\n")
	}
	return b.String(), nil
}

func equalSorted(a, b []string) bool {
	sort.Strings(b)
	return strings.Join(a, ",") == strings.Join(b, ",")
}

type field struct {
	json     string
	optional bool
	expr     ast.Expr
	doc      []string
	markers  []string
}

// fieldsOf are a struct's serialized fields; TypeMeta is written out by the caller.
func fieldsOf(t *apiType) []field {
	var out []field
	for _, f := range t.strct.Fields.List {
		if f.Tag == nil {
			continue
		}
		tag, _ := strconv.Unquote(f.Tag.Value)
		j := reflect.StructTag(tag).Get("json")
		name, opts, _ := strings.Cut(j, ",")
		if name == "" || name == "-" {
			continue // inline TypeMeta
		}
		doc, markers := splitComment(f.Doc)
		_, opt := markerValue(markers, "optional")
		if strings.Contains(opts, "omitempty") {
			opt = true
		}
		if _, ok := markerValue(markers, "kubebuilder:validation:Optional"); ok {
			opt = true
		}
		if _, ok := markerValue(markers, "kubebuilder:validation:Required"); ok {
			opt = false
		}
		out = append(out, field{json: name, optional: opt, expr: f.Type, doc: doc, markers: markers})
	}
	return out
}

func writeFields(b *strings.Builder, types map[string]*apiType, t *apiType) {
	for _, f := range fieldsOf(t) {
		typ := typeString(types, f.expr)
		if _, ok := markerValue(f.markers, "kubebuilder:validation:XIntOrString"); ok {
			typ = "integer or string"
		}
		req := "required"
		if f.optional {
			req = "optional"
		}
		fmt.Fprintf(b, "- **`%s`** %s, %s", f.json, typ, req)
		doc := f.doc
		if len(doc) == 0 {
			// A field without a comment (each kind of Command) is what its type says it is.
			if names := localTypes(f.expr); len(names) == 1 && types[names[0]] != nil {
				doc = types[names[0]].doc
			}
		}
		if len(doc) > 0 {
			fmt.Fprintf(b, ": %s", escapeHTML(strings.Join(doc, " ")))
		}
		b.WriteString("\n")
		for _, c := range constraints(f.markers) {
			fmt.Fprintf(b, "    - %s\n", c)
		}
	}
	for _, f := range t.strct.Fields.List {
		// An inlined struct's fields are serialized as the embedding struct's own: name them.
		id, ok := f.Type.(*ast.Ident)
		if len(f.Names) != 0 || !ok || !ast.IsExported(id.Name) || f.Tag == nil || !strings.Contains(f.Tag.Value, `json:",inline"`) || types[id.Name] == nil {
			continue
		}
		var names []string
		for _, g := range fieldsOf(types[id.Name]) {
			names = append(names, "`"+g.json+"`")
		}
		fmt.Fprintf(b, "- %s, inlined from %s\n", strings.Join(names, ", "), typeString(types, id))
	}
}

// constraints are a field's defaults and validation markers, in words.
func constraints(markers []string) []string {
	var out []string
	if v, ok := markerValue(markers, "kubebuilder:default"); ok {
		out = append(out, fmt.Sprintf("Default: `%s`.", v))
	}
	words := []struct{ marker, text string }{
		{"kubebuilder:validation:Enum", "One of: %s."},
		{"kubebuilder:validation:Minimum", "Minimum: %s."},
		{"kubebuilder:validation:Maximum", "Maximum: %s."},
		{"kubebuilder:validation:MinLength", "Minimum length: %s."},
		{"kubebuilder:validation:MaxLength", "Maximum length: %s."},
		{"kubebuilder:validation:MinItems", "Minimum items: %s."},
		{"kubebuilder:validation:MaxItems", "Maximum items: %s."},
		{"kubebuilder:validation:MaxProperties", "Maximum entries: %s."},
		{"kubebuilder:validation:Pattern", "Pattern: %s."},
		{"kubebuilder:validation:items:Enum", "Each item one of: %s."},
		{"kubebuilder:validation:items:MaxLength", "Each item's maximum length: %s."},
		{"kubebuilder:validation:items:Pattern", "Each item's pattern: %s."},
	}
	for _, w := range words {
		v, ok := markerValue(markers, w.marker)
		if !ok {
			continue
		}
		switch {
		case strings.HasSuffix(w.marker, "Enum"):
			v = codeList(strings.Split(v, ";"))
		case strings.HasSuffix(w.marker, "Pattern"):
			v = "`" + strings.Trim(v, "`") + "`"
		}
		out = append(out, fmt.Sprintf(w.text, v))
	}
	if v, ok := markerValue(markers, "listMapKey"); ok {
		out = append(out, fmt.Sprintf("Items are unique by `%s`.", v))
	} else if v, _ := markerValue(markers, "listType"); v == "set" {
		out = append(out, "Items are unique.")
	}
	for _, r := range rules(markers) {
		out = append(out, fmt.Sprintf("Rule: %s.", escapeHTML(strings.TrimSuffix(r, "."))))
	}
	return out
}

// typeString names a field's type as YAML sees it, linking the API's own types to their section.
func typeString(types map[string]*apiType, e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return typeString(types, x.X)
	case *ast.ArrayType:
		if id, ok := x.Elt.(*ast.Ident); ok && id.Name == "byte" {
			return "bytes (base64)"
		}
		return "list of " + typeString(types, x.Elt)
	case *ast.MapType:
		return "map of " + typeString(types, x.Key) + " to " + typeString(types, x.Value)
	case *ast.SelectorExpr:
		name := fmt.Sprintf("%s.%s", x.X.(*ast.Ident).Name, x.Sel.Name)
		if s, ok := externalTypes[name]; ok {
			return s
		}
		return "`" + name + "`"
	case *ast.Ident:
		if t := types[x.Name]; t != nil {
			return fmt.Sprintf("[%s](#%s)", x.Name, strings.ToLower(x.Name))
		}
		switch x.Name {
		case "int32", "int64", "int":
			return "integer"
		case "bool":
			return "boolean"
		}
		return x.Name
	}
	return fmt.Sprintf("%T", e)
}

// localTypes are the API's own types a field's type names.
func localTypes(e ast.Expr) []string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return localTypes(x.X)
	case *ast.ArrayType:
		return localTypes(x.Elt)
	case *ast.MapType:
		return append(localTypes(x.Key), localTypes(x.Value)...)
	case *ast.Ident:
		return []string{x.Name}
	}
	return nil
}

func writeDoc(b *strings.Builder, doc []string) {
	doc = []string{escapeHTML(strings.Join(doc, " "))}
	if len(doc) > 0 {
		b.WriteString(strings.Join(doc, " "))
		b.WriteString("\n\n")
	}
}

func codeList(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = "`" + v + "`"
	}
	return strings.Join(q, ", ")
}

// embeddedRules are the rules of the unexported types t embeds to carry generated rules
// (commandKindRule, operationImmutableRules, ...): the CRD holds them on t.
func embeddedRules(types map[string]*apiType, t *apiType) []string {
	var out []string
	for _, f := range t.strct.Fields.List {
		id, ok := f.Type.(*ast.Ident)
		if len(f.Names) != 0 || !ok || ast.IsExported(id.Name) || types[id.Name] == nil {
			continue
		}
		out = append(out, rules(types[id.Name].markers)...)
	}
	return out
}
