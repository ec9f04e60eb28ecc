// Command storegen writes the methods of sqlite.Store and postgres.Store:
// each forwards to the framework's one SQL implementation
// (framework/internal/sqlstore), under the doc comment of the driver
// interface method it implements, so that go doc of either Store shows
// every method with its contract, written once.
//
// It is run by go generate in framework/sqlite and framework/postgres
// (go generate ./framework/...), and writes store_methods.go in the
// package it runs for ($GOPACKAGE, in the current directory). It loads the
// compiled packages through go list -export for the methods' signatures,
// and parses framework/driver for their doc comments. TestGenerated fails
// when a checked-in file differs from what it would write.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/format"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

const (
	modulePath   = "github.com/effectively-once/effectively"
	driverPath   = modulePath + "/framework/driver"
	sqlstorePath = modulePath + "/framework/internal/sqlstore"
	// Output is the name of the file written in each store package.
	Output = "store_methods.go"
)

// margin is the longest line of a doc comment, without its "// ".
const margin = 72

// interfaces are the driver interfaces a SQL store implements, in the
// order their methods are written. An exported method of sqlstore.Store in
// none of them (MarkMany, which group commit finds by type assertion)
// comes last, under sqlstore's own doc comment.
var interfaces = []string{"Store", "Inspector", "Purger", "Gauges", "Leases", "SessionEnder", "BulkJobs"}

// Packages are the store packages whose Store forwards to sqlstore.Store,
// relative to the module's root.
var Packages = []string{"framework/postgres", "framework/sqlite"}

func main() {
	out := flag.String("o", Output, "file to write")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "storegen:", err)
		os.Exit(1)
	}
}

func run(out string) error {
	pkg := os.Getenv("GOPACKAGE")
	if pkg == "" {
		return errors.New("GOPACKAGE is not set: run through go generate")
	}
	root, err := ModuleRoot(".")
	if err != nil {
		return err
	}
	src, err := Generate(root, pkg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, src, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	return nil
}

// ModuleRoot returns the directory of the go.mod above dir.
func ModuleRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("module root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("module root: no go.mod above the current directory")
		}
		dir = parent
	}
}

// method is one forwarding method to write.
type method struct {
	name  string
	doc   string // without comment markers, ending in a newline
	iface string // "driver.Store", or "" for a method of no interface
	sig   *types.Signature
}

// Generate returns the source of store_methods.go for the store package
// named pkg, from the packages of the module at root.
func Generate(root, pkg string) ([]byte, error) {
	driverPkg, storePkg, err := load(root)
	if err != nil {
		return nil, err
	}
	obj := storePkg.Scope().Lookup("Store")
	if obj == nil {
		return nil, errors.New("sqlstore: no type Store")
	}
	mset := types.NewMethodSet(types.NewPointer(obj.Type()))
	impl := map[string]*types.Func{}
	for sel := range mset.Methods() {
		if f := sel.Obj().(*types.Func); f.Exported() {
			impl[f.Name()] = f
		}
	}

	ifaceDocs, err := interfaceDocs(filepath.Join(root, "framework", "driver"))
	if err != nil {
		return nil, err
	}
	var methods []method
	done := map[string]bool{}
	for _, name := range interfaces {
		for _, m := range ifaceDocs[name] {
			f, ok := impl[m.name]
			if !ok {
				return nil, fmt.Errorf("sqlstore.Store has no method %s of driver.%s", m.name, name)
			}
			if done[m.name] {
				continue
			}
			done[m.name] = true
			sig, err := interfaceMethod(driverPkg, name, m.name)
			if err != nil {
				return nil, err
			}
			if !types.Identical(sig, f.Signature()) {
				return nil, fmt.Errorf("sqlstore.Store.%s is not driver.%s.%[1]s", m.name, name)
			}
			// The interface's parameter names, which its doc names.
			methods = append(methods, method{name: m.name, doc: m.doc, iface: "driver." + name, sig: sig})
		}
	}
	var rest []string
	for name := range impl {
		if !done[name] {
			rest = append(rest, name)
		}
	}
	slices.Sort(rest)
	if len(rest) > 0 {
		implDocs, err := methodDocs(filepath.Join(root, "framework", "internal", "sqlstore"), "Store")
		if err != nil {
			return nil, err
		}
		for _, name := range rest {
			doc, ok := implDocs[name]
			if !ok || doc == "" {
				return nil, fmt.Errorf("sqlstore.Store.%s has no doc comment", name)
			}
			methods = append(methods, method{name: name, doc: doc, sig: impl[name].Signature()})
		}
	}
	return write(pkg, methods)
}

