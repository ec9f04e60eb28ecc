package docs

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
)

// TestSQLStoresDocumentTheirMethods checks that go doc of sqlite.Store and
// postgres.Store lists every method of driver.Store, which they
// implement, each with a doc comment that names it: a method promoted from
// an embedded internal type would not show.
func TestSQLStoresDocumentTheirMethods(t *testing.T) {
	ifaces := []reflect.Type{reflect.TypeFor[driver.Store]()}
	for _, pkg := range []string{"framework/sqlite", "framework/postgres"} {
		t.Run(pkg, func(t *testing.T) {
			docs := storeMethodDocs(t, filepath.Join(root(t), pkg))
			for _, it := range ifaces {
				for m := range it.Methods() {
					d, ok := docs[m.Name]
					require.Truef(t, ok, "go doc of %s.Store lists no method %s (%s)", pkg, m.Name, it)
					require.Containsf(t, d, "(driver.Store)", "doc of %s.Store.%s does not name driver.Store", pkg, m.Name)
				}
			}
		})
	}
}

// storeMethodDocs returns the doc comment of each method go doc lists for
// type Store of the package in dir.
func storeMethodDocs(t *testing.T, dir string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		require.NoError(t, err)
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, dir)
	require.NoError(t, err)
	for _, typ := range p.Types {
		if typ.Name != "Store" {
			continue
		}
		docs := map[string]string{}
		for _, m := range typ.Methods {
			docs[m.Name] = m.Doc
		}
		return docs
	}
	t.Fatalf("no type Store in %s", dir)
	return nil
}
