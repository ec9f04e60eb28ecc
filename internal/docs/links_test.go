package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

var (
	// mdLink is a Markdown link or image: its target in group 1.
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// inlineCode is a code span of one line.
	inlineCode = regexp.MustCompile("`[^`]*`")
)

// TestLinks: every link of the README and the docs to a file of the
// repository names one that exists, and every #anchor one of the target's
// headings, as GitHub makes anchors of them: a link to operations.md
// pointed at a heading of transports.md that had been renamed.
func TestLinks(t *testing.T) {
	dir := root(t)
	var pages []string
	for _, f := range repoFiles(t, dir) {
		if f == "README.md" || strings.HasPrefix(f, "docs/") && strings.HasSuffix(f, ".md") {
			pages = append(pages, f)
		}
	}
	require.NotEmpty(t, pages)
	anchors := make(map[string]map[string]bool) // of a page, by path from the root
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		b, err := os.ReadFile(filepath.Join(dir, page))
		require.NoError(t, err)
		anchors[page] = headingAnchors(string(b))
		return anchors[page]
	}
	checked := 0
	for _, page := range pages {
		text := read(t, page)
		for _, m := range mdLink.FindAllStringSubmatch(withoutCode(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			linked := page
			if file != "" {
				linked = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(page), file)))
				_, err := os.Stat(filepath.Join(dir, linked))
				require.NoError(t, err, "%s links to %s, which does not exist", page, target)
			}
			if anchor != "" {
				require.True(t, strings.HasSuffix(linked, ".md"), "%s links to an anchor of %s, not a Markdown page", page, target)
				require.True(t, anchorsOf(linked)[anchor], "%s links to %s: %s has no heading of that anchor", page, target, linked)
			}
			checked++
		}
	}
	require.Greater(t, checked, 20, "the links were found")
}

// withoutCode returns text without its fenced code blocks and inline code,
// where a "](" is not a link.
func withoutCode(text string) string {
	var b strings.Builder
	fenced := false
	for line := range strings.Lines(text) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			b.WriteString(inlineCode.ReplaceAllString(line, ""))
		}
	}
	return b.String()
}

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown page: the heading's text in lower case, without punctuation
// but hyphens and underscores, its spaces hyphens, and "-1", "-2" after
// the second and later of one text.
func headingAnchors(text string) map[string]bool {
	anchors := make(map[string]bool)
	seen := make(map[string]int)
	fenced := false
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		heading := strings.TrimSpace(strings.TrimLeft(line, "#"))
		heading = strings.ReplaceAll(heading, "`", "")
		var a strings.Builder
		for _, r := range strings.ToLower(heading) {
			switch {
			case r == ' ':
				a.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				a.WriteRune(r)
			}
		}
		anchor := a.String()
		if n := seen[anchor]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", anchor, n)] = true
		} else {
			anchors[anchor] = true
		}
		seen[anchor]++
	}
	return anchors
}
