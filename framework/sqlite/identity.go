package sqlite

import (
	"fmt"
	"os"
	"sync"
)

// fileIdentity is the database file a connector opened, as it was at the
// first connection: a file deleted or replaced while the process runs is
// refused instead of used.
//
// On Linux a connection open on a deleted file goes on reading and
// writing it, and a new connection creates an empty file at the path, so
// that an operator's rm (or a restore that moved another file there)
// would otherwise leave the service committing effects nobody will read,
// or failing on tables that are not there while its readiness says ready.
type fileIdentity struct {
	path string

	mu   sync.Mutex
	info os.FileInfo // of the file after the first connection; nil before
}

// check returns an error when the file at the path is gone or is another
// than at the first connection; nil before the first.
func (f *fileIdentity) check() error {
	f.mu.Lock()
	first := f.info
	f.mu.Unlock()
	if first == nil {
		return nil
	}
	now, err := os.Stat(f.path)
	switch {
	case err != nil:
		return fmt.Errorf("sqlite: the database file %s is gone since it was opened: %w", f.path, err)
	case !os.SameFile(first, now):
		return fmt.Errorf("sqlite: the database file %s was replaced since it was opened", f.path)
	}
	return nil
}

// remember records the file at the path when no connection did before:
// the first connection created it if it was missing. A path the driver
// reads otherwise than the file system (a URI's escapes) stats as missing
// and is not watched.
func (f *fileIdentity) remember() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.info != nil {
		return
	}
	if info, err := os.Stat(f.path); err == nil {
		f.info = info
	}
}
