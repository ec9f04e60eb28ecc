package docs

import (
	"bytes"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// root returns the module's root folder, where go.mod is.
func root(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "no go.mod above the test's folder")
		dir = parent
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), path))
	require.NoError(t, err)
	return string(b)
}

// repoFiles returns the repository's files, relative to the root: those
// git tracks or would add (untracked and not ignored), or, without git,
// every file below the root outside .git.
func repoFiles(t *testing.T, dir string) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z")
	cmd.Dir = dir
	if out, err := cmd.Output(); err == nil {
		var files []string
		for _, f := range bytes.Split(out, []byte{0}) {
			if len(f) == 0 {
				continue
			}
			// A link (a fuzz target's seeds shared with another's) is
			// no file of its own; a file deleted in the work tree stays.
			if fi, err := os.Lstat(filepath.Join(dir, string(f))); err == nil && !fi.Mode().IsRegular() {
				continue
			}
			files = append(files, string(f))
		}
		return files
	}
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			rel, err := filepath.Rel(dir, path)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	require.NoError(t, err)
	return files
}

// TestNoDesignNotes: the docs stand alone. No file of the repository but
// this one names the design notes kept outside it, whose name this test
// builds at run time so as not to contain it.
func TestNoDesignNotes(t *testing.T) {
	t.Parallel()
	dir := root(t)
	needle := strings.ToLower("DESIGN") + ".md"
	self := filepath.Join("internal", "docs", "docs_test.go")
	files := repoFiles(t, dir)
	require.NotEmpty(t, files)
	var found []string
	for _, f := range files {
		if f == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, f))
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the work tree, not yet in git
		}
		require.NoError(t, err)
		if bytes.Contains(bytes.ToLower(b), []byte(needle)) {
			found = append(found, f)
		}
	}
	require.Empty(t, found, "these files name %s, which the repository does not have: say it in docs/ instead", needle)
}

// region returns the lines of the Go file at path between
// "// snippet:begin name" and "// snippet:end name", without their
// common indentation and without blank lines at either end.
func region(t *testing.T, path, name string) string {
	t.Helper()
	src := read(t, path)
	begin, end := "// snippet:begin "+name+"\n", "// snippet:end "+name
	_, after, ok := strings.Cut(src, begin)
	require.True(t, ok, "%s has no %q", path, strings.TrimSpace(begin))
	body, _, ok := strings.Cut(after, end)
	require.True(t, ok, "%s has no %q", path, end)
	lines := strings.Split(body, "\n")
	lines = lines[:len(lines)-1] // the indentation before the end marker
	return dedent(lines)
}

// dedent removes the tabs that every non-blank line starts with, and the
// blank lines at either end.
func dedent(lines []string) string {
	indent := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		n := len(l) - len(strings.TrimLeft(l, "\t"))
		if indent < 0 || n < indent {
			indent = n
		}
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		out[i] = l[indent:]
	}
	return strings.Trim(strings.Join(out, "\n"), "\n")
}

// markdownSnippetRE matches a marker and the Go block after it.
var markdownSnippetRE = regexp.MustCompile("(?s)<!-- snippet: (\\S+) (\\S+) -->\n```go\n(.*?)\n```")

// docBlock returns the code block of a doc comment (the package's or a
// declaration's) of the Go file at path that contains want, dedented.
func docBlock(t *testing.T, path, want string) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root(t), path), nil, parser.ParseComments)
	require.NoError(t, err)
	var text strings.Builder
	for _, c := range f.Comments {
		text.WriteString(c.Text())
		text.WriteString("\n")
	}
	var blocks [][]string
	var cur []string
	for _, l := range strings.Split(text.String(), "\n") {
		switch {
		case strings.HasPrefix(l, "\t"):
			cur = append(cur, l)
		case l == "" && cur != nil:
			cur = append(cur, l)
		default:
			if cur != nil {
				blocks = append(blocks, cur)
			}
			cur = nil
		}
	}
	if cur != nil {
		blocks = append(blocks, cur)
	}
	for _, b := range blocks {
		if s := dedent(b); strings.Contains(s, want) {
			return s
		}
	}
	t.Fatalf("no code block of %s's doc comments contains %q", path, want)
	return ""
}