// interfaceMethod returns the signature of method name of the interface
// iface of package p.
func interfaceMethod(p *types.Package, iface, name string) (*types.Signature, error) {
	obj := p.Scope().Lookup(iface)
	if obj == nil {
		return nil, fmt.Errorf("driver: no type %s", iface)
	}
	it, ok := obj.Type().Underlying().(*types.Interface)
	if !ok {
		return nil, fmt.Errorf("driver.%s is not an interface", iface)
	}
	for m := range it.Methods() {
		if m.Name() == name {
			return m.Signature(), nil
		}
	}
	return nil, fmt.Errorf("driver.%s has no method %s", iface, name)
}

// load returns the packages driver and sqlstore, from the export data
// that go list -export writes.
func load(root string) (driverPkg, storePkg *types.Package, err error) {
	cmd := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}", sqlstorePath)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("go list -export: %w: %s", err, stderr.String())
	}
	exports := map[string]string{}
	for line := range strings.Lines(string(out)) {
		path, file, _ := strings.Cut(strings.TrimSpace(line), "\t")
		exports[path] = file
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file := exports[path]
		if file == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
	if driverPkg, err = imp.Import(driverPath); err != nil {
		return nil, nil, fmt.Errorf("import %s: %w", driverPath, err)
	}
	if storePkg, err = imp.Import(sqlstorePath); err != nil {
		return nil, nil, fmt.Errorf("import %s: %w", sqlstorePath, err)
	}
	return driverPkg, storePkg, nil
}

// docMethod is a method of an interface with its doc comment.
type docMethod struct {
	name, doc string
}

// interfaceDocs returns the methods of each interface type declared in the
// package in dir, in source order, with their doc comments.
func interfaceDocs(dir string) (map[string][]docMethod, error) {
	files, err := parseDir(dir)
	if err != nil {
		return nil, err
	}
	docs := map[string][]docMethod{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			spec, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			it, ok := spec.Type.(*ast.InterfaceType)
			if !ok {
				return false
			}
			for _, field := range it.Methods.List {
				for _, name := range field.Names {
					docs[spec.Name.Name] = append(docs[spec.Name.Name], docMethod{name: name.Name, doc: field.Doc.Text()})
				}
			}
			return false
		})
	}
	for _, name := range interfaces {
		if len(docs[name]) == 0 {
			return nil, fmt.Errorf("driver: no interface %s", name)
		}
		for _, m := range docs[name] {
			if m.doc == "" {
				return nil, fmt.Errorf("driver.%s.%s has no doc comment", name, m.name)
			}
		}
	}
	return docs, nil
}

// methodDocs returns the doc comments of the methods of type typ declared
// in the package in dir.
func methodDocs(dir, typ string) (map[string]string, error) {
	files, err := parseDir(dir)
	if err != nil {
		return nil, err
	}
	docs := map[string]string{}
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || len(fn.Recv.List) != 1 {
				continue
			}
			rt := fn.Recv.List[0].Type
			if star, ok := rt.(*ast.StarExpr); ok {
				rt = star.X
			}
			if id, ok := rt.(*ast.Ident); ok && id.Name == typ {
				docs[fn.Name.Name] = fn.Doc.Text()
			}
		}
	}
	return docs, nil
}

// parseDir parses the non-test Go files of dir, with their comments.
func parseDir(dir string) ([]*ast.File, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", dir, err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("parse: %w", err)
		}
		files = append(files, f)
	}
	return files, nil
}

