package testenv

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// WriteCorpusVar names the variable that makes SeedCorpus write the seed
// files instead of checking them.
const WriteCorpusVar = "EFFECTIVELY_WRITE_CORPUS"

// SeedCorpus checks that the checked-in seed corpus of the fuzz target
// f runs, testdata/fuzz/<target>/, holds each of seeds: a file named by
// its key holding the target's arguments in go test's corpus format
// ([]byte, string, bool and byte arguments). Plain go test runs every
// file there as a test. With EFFECTIVELY_WRITE_CORPUS=1 it writes the
// files that are missing or differ instead, for a catalog that grew.
func SeedCorpus(f *testing.F, seeds map[string][]any) {
	f.Helper()
	target := strings.SplitN(f.Name(), "/", 2)[0]
	dir := filepath.Join("testdata", "fuzz", target)
	write := os.Getenv(WriteCorpusVar) == "1"
	var stale []string
	for _, name := range slices.Sorted(maps.Keys(seeds)) {
		want, err := corpusFile(seeds[name]...)
		if err != nil {
			f.Fatalf("seed %s: %v", name, err)
		}
		path := filepath.Join(dir, name)
		got, err := os.ReadFile(path)
		if err == nil && bytes.Equal(got, want) {
			continue
		}
		if !write {
			stale = append(stale, name)
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			f.Fatalf("seed corpus: %v", err)
		}
		if err := os.WriteFile(path, want, 0o644); err != nil {
			f.Fatalf("seed corpus: %v", err)
		}
	}
	if len(stale) > 0 {
		f.Fatalf("%s lacks or holds stale seeds %s: run go test -run '^%s$' with %s=1 and check the files in",
			dir, strings.Join(stale, ", "), target, WriteCorpusVar)
	}
}

// corpusFile encodes args as go test writes a corpus file.
func corpusFile(args ...any) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("go test fuzz v1\n")
	for _, a := range args {
		switch a := a.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", a)
		case string:
			fmt.Fprintf(&b, "string(%q)\n", a)
		case bool:
			fmt.Fprintf(&b, "bool(%v)\n", a)
		case byte:
			fmt.Fprintf(&b, "byte(%q)\n", a)
		default:
			return nil, fmt.Errorf("argument of type %T: only []byte, string, bool and byte are written", a)
		}
	}
	return b.Bytes(), nil
}
