package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// read returns the file at path, relative to the module's root.
func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", path))
	require.NoError(t, err)
	return string(b)
}

// region returns the lines of the Go file at path between
// "// snippet:begin name" and "// snippet:end name", without their
// common indentation and without blank lines at either end.
func region(t *testing.T, path, name string) string {
	t.Helper()
	_, after, ok := strings.Cut(read(t, path), "// snippet:begin "+name+"\n")
	require.True(t, ok, "%s has no snippet:begin %s", path, name)
	body, _, ok := strings.Cut(after, "// snippet:end "+name)
	require.True(t, ok, "%s has no snippet:end %s", path, name)
	lines := strings.Split(body, "\n")
	lines = lines[:len(lines)-1] // the indentation before the end marker
	indent := -1
	for _, l := range lines {
		if strings.TrimSpace(l) != "" {
			n := len(l) - len(strings.TrimLeft(l, "\t"))
			if indent < 0 || n < indent {
				indent = n
			}
		}
	}
	for i, l := range lines {
		if strings.TrimSpace(l) == "" {
			lines[i] = ""
		} else {
			lines[i] = l[indent:]
		}
	}
	return strings.Trim(strings.Join(lines, "\n"), "\n")
}

var (
	// snippetRE matches a marker and the Go block after it.
	snippetRE = regexp.MustCompile("(?s)<!-- snippet: (\\S+) (\\S+) -->\n```go\n(.*?)\n```")
	// goBlockRE matches the start of any Go block.
	goBlockRE = regexp.MustCompile("(?m)^```go$")
	// stepRE matches a step of the chain in a list of steps: its name
	// (one or two words, or [Outer] and [Inner]) at the start of a line,
	// then two spaces or more.
	stepRE = regexp.MustCompile(`(?m)^(?://\t)?(\[?[a-zA-Z]+\]?(?: [a-z]+)?)  +\S`)
)

// TestDocsShowTheCode: every Go block of docs/middleware.md is the code
// between snippet markers of this example, character for character.
// Change them together.
func TestDocsShowTheCode(t *testing.T) {
	t.Parallel()
	doc := read(t, "docs/middleware.md")
	ms := snippetRE.FindAllStringSubmatch(doc, -1)
	require.Len(t, ms, len(goBlockRE.FindAllString(doc, -1)), "every Go block is marked as a snippet")
	require.Len(t, ms, 4)
	for _, m := range ms {
		require.Equal(t, region(t, m[1], m[2]), m[3], "docs/middleware.md's block marked %s %s", m[1], m[2])
	}
	require.Contains(t, read(t, "README.md"), "(docs/middleware.md)", "the README links the guide")
}

// TestDocsListTheChain: the chain that docs/middleware.md lists names
// steps of the chain that package middleware documents, in the same
// order, with Outer and Inner where the package has them.
func TestDocsListTheChain(t *testing.T) {
	t.Parallel()
	steps := func(text string) []string {
		var out []string
		for _, m := range stepRE.FindAllStringSubmatch(text, -1) {
			out = append(out, m[1])
		}
		return out
	}
	_, list, ok := strings.Cut(read(t, "docs/middleware.md"), "```text\n")
	require.True(t, ok, "docs/middleware.md lists no chain")
	list, _, _ = strings.Cut(list, "```")
	documented := steps(list)
	require.Contains(t, documented, "[Outer]")
	require.Contains(t, documented, "[Inner]")

	pkg := read(t, "middleware/doc.go")
	_, pkgList, _ := strings.Cut(pkg, "outermost first (one file each):\n//\n")
	pkgList, _, _ = strings.Cut(pkgList, "//\n")
	chain := steps(pkgList)
	require.NotEmpty(t, chain)
	at := 0
	for _, s := range documented {
		i := indexFrom(chain, s, at)
		require.GreaterOrEqual(t, i, 0, "step %q is not in package middleware's chain %v after position %d", s, chain, at)
		at = i + 1
	}
}

// indexFrom returns the index of s in list at or after from, or -1.
func indexFrom(list []string, s string, from int) int {
	for i := from; i < len(list); i++ {
		if list[i] == s {
			return i
		}
	}
	return -1
}
