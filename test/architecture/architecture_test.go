package architecture

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const (
	docPath = "../../docs/architecture.md"
	// packagesHeading starts the section with the package table; walkHeading the walk of one NodeOperation.
	packagesHeading = "## Packages"
	walkHeading     = "## One NodeOperation, function by function"
)

// mustHaveRow are the trees whose every package the table must describe; other packages (cmd/*, bench,
// hack/*, the end-to-end suites) are programs and tests, checked when they have a row.
var mustHaveRow = []string{"api/", "internal/", "config"}

// TestImportTableMatchesTheCode checks, for every row of the package table, that the package imports
// exactly the nodeops packages its "may import" column names: one it imports without the table saying
// so is an undrawn dependency, and one the table names that it does not import is a stale line. For
// the test packages (test/...), what their tests import counts too.
func TestImportTableMatchesTheCode(t *testing.T) {
	mod, pkgs := goList(t)
	rows := packageRows(t)
	byPath := map[string]*goPackage{}
	for _, p := range pkgs {
		byPath[p.rel] = p
	}
	described := map[string]bool{}
	for _, r := range rows {
		p, ok := byPath[r.path]
		if !ok {
			if _, err := os.Stat(filepath.Join("..", "..", r.path)); err != nil {
				t.Errorf("row %q: no such package or directory", r.path)
			}
			continue // not Go (charts/nodeops)
		}
		described[r.path] = true
		allowed := map[string]bool{}
		for _, e := range r.mayImport {
			target, err := resolve(e, pkgs)
			if err != nil {
				if !importsExternal(p, e) {
					t.Errorf("row %q: may import %q: %v, and no import outside nodeops has it in its path", r.path, e, err)
				}
				continue
			}
			allowed[target] = true
		}
		actual := p.moduleImports(mod, strings.HasPrefix(r.path, "test/"))
		for _, imp := range actual {
			if !allowed[imp] {
				t.Errorf("%s imports %s, which its row's \"may import\" does not name", r.path, imp)
			}
		}
		for target := range allowed {
			if !slices.Contains(actual, target) {
				t.Errorf("row %q names %s in \"may import\", which the package does not import", r.path, target)
			}
		}
	}
	for _, p := range pkgs {
		for _, tree := range mustHaveRow {
			if (p.rel == tree || strings.HasPrefix(p.rel, tree)) && !described[p.rel] {
				t.Errorf("package %s has no row in %s's table", p.rel, docPath)
			}
		}
	}
}

// TestWalkNamesOnlyWhatExists checks that every function, method and type the walk names in backticks
// (`plan.Resolve`, `nodeoperation.(*Reconciler).Reconcile`, `skeleton.Steps`) is declared in that
// package, so a rename fails here instead of leaving the newcomer a dead end.
func TestWalkNamesOnlyWhatExists(t *testing.T) {
	_, pkgs := goList(t)
	names := walkNames(t)
	if len(names) < 15 {
		t.Fatalf("the walk names %d functions; it should name each one on the way (%v)", len(names), names)
	}
	decls := map[string]*declarations{}
	for _, n := range names {
		p, err := packageNamed(n.pkg, pkgs)
		if err != nil {
			t.Errorf("`%s`: %v", n.text, err)
			continue
		}
		d, ok := decls[p.rel]
		if !ok {
			d = parseDeclarations(t, p)
			decls[p.rel] = d
		}
		if err := d.check(n); err != nil {
			t.Errorf("`%s`: %v in %s", n.text, err, p.rel)
		}
	}
}

// TestEveryPackageHasADoc wants a package doc comment (or a command's) on every package: it says what
// the package owns and what it may not touch.
func TestEveryPackageHasADoc(t *testing.T) {
	_, pkgs := goList(t)
	for _, p := range pkgs {
		if p.Doc == "" {
			t.Errorf("package %s has no doc comment saying what it owns and may not touch", p.rel)
		}
	}
}

