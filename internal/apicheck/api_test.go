package apicheck_test

import (
	"bytes"
	"flag"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite testdata/api.txt with the module's API of today")

// module is the module's path, which every package path below starts with.
const module = "github.com/effectively-once/effectively"

// apiFile is the checked-in list of the public API.
const apiFile = "testdata/api.txt"

// TestAPI lists every exported identifier of every public package of the
// module (not internal, not an example, not a command) and compares the
// list with testdata/api.txt: consts, vars, funcs, types, the exported
// methods of exported types (those promoted from unexported embedded
// fields too), their exported struct fields and the methods of exported
// interfaces, each with its package and a short signature. Any change of
// the API, in any package, is then a diff a reviewer sees; after a change
// made on purpose, run
//
//	go test ./internal/apicheck -run TestAPI -update
//
// and commit testdata/api.txt with it.
//
// The list comes from the packages' export data, read with go/types: the
// types are printed by types.TypeString, other packages by their name.
func TestAPI(t *testing.T) {
	root := moduleRoot(t)
	pkgs := publicPackages(t, root)
	exports := exportData(t, root, pkgs)
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok || file == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
	var lines []string
	for _, path := range pkgs {
		pkg, err := imp.Import(path)
		require.NoError(t, err, "import %s", path)
		lines = append(lines, apiOf(pkg)...)
	}
	slices.Sort(lines)
	got := strings.Join(lines, "\n") + "\n"

	if *update {
		require.NoError(t, os.WriteFile(apiFile, []byte(got), 0o600))
		t.Logf("wrote %s: %d lines", apiFile, len(lines))
		return
	}
	want, err := os.ReadFile(apiFile)
	require.NoError(t, err, "run go test ./internal/apicheck -run TestAPI -update to write it")
	if string(want) == got {
		return
	}
	t.Errorf("the public API differs from %s (- only there, + only in the code):\n%s\n"+
		"If the change is meant, run\n\tgo test ./internal/apicheck -run TestAPI -update\n"+
		"review the diff of %s and commit it, with an entry in CHANGELOG.md.",
		apiFile, diff(strings.Split(strings.TrimSuffix(string(want), "\n"), "\n"), lines), apiFile)
}

// moduleRoot returns the directory of the module's go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	out := goCommand(t, ".", "env", "GOMOD")
	gomod := strings.TrimSpace(out)
	require.NotEmpty(t, gomod, "go env GOMOD")
	return filepath.Dir(gomod)
}

// publicPackages returns the import paths of the module's public
// packages, sorted: every package outside internal/ and examples/ that is
// not a command.
func publicPackages(t *testing.T, root string) []string {
	t.Helper()
	var pkgs []string
	for line := range strings.Lines(goCommand(t, root, "list", "-f", "{{.ImportPath}} {{.Name}}", "./...")) {
		path, name, _ := strings.Cut(strings.TrimSpace(line), " ")
		if !public(path) || name == "main" {
			continue
		}
		pkgs = append(pkgs, path)
	}
	slices.Sort(pkgs)
	require.NotEmpty(t, pkgs)
	return pkgs
}

// public reports whether the package path is a public package of the
// module: inside it, neither internal nor an example.
func public(path string) bool {
	rel, ok := strings.CutPrefix(path, module)
	if !ok || (rel != "" && !strings.HasPrefix(rel, "/")) {
		return false
	}
	for elem := range strings.SplitSeq(strings.TrimPrefix(rel, "/"), "/") {
		if elem == "internal" || elem == "examples" || elem == "testdata" {
			return false
		}
	}
	return true
}

// exportData returns the export data file of each of pkgs and of every
// package they import, by import path (go list -export builds them, from
// the build cache when it can).
func exportData(t *testing.T, root string, pkgs []string) map[string]string {
	t.Helper()
	args := append([]string{"list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"}, pkgs...)
	files := make(map[string]string)
	for line := range strings.Lines(goCommand(t, root, args...)) {
		path, file, _ := strings.Cut(strings.TrimSpace(line), "\t")
		files[path] = file
	}
	return files
}

// goCommand runs the go command in dir and returns its standard output.
func goCommand(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go %s: %s", strings.Join(args, " "), stderr.String())
	return string(out)
}

