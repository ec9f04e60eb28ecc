// Package sqlitedrivers measures the SQLite drivers for Go that the
// framework could run on, on the writes its SQLite transport makes for
// each event: the dedup mark into processed_events (its key, its index)
// and, when the mark is new, the business row, 100 events to a
// transaction, with the framework's pragmas, on a file in a temporary
// folder. It is a module of its own, so that the framework's own build
// needs none of the drivers it measures but the one it uses, and no C
// toolchain.
//
//	go test -bench . -benchtime 200000x -count 3                    # modernc.org/sqlite and ncruces/go-sqlite3
//	CGO_ENABLED=1 go test -tags mattn -bench . -benchtime 200000x -count 3 # modernc.org/sqlite and mattn/go-sqlite3 (cgo)
//
// The two third-party drivers both register the database/sql name
// "sqlite3", so they are built one at a time. The framework uses
// modernc.org/sqlite; internal/tools/bench/findings.md says why, with the
// figures.
package sqlitedrivers