// TestChecksFindStaleLines runs the parsers on a doc made wrong on purpose.
func TestChecksFindStaleLines(t *testing.T) {
	row, err := parseRow("| `internal/plan` | pure planning | api, skeleton (`Steps`), — |")
	if err != nil || row.path != "internal/plan" || !slices.Equal(row.mayImport, []string{"api", "skeleton"}) {
		t.Errorf("parseRow = %+v, %v", row, err)
	}
	got := namesIn("`plan.Resolve`, `nodeoperation.(*Reconciler).Reconcile`, `skeleton.Steps.Observe`, `kubectl apply`, `status.commands[i]`, `(*Reconciler).run`")
	var texts []string
	for _, n := range got {
		texts = append(texts, n.text)
	}
	want := []string{"plan.Resolve", "nodeoperation.(*Reconciler).Reconcile", "skeleton.Steps.Observe", "(*Reconciler).run"}
	if !slices.Equal(texts, want) {
		t.Errorf("names = %q, want %q", texts, want)
	}
	d := &declarations{funcs: map[string]bool{"Resolve": true}, types: map[string]bool{"Reconciler": true},
		methods: map[string]bool{"*Reconciler.Reconcile": true}, fields: map[string]bool{}}
	for _, c := range []struct {
		text string
		ok   bool
	}{
		{"plan.Resolve", true}, {"plan.Resolved", false},
		{"p.(*Reconciler).Reconcile", true}, {"p.(*Reconciler).Run", false}, {"p.Reconciler.Reconcile", false},
		{"(*Reconciler).Reconcile", false},
	} {
		ns := namesIn("`" + c.text + "`")
		if len(ns) != 1 {
			t.Fatalf("%q: %d names", c.text, len(ns))
		}
		if err := d.check(ns[0]); (err == nil) != c.ok {
			t.Errorf("check(%q) = %v, want ok %v", c.text, err, c.ok)
		}
	}
}

type goPackage struct {
	ImportPath, Name, Dir, Doc                  string
	GoFiles, Imports, TestImports, XTestImports []string
	rel                                         string
}

// moduleImports are the nodeops packages p imports, relative to the module; with tests, its tests' too.
func (p *goPackage) moduleImports(mod string, tests bool) []string {
	all := p.Imports
	if tests {
		all = slices.Concat(all, p.TestImports, p.XTestImports)
	}
	var out []string
	for _, imp := range all {
		if rel, ok := strings.CutPrefix(imp, mod+"/"); ok && rel != p.rel && !slices.Contains(out, rel) {
			out = append(out, rel)
		}
	}
	slices.Sort(out)
	return out
}

// importsExternal reports whether a name the table gives, such as apimachinery, is an element of the
// path of something p imports from outside nodeops.
func importsExternal(p *goPackage, name string) bool {
	for _, imp := range p.Imports {
		if slices.Contains(strings.Split(imp, "/"), name) {
			return true
		}
	}
	return false
}

// goList lists the module's packages with go list, as the build sees them.
func goList(t *testing.T) (mod string, pkgs []*goPackage) {
	t.Helper()
	out, err := exec.Command("go", "list", "-m").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	mod = strings.TrimSpace(string(out))
	cmd := exec.Command("go", "list", "-json=ImportPath,Name,Dir,Doc,GoFiles,Imports,TestImports,XTestImports", "./...")
	cmd.Dir = filepath.Join("..", "..")
	out, err = cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := &goPackage{}
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		p.rel, _ = strings.CutPrefix(p.ImportPath, mod+"/")
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages; expected the whole module", len(pkgs))
	}
	return mod, pkgs
}

