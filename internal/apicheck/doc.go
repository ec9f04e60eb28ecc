// Package apicheck holds the tests that keep the module's public API a
// reviewed surface: TestAPI lists every exported identifier of every
// public package (testdata/api.txt; update it with
// `go test ./internal/apicheck -update` and review the diff), TestDocBudget
// bounds what `go doc -short` prints for framework, middleware and app,
// and TestFileSize bounds the length of the files a user or an
// implementer reads. It has no code of its own.
package apicheck
