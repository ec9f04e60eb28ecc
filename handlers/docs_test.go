package handlers_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDocsShowWithoutDedup: WithoutDedup's doc comment and
// docs/guarantees.md show ExampleWithoutDedup's declaration, character
// for character. Change them together.
func TestDocsShowWithoutDedup(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?s)\t// snippet:begin without-dedup\n(.*?)\n\t// snippet:end without-dedup`).FindSubmatch(src)
	require.NotNil(t, m, "example_test.go has no snippet without-dedup")
	code := regexp.MustCompile(`(?m)^\t`).ReplaceAllString(string(m[1]), "")

	guide, err := os.ReadFile("../docs/guarantees.md")
	require.NoError(t, err)
	require.Contains(t, string(guide), "<!-- snippet: handlers/example_test.go without-dedup -->\n```go\n"+code+"\n```")

	pkg, err := os.ReadFile("handlers.go")
	require.NoError(t, err)
	require.Contains(t, string(pkg), "//\t"+strings.ReplaceAll(code, "\n", "\n//\t")+"\n")
}
