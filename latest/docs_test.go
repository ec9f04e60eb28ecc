package latest_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/latest"
)

// exampleView is the table of the Example, which the docs show.
func exampleView(t *testing.T) *latest.Table {
	t.Helper()
	view, err := latest.New(latest.Config{Table: "appointment_view", Key: []string{"appointment_id"}, Version: "seq", Columns: []string{"status"}})
	require.NoError(t, err)
	return view
}

// brokenSQL returns the statement as the docs show it: a line for the
// insert, the conflict and the condition.
func brokenSQL(query string) string {
	query = strings.Replace(query, " ON CONFLICT", "\nON CONFLICT", 1)
	return strings.Replace(query, " WHERE", "\nWHERE", 1)
}

// TestDocsShowTheCode: docs/handlers.md shows the statement Upsert runs on
// each database and the Example's code, character for character, and the
// package doc shows the statement. Change them together.
func TestDocsShowTheCode(t *testing.T) {
	t.Parallel()
	query := exampleView(t).SQL()
	guide, err := os.ReadFile("../docs/handlers.md")
	require.NoError(t, err)
	require.Contains(t, string(guide), "-- PostgreSQL\n"+brokenSQL(sqlx.Rebind(sqlx.DOLLAR, query))+"\n-- SQLite\n"+brokenSQL(query)+"\n```")

	src, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?s)\t// snippet:begin projection\n(.*?)\n\t// snippet:end projection`).FindSubmatch(src)
	require.NotNil(t, m, "example_test.go has no snippet projection")
	code := regexp.MustCompile(`(?m)^\t`).ReplaceAllString(string(m[1]), "")
	require.Contains(t, string(guide), "<!-- snippet: latest/example_test.go projection -->\n```go\n"+code+"\n```")

	pkgDoc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	require.Contains(t, string(pkgDoc), "//\t"+strings.ReplaceAll(brokenSQL(query), "\n", "\n//\t")+"\n")
}