// TestSnippets: the code the README and the package docs show is the code
// of compiled examples and tests, character for character. Change both
// together.
func TestSnippets(t *testing.T) {
	t.Parallel()
	t.Run("README", func(t *testing.T) {
		t.Parallel()
		readme := read(t, "README.md")
		ms := markdownSnippetRE.FindAllStringSubmatch(readme, -1)
		require.NotEmpty(t, ms, "README.md marks no snippet")
		for _, m := range ms {
			require.Equal(t, region(t, m[1], m[2]), m[3], "README.md's block marked %s %s", m[1], m[2])
		}
		require.Contains(t, readme, "<!-- snippet: examples/readme/main.go readme -->\n```go\n", "the consumer of the README is the compiled one")
	})
	t.Run("docs", func(t *testing.T) {
		t.Parallel()
		docs, err := filepath.Glob(filepath.Join(root(t), "docs", "*.md"))
		require.NoError(t, err)
		require.NotEmpty(t, docs)
		for _, doc := range docs {
			name := filepath.Join("docs", filepath.Base(doc))
			for _, m := range markdownSnippetRE.FindAllStringSubmatch(read(t, name), -1) {
				require.Equal(t, region(t, m[1], m[2]), m[3], "%s's block marked %s %s", name, m[1], m[2])
			}
		}
	})
	for _, tc := range []struct {
		doc, contains, file, name string
	}{
		{"handlers/doc.go", "handlers.Upcast(", "handlers/example_test.go", "upcast"},
		{"handlers/handlers.go", "handlers.Upcast(", "handlers/example_test.go", "upcast"},
		{"app/apptest/doc.go", "apptest.New(", "examples/notifications/apptest_test.go", "apptest-doc"},
	} {
		t.Run(tc.doc, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, region(t, tc.file, tc.name), docBlock(t, tc.doc, tc.contains))
		})
	}
}

// parseFile parses the Go file at path.
func parseFile(t *testing.T, path string) *ast.File {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root(t), path), nil, 0)
	require.NoError(t, err)
	return f
}

// funcDecl returns the function name of f.
func funcDecl(t *testing.T, f *ast.File, name string) *ast.FuncDecl {
	t.Helper()
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == name {
			return fd
		}
	}
	t.Fatalf("no func %s", name)
	return nil
}

// stringLit returns the value of e when it is a string literal.
func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// TestMakeTestRunsTheDemo: the transports on which the README says `make
// test` runs the example's demo are exactly the cases of TestDemo, which
// make test runs.
func TestMakeTestRunsTheDemo(t *testing.T) {
	t.Parallel()
	m := regexp.MustCompile("`make test` runs the example's demo on ([^(]+?) \\(`TestDemo`").FindStringSubmatch(read(t, "README.md"))
	require.NotNil(t, m, "README.md no longer says on which transports make test runs the demo: update this test")
	var claimed []string
	for _, part := range strings.Split(strings.ReplaceAll(m[1], " and ", ", "), ", ") {
		claimed = append(claimed, strings.TrimSpace(part))
	}
	caseOf := map[string]string{"SQLite": "SQLite", "PostgreSQL": "Postgres", "RabbitMQ": "AMQP", "memory": "Memory"}
	var want []string
	for _, c := range claimed {
		name, ok := caseOf[c]
		require.True(t, ok, "README.md names an unknown transport %q", c)
		want = append(want, name)
	}

	// Each row of TestDemo's table is a name and a func giving the case's
	// environment.
	var cases []string
	ast.Inspect(funcDecl(t, parseFile(t, "examples/notifications/demo_test.go"), "TestDemo"), func(n ast.Node) bool {
		if cl, ok := n.(*ast.CompositeLit); ok && len(cl.Elts) == 2 {
			_, isFunc := cl.Elts[1].(*ast.FuncLit)
			if s, ok := stringLit(cl.Elts[0]); ok && isFunc {
				cases = append(cases, s)
			}
		}
		return true
	})
	slices.Sort(want)
	slices.Sort(cases)
	require.Equal(t, want, cases, "README.md says make test runs the demo on %s", m[1])

	target := regexp.MustCompile(`(?m)^test:.*\n((?:\t.*\n)+)`).FindStringSubmatch(read(t, "Makefile"))
	require.NotNil(t, target, "the Makefile has no test target")
	require.Regexp(t, `\$\(GO\) test [^\n]*\./\.\.\.(\s|$)`, target[1], "make test runs every package, examples/notifications included")
}