// resolve finds the package a table entry names: its path relative to the module, or its last
// elements (plan, agent/commands), or the one package under it (api for api/v1alpha1).
func resolve(entry string, pkgs []*goPackage) (string, error) {
	var found []string
	for _, p := range pkgs {
		if p.rel == entry || strings.HasSuffix(p.rel, "/"+entry) {
			found = append(found, p.rel)
		}
	}
	if len(found) == 0 {
		for _, p := range pkgs {
			if strings.HasPrefix(p.rel, entry+"/") {
				found = append(found, p.rel)
			}
		}
	}
	switch len(found) {
	case 0:
		return "", errors.New("no nodeops package by that name")
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("ambiguous: %v", found)
}

// packageNamed is the one package whose Go name is name (the walk writes plan.Resolve, not its path).
func packageNamed(name string, pkgs []*goPackage) (*goPackage, error) {
	var found []*goPackage
	for _, p := range pkgs {
		if p.Name == name {
			found = append(found, p)
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("no nodeops package is named %s", name)
	case 1:
		return found[0], nil
	}
	return nil, fmt.Errorf("%d packages are named %s", len(found), name)
}

// section is the text of the doc from the line heading to the next heading of its level.
func section(t *testing.T, heading string) string {
	t.Helper()
	doc, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("%s has no line %q", docPath, heading)
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

type row struct {
	path      string
	mayImport []string
}

func packageRows(t *testing.T) []row {
	t.Helper()
	var rows []row
	sc := bufio.NewScanner(strings.NewReader(section(t, packagesHeading)))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		r, err := parseRow(line)
		if err != nil {
			t.Errorf("%v: %q", err, line)
			continue
		}
		rows = append(rows, r)
	}
	if len(rows) < 20 {
		t.Fatalf("the package table has %d rows", len(rows))
	}
	return rows
}

// parseRow reads "| `path` | owns | may import |": the entries are comma-separated names, each
// perhaps followed by a parenthesis saying what of it is used; — is none.
func parseRow(line string) (row, error) {
	cells := strings.Split(strings.Trim(line, "| "), " | ")
	if len(cells) != 3 {
		return row{}, fmt.Errorf("a row has %d cells, want 3 (package, owns, may import)", len(cells))
	}
	r := row{path: strings.TrimSuffix(strings.Trim(cells[0], "`"), "/")}
	depth, start := 0, 0
	col := cells[2] + ","
	for i, c := range col {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth > 0 {
				continue
			}
			e := col[start:i]
			if j := strings.Index(e, "("); j >= 0 {
				e = e[:j]
			}
			if e = strings.TrimSpace(e); e != "" && e != "—" {
				r.mayImport = append(r.mayImport, e)
			}
			start = i + 1
		}
	}
	return r, nil
}

// name is one backticked reference in the walk: pkg.Func, pkg.Type, pkg.Type.Method (or field) or
// pkg.(*Type).Method.
type name struct {
	text, pkg, typ, member string
	pointer                bool
}

var (
	backticked = regexp.MustCompile("`([^`]+)`")
	reference  = regexp.MustCompile(`^(?:([a-z][a-z0-9]*)\.)?(?:\(\*([A-Za-z_]\w*)\)\.([A-Za-z_]\w*)|([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?)$`)
)

func walkNames(t *testing.T) []name {
	t.Helper()
	return namesIn(section(t, walkHeading))
}

// namesIn finds the references in text; words without a dot (`kubectl apply`, `Succeeded`) are not.
func namesIn(text string) []name {
	var out []name
	for _, m := range backticked.FindAllStringSubmatch(text, -1) {
		s := m[1]
		if !strings.Contains(s, ".") {
			continue
		}
		g := reference.FindStringSubmatch(s)
		if g == nil {
			continue
		}
		n := name{text: s, pkg: g[1]}
		switch {
		case g[2] != "":
			n.typ, n.member, n.pointer = g[2], g[3], true
		case g[5] != "":
			n.typ, n.member = g[4], g[5]
		default:
			n.member = g[4]
		}
		out = append(out, n)
	}
	return out
}

// declarations are what a package declares at its top level.
type declarations struct {
	funcs, types map[string]bool
	// methods by "Type.Method" or "*Type.Method"; fields by "Type.Field".
	methods, fields map[string]bool
}

func parseDeclarations(t *testing.T, p *goPackage) *declarations {
	t.Helper()
	d := &declarations{funcs: map[string]bool{}, types: map[string]bool{}, methods: map[string]bool{}, fields: map[string]bool{}}
	fset := token.NewFileSet()
	for _, f := range p.GoFiles {
		file, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Recv == nil {
					d.funcs[decl.Name.Name] = true
					continue
				}
				typ, star := decl.Recv.List[0].Type, ""
				if s, ok := typ.(*ast.StarExpr); ok {
					typ, star = s.X, "*"
				}
				if ix, ok := typ.(*ast.IndexExpr); ok { // a generic receiver, T[S]
					typ = ix.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					d.methods[star+id.Name+"."+decl.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					switch spec := spec.(type) {
					case *ast.TypeSpec:
						d.types[spec.Name.Name] = true
						if st, ok := spec.Type.(*ast.StructType); ok {
							for _, f := range st.Fields.List {
								for _, n := range f.Names {
									d.fields[spec.Name.Name+"."+n.Name] = true
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range spec.Names {
							d.funcs[n.Name] = true // a var or const is named the same way
						}
					}
				}
			}
		}
	}
	return d
}

func (d *declarations) check(n name) error {
	switch {
	case n.pkg == "":
		return errors.New("name its package, as in plan.Resolve or agent.(*Reconciler).Reconcile")
	case n.typ == "":
		if !d.funcs[n.member] && !d.types[n.member] {
			return errors.New("no such function, type, variable or constant")
		}
	case !d.types[n.typ]:
		return fmt.Errorf("no type %s", n.typ)
	case n.pointer:
		if !d.methods["*"+n.typ+"."+n.member] && !d.methods[n.typ+"."+n.member] {
			return fmt.Errorf("no method %s on *%s", n.member, n.typ)
		}
	default:
		if !d.methods[n.typ+"."+n.member] && !d.fields[n.typ+"."+n.member] {
			return fmt.Errorf("no method with a value receiver or field %s on %s (a pointer method is written (*%s).%s)", n.member, n.typ, n.typ, n.member)
		}
	}
	return nil
}