// write returns the formatted file of package pkg with methods.
func write(pkg string, methods []method) ([]byte, error) {
	imports := map[string]string{} // path to name
	qualify := func(p *types.Package) string {
		imports[p.Path()] = p.Name()
		return p.Name()
	}
	var body bytes.Buffer
	for _, m := range methods {
		body.WriteString("\n")
		body.WriteString(comment(m.doc, m.iface))
		params, args := tuple(m.sig.Params(), m.sig.Variadic(), qualify, true)
		results, _ := tuple(m.sig.Results(), false, qualify, false)
		if m.sig.Results().Len() > 1 {
			results = "(" + results + ")"
		}
		fmt.Fprintf(&body, "func (s *Store) %s(%s) %s {\n", m.name, params, results)
		ret := "return "
		if m.sig.Results().Len() == 0 {
			ret = ""
		}
		fmt.Fprintf(&body, "\t%ss.sql.%s(%s)\n}\n", ret, m.name, args)
	}

	var src bytes.Buffer
	src.WriteString("// Code generated by internal/tools/storegen; DO NOT EDIT.\n\n")
	fmt.Fprintf(&src, "package %s\n\nimport (\n", pkg)
	paths := make([]string, 0, len(imports))
	for p := range imports {
		paths = append(paths, p)
	}
	// Standard library first, then the module's packages, as goimports
	// groups them.
	slices.SortFunc(paths, func(a, b string) int {
		if sa, sb := !strings.Contains(a, "."), !strings.Contains(b, "."); sa != sb {
			if sa {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	std := true
	for _, p := range paths {
		if std && strings.Contains(p, ".") {
			std = false
			src.WriteString("\n")
		}
		if name := imports[p]; name != filepath.Base(p) {
			fmt.Fprintf(&src, "\t%s %q\n", name, p)
		} else {
			fmt.Fprintf(&src, "\t%q\n", p)
		}
	}
	src.WriteString(")\n")
	src.Write(body.Bytes())
	out, err := format.Source(src.Bytes())
	if err != nil {
		return nil, fmt.Errorf("format: %w\n%s", err, src.Bytes())
	}
	return out, nil
}

// comment returns doc as a // comment, naming iface, when not empty, in
// parentheses before the final period: "... (driver.Store).".
func comment(doc, iface string) string {
	doc = strings.TrimRight(doc, "\n")
	if iface != "" {
		suffix := " (" + iface + ")"
		if d, ok := strings.CutSuffix(doc, "."); ok {
			doc, suffix = d, suffix+"."
		}
		// Past the doc's margin, the last word goes to a line of its own
		// with the interface's name.
		start := strings.LastIndexByte(doc, '\n') + 1
		if last := doc[start:]; len(last)+len(suffix) > margin {
			if i := strings.LastIndexByte(last, ' '); i > 0 {
				doc = doc[:start+i] + "\n" + last[i+1:]
			}
		}
		doc += suffix
	}
	var b strings.Builder
	for line := range strings.Lines(doc) {
		line = strings.TrimRight(line, "\n")
		if line == "" {
			b.WriteString("//\n")
			continue
		}
		b.WriteString("// " + line + "\n")
	}
	return b.String()
}

// tuple returns the parameters (or results) of t as declared, and, for
// parameters, the arguments that pass them on. Parameters without a usable
// name get one.
func tuple(t *types.Tuple, variadic bool, qualify types.Qualifier, named bool) (decl, args string) {
	var ds, as []string
	for i := range t.Len() {
		v := t.At(i)
		typ := types.TypeString(v.Type(), qualify)
		name := v.Name()
		if name == "" || name == "_" {
			name = fmt.Sprintf("arg%d", i)
		}
		arg := name
		if variadic && i == t.Len()-1 {
			typ = "..." + strings.TrimPrefix(typ, "[]")
			arg += "..."
		}
		switch {
		case !named:
			ds = append(ds, typ)
		case i+1 < t.Len() && types.Identical(v.Type(), t.At(i+1).Type()) && (!variadic || i+2 != t.Len()):
			// "consumer, subject string", as written by hand.
			ds = append(ds, name)
		default:
			ds = append(ds, name+" "+typ)
		}
		as = append(as, arg)
	}
	return strings.Join(ds, ", "), strings.Join(as, ", ")
}
