package testkit_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTestingDocShowsTheExamples: docs/testing.md shows the code of the
// crash examples (between their snippet markers in example_crash_test.go)
// character for character, every one of them. Change them together.
func TestTestingDocShowsTheExamples(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/testing.md")
	require.NoError(t, err)
	src, err := os.ReadFile("example_crash_test.go")
	require.NoError(t, err)

	regions := regexp.MustCompile(`(?s)\t// snippet:begin (\S+)\n(.*?)\n\t// snippet:end (\S+)`).FindAllStringSubmatch(string(src), -1)
	require.Len(t, regions, 5, "the crash examples' snippets")
	for _, m := range regions {
		require.Equal(t, m[1], m[3], "snippet %s ends as %s", m[1], m[3])
		code := regexp.MustCompile(`(?m)^\t`).ReplaceAllString(m[2], "")
		require.Contains(t, string(doc), "<!-- snippet: app/testkit/example_crash_test.go "+m[1]+" -->\n```go\n"+code+"\n```",
			"docs/testing.md shows snippet %s", m[1])
	}
	blocks := strings.Count(string(doc), "<!-- snippet: app/testkit/example_crash_test.go ")
	require.Equal(t, len(regions), blocks, "docs/testing.md shows each snippet once")

	// The crash of the service's own module, through apptest.
	const path = "examples/notifications/apptest_crash_test.go"
	mod, err := os.ReadFile("../../" + path)
	require.NoError(t, err)
	m := regexp.MustCompile(`(?s)\n(\t+)// snippet:begin apptest-crash\n(.*?)\n\t+// snippet:end apptest-crash`).FindStringSubmatch(string(mod))
	require.NotNil(t, m, "%s has no snippet apptest-crash", path)
	code := regexp.MustCompile(`(?m)^`+m[1]).ReplaceAllString(m[2], "")
	require.Contains(t, string(doc), "<!-- snippet: "+path+" apptest-crash -->\n```go\n"+code+"\n```")
}
