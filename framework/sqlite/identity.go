package sqlite

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// identityCheckInterval is how long a look at the database file holds
// for the checks before every write and transaction: with a stat each
// time, the SQLite benchmark's consumer ran up to a tenth slower in single
// rounds. A new connection and a ping look at once.
const identityCheckInterval = 100 * time.Millisecond

// fileIdentity is the database file a connector opened, as it was at the
// first connection: a file deleted or replaced while the process runs is
// refused instead of used, from at most identityCheckInterval after. A
// nil fileIdentity, an in-memory database's, checks nothing.
//
// On Linux a connection open on a deleted file goes on reading and
// writing it, and a new connection opened as the first one is creates an
// empty file at the path (the connections after the first open the file
// only if it is there; see gatedConnector.open), so that an operator's rm
// (or a restore that moved another file there) would otherwise leave the
// service committing effects nobody will read, or failing on tables that
// are not there while its readiness says ready.
type fileIdentity struct {
	path string

	mu      sync.Mutex
	info    os.FileInfo // of the file after the first connection; nil before
	checked time.Time   // when the file was last looked at
	err     error       // what it showed; once set, for good
}

// check returns an error when the file at the path is gone or is another
// than at the first connection; nil before the first. It looks at the
// file again when the last look is older than identityCheckInterval.
func (f *fileIdentity) check() error {
	return f.look(false)
}

// checkNow is check looking at the file whatever the time of the last
// look: before and after a connection opens, and for a ping.
func (f *fileIdentity) checkNow() error {
	return f.look(true)
}

func (f *fileIdentity) look(now bool) error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.info == nil || f.err != nil || !now && time.Since(f.checked) < identityCheckInterval {
		return f.err
	}
	f.checked = time.Now()
	info, err := os.Stat(f.path)
	switch {
	case err != nil:
		f.err = fmt.Errorf("sqlite: the database file %s is gone since it was opened: %w", f.path, err)
	case !os.SameFile(f.info, info):
		f.err = fmt.Errorf("sqlite: the database file %s was replaced since it was opened", f.path)
	}
	return f.err
}

// known reports whether the file was remembered (see remember): the
// connections after it must not create a file at the path. A nil
// fileIdentity, an in-memory database's, knows no file.
func (f *fileIdentity) known() bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.info != nil
}

// remember records the file at the path when no connection did before:
// the first connection created it if it was missing. A path the driver
// reads otherwise than the file system (a URI's escapes) stats as missing
// and is not watched.
func (f *fileIdentity) remember() {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.info != nil {
		return
	}
	if info, err := os.Stat(f.path); err == nil {
		f.info, f.checked = info, time.Now()
	}
}
