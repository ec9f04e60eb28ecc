package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGenerated fails when the store_methods.go of a store package is not
// what storegen writes now: a method added to sqlstore.Store or to a
// driver interface, or a doc comment changed, without go generate.
func TestGenerated(t *testing.T) {
	root, err := ModuleRoot(".")
	require.NoError(t, err)
	for _, pkg := range Packages {
		t.Run(pkg, func(t *testing.T) {
			want, err := Generate(root, filepath.Base(pkg))
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join(root, pkg, Output))
			require.NoError(t, err)
			if !bytes.Equal(want, got) {
				t.Fatalf("%s/%s is stale: run go generate ./framework/...\n%s", pkg, Output, firstDiff(string(want), string(got)))
			}
		})
	}
}

// TestComment checks that a method's doc names its interface before the
// final period, within the margin, and keeps paragraphs apart.
func TestComment(t *testing.T) {
	require.Equal(t, "// Mark marks.\n//\n// It waits (driver.Store).\n", comment("Mark marks.\n\nIt waits.\n", "driver.Store"))
	require.Equal(t, "// Mark marks: see\n// Count (driver.Store)\n", comment("Mark marks: see\nCount\n", "driver.Store"))
	require.Equal(t, "// MarkMany marks many.\n", comment("MarkMany marks many.\n", ""))
	long := strings.Repeat("word ", 13) + "end."
	require.Equal(t, "// "+strings.Repeat("word ", 12)+"word\n// end (driver.Store).\n", comment(long, "driver.Store"))
}

// firstDiff describes the first line where want and got differ.
func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d: want %q, got %q", i+1, wl, gl)
		}
	}
	return "no difference"
}