// TestCrashTestsAsDocumented: docs/guarantees.md names exactly the kill
// points of TestCrash, on the transport it uses, and claims no more.
func TestCrashTestsAsDocumented(t *testing.T) {
	t.Parallel()
	doc := read(t, "docs/guarantees.md")
	require.False(t, strings.Contains(doc, "at every step"), "docs/guarantees.md claims kills at every step")
	_, para, ok := strings.Cut(doc, "What the crash tests prove")
	require.True(t, ok, "docs/guarantees.md no longer says what the crash tests prove: update this test")
	para, _, _ = strings.Cut(para, "\n## ")

	const path = "examples/notifications/crash_test.go"
	f := parseFile(t, path)
	var points []string
	ast.Inspect(funcDecl(t, f, "TestCrash"), func(n ast.Node) bool {
		if call, ok := n.(*ast.CallExpr); ok {
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Run" && len(call.Args) == 2 {
				if s, ok := stringLit(call.Args[0]); ok {
					points = append(points, s)
				}
			}
		}
		return true
	})
	require.NotEmpty(t, points)

	var named []string
	for _, m := range regexp.MustCompile("`([A-Z][A-Za-z]+)`").FindAllStringSubmatch(para, -1) {
		if strings.HasPrefix(m[1], "Test") {
			// The test it names exists, in the crash tests of the example.
			found := false
			for _, file := range []string{path, "examples/notifications/crash_batch_test.go", "app/replay_crash_test.go"} {
				for _, d := range parseFile(t, file).Decls {
					if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == m[1] {
						found = true
					}
				}
			}
			require.Truef(t, found, "docs/guarantees.md names %s, which no crash test file declares", m[1])
			continue
		}
		named = append(named, m[1])
	}
	require.ElementsMatch(t, points, named, "the kill points docs/guarantees.md names, and TestCrash's subtests")
	words := []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}
	require.Less(t, len(points), len(words))
	require.Contains(t, para, "at "+words[len(points)]+" points")

	src := read(t, path)
	require.Contains(t, para, "on the SQLite transport with its stores in SQLite")
	require.Contains(t, src, `app.EnvTransport+"=sqlite"`)
	for _, other := range []string{"TransportPostgres", "TransportAMQP", "PostgresURL", "AMQPURL"} {
		require.NotContains(t, src, other, "the crash tests run on another transport now: say so in docs/guarantees.md")
	}
}

// constValues returns the string values of the constants of the Go file
// at path whose names start with prefix.
func constValues(t *testing.T, path, prefix string) map[string]string {
	t.Helper()
	values := make(map[string]string)
	for _, d := range parseFile(t, path).Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, prefix) || i >= len(vs.Values) {
					continue
				}
				if v, ok := stringLit(vs.Values[i]); ok {
					values[name.Name] = v
				}
			}
		}
	}
	require.NotEmpty(t, values, "no constant %s* in %s", prefix, path)
	return values
}

// TestContractsComplete: docs/contracts.md has a row for every code the
// framework writes and every metadata key it reads or writes.
func TestContractsComplete(t *testing.T) {
	t.Parallel()
	doc := read(t, "docs/contracts.md")
	for name, code := range constValues(t, "framework/codes.go", "Code") {
		require.Contains(t, doc, "\n| `"+code+"` |", "docs/contracts.md: no row for %s (%s)", name, code)
	}
	for name, key := range constValues(t, "framework/message.go", "Metadata") {
		require.Contains(t, doc, "\n| `"+key+"` (`framework."+name+"`) |", "docs/contracts.md: no row for %s (%s)", name, key)
	}
}
