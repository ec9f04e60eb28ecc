package apicheck_test

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// docBudget is the most lines that `go doc -short` may print for
// framework, middleware and app together: the contract a handler author
// reads in one sitting.
const docBudget = 90

// budgeted are the packages whose `go doc -short` docBudget bounds.
var budgeted = []string{"framework", "middleware", "app"}

// TestDocBudget counts the lines that `go doc -short` prints for
// framework, middleware and app, computed from go/doc as the go command
// prints them: one line per top-level const or var group, func and type,
// and under each type one per constructor (a func returning it) and per
// const or var group of its type. Methods are not listed. The sum must not
// pass docBudget: what grows the author's contract goes in a package of
// its own (the drivers' API), internal/ or unexported.
func TestDocBudget(t *testing.T) {
	root := moduleRoot(t)
	counts := make([]string, 0, len(budgeted))
	total := 0
	for _, rel := range budgeted {
		n := docShortLines(t, filepath.Join(root, rel), module+"/"+rel)
		counts = append(counts, fmt.Sprintf("%s %d", rel, n))
		total += n
	}
	if total > docBudget {
		t.Errorf("go doc -short of %s prints %d lines (%s), more than the budget of %d",
			strings.Join(budgeted, " + "), total, strings.Join(counts, ", "), docBudget)
	}
}

// docShortLines returns the number of lines `go doc -short` prints for
// the package in dir, of import path path.
func docShortLines(t *testing.T, dir, path string) int {
	t.Helper()
	bp, err := build.ImportDir(dir, 0)
	require.NoError(t, err)
	fset := token.NewFileSet()
	files := make([]*ast.File, 0, len(bp.GoFiles))
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		require.NoError(t, err)
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, path)
	require.NoError(t, err)
	n := len(p.Consts) + len(p.Vars) + len(p.Funcs) + len(p.Types)
	for _, typ := range p.Types {
		n += len(typ.Consts) + len(typ.Vars) + len(typ.Funcs)
	}
	return n
}

// maxFileLines is the most lines a non-test Go file of a public package
// may have.
const maxFileLines = 600

// TestFileSize checks that no non-test Go file of the module, the
// internal packages, tools and examples included, has more than
// maxFileLines lines: past that, split it by what its parts do.
func TestFileSize(t *testing.T) {
	root := moduleRoot(t)
	var over []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || name == "vendor" ||
				strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if lines := strings.Count(string(data), "\n"); lines > maxFileLines {
			rel, _ := filepath.Rel(root, path)
			over = append(over, fmt.Sprintf("%s: %d lines", filepath.ToSlash(rel), lines))
		}
		return nil
	})
	require.NoError(t, err)
	slices.Sort(over)
	if len(over) > 0 {
		t.Errorf("%d files are over %d lines (split each by what its parts do):\n\t%s",
			len(over), maxFileLines, strings.Join(over, "\n\t"))
	}
}