// apiOf returns the lines of pkg's exported API, unsorted.
func apiOf(pkg *types.Package) []string {
	rel := strings.TrimPrefix(strings.TrimPrefix(pkg.Path(), module), "/")
	if rel == "" {
		rel = "."
	}
	qual := func(p *types.Package) string {
		if p == pkg {
			return ""
		}
		return p.Name()
	}
	typeString := func(typ types.Type) string { return types.TypeString(typ, qual) }
	var lines []string
	add := func(kind, format string, args ...any) {
		lines = append(lines, rel+" "+kind+" "+fmt.Sprintf(format, args...))
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		switch obj := scope.Lookup(name).(type) {
		case *types.Const:
			if obj.Exported() {
				add("const", "%s %s", name, typeString(obj.Type()))
			}
		case *types.Var:
			if obj.Exported() {
				add("var", "%s %s", name, typeString(obj.Type()))
			}
		case *types.Func:
			if obj.Exported() {
				add("func", "%s", strings.TrimPrefix(types.ObjectString(obj, qual), "func "))
			}
		case *types.TypeName:
			if !obj.Exported() {
				continue
			}
			if alias, ok := obj.Type().(*types.Alias); ok {
				add("type", "%s%s = %s", name, typeParams(alias.TypeParams(), typeString), typeString(alias.Rhs()))
				continue
			}
			named, ok := obj.Type().(*types.Named)
			if !ok {
				continue
			}
			typeLines(named, qual, add)
		}
	}
	return lines
}

// typeLines adds the lines of the exported named type t: the type, its
// methods, its struct's fields or its interface's methods.
func typeLines(t *types.Named, qual types.Qualifier, add func(kind, format string, args ...any)) {
	typeString := func(typ types.Type) string { return types.TypeString(typ, qual) }
	name := t.Obj().Name()
	decl := name + typeParams(t.TypeParams(), typeString)
	switch u := t.Underlying().(type) {
	case *types.Struct:
		add("type", "%s struct", decl)
		fieldLines(name, u, typeString, add, 0)
	case *types.Interface:
		add("type", "%s interface", decl)
		for i := range u.NumEmbeddeds() {
			add("embed", "%s.%s", name, typeString(u.EmbeddedType(i)))
		}
		// Every method of the interface, embedded ones included: what an
		// implementation must have.
		for i := range u.NumMethods() {
			if m := u.Method(i); m.Exported() {
				add("method", "%s.%s%s", name, m.Name(), strings.TrimPrefix(typeString(m.Type()), "func"))
			}
		}
		return
	default:
		add("type", "%s %s", decl, typeString(u))
	}
	for i := range t.NumMethods() {
		if m := t.Method(i); m.Exported() {
			add("method", "%s", strings.TrimPrefix(types.ObjectString(m, qual), "func "))
		}
	}
	// Methods promoted from an unexported embedded field are the type's
	// own API: nothing else shows them.
	st, ok := t.Underlying().(*types.Struct)
	if !ok {
		return
	}
	ms := types.NewMethodSet(types.NewPointer(t))
	for i := range ms.Len() {
		sel := ms.At(i)
		if len(sel.Index()) < 2 || !sel.Obj().Exported() || st.Field(sel.Index()[0]).Exported() {
			continue
		}
		add("method", "(*%s).%s%s (promoted)", name, sel.Obj().Name(), strings.TrimPrefix(typeString(sel.Obj().Type()), "func"))
	}
}

// fieldLines adds the exported fields of st, the struct of type name,
// and those promoted from its unexported embedded structs.
func fieldLines(name string, st *types.Struct, typeString func(types.Type) string, add func(kind, format string, args ...any), depth int) {
	for i := range st.NumFields() {
		f := st.Field(i)
		switch {
		case f.Exported() && f.Embedded():
			add("embed", "%s.%s", name, typeString(f.Type()))
		case f.Exported():
			add("field", "%s.%s %s", name, f.Name(), typeString(f.Type()))
		case f.Embedded() && depth < 4:
			typ := f.Type()
			if p, ok := typ.(*types.Pointer); ok {
				typ = p.Elem()
			}
			if inner, ok := typ.Underlying().(*types.Struct); ok {
				fieldLines(name, inner, typeString, add, depth+1)
			}
		}
	}
}

// typeParams returns the type parameter list tps as written in a
// declaration ("[T any]"), or "" without type parameters.
func typeParams(tps *types.TypeParamList, typeString func(types.Type) string) string {
	if tps.Len() == 0 {
		return ""
	}
	params := make([]string, tps.Len())
	for i := range tps.Len() {
		tp := tps.At(i)
		params[i] = tp.Obj().Name() + " " + typeString(tp.Constraint())
	}
	return "[" + strings.Join(params, ", ") + "]"
}

// diff returns the lines only in want ("- ") and only in got ("+ "), in
// order: both lists are sorted.
func diff(want, got []string) string {
	var b strings.Builder
	i, j := 0, 0
	for i < len(want) || j < len(got) {
		switch {
		case j == len(got) || (i < len(want) && want[i] < got[j]):
			fmt.Fprintf(&b, "- %s\n", want[i])
			i++
		case i == len(want) || got[j] < want[i]:
			fmt.Fprintf(&b, "+ %s\n", got[j])
			j++
		default:
			i++
			j++
		}
	}
	return b.String()
}
