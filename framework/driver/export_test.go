package driver

// Waiting returns how many attempts of u wait for a batch, for tests that
// gather a batch before they let it run.
func Waiting(u *UnitOfWork) int {
	if u.group == nil {
		return 0
	}
	u.group.mu.Lock()
	defer u.group.mu.Unlock()
	return len(u.group.waiting)
}

// SetsSession reports whether a statement of query may change a setting
// of the session, as a Tx tells it (see scanStatements).
func SetsSession(query string, pg bool) bool {
	return scanStatements(query, pg).sets
}

// EndsTransaction reports whether a statement of query begins or ends a
// transaction, which a Tx refuses (see scanStatements).
func EndsTransaction(query string, pg bool) bool {
	return scanStatements(query, pg).ends
}

// Writes reports whether query is a single write, which may wait in its
// batch's queue (see scanStatements).
func Writes(query string, pg bool) bool {
	return scanStatements(query, pg).write
}

// DataException exposes dataException to the tests.
var DataException = dataException

// Overlapping reports whether u's attempts overlap now, their handlers'
// time going outside the database (see group.observe).
func Overlapping(u *UnitOfWork) bool {
	return u.group != nil && u.group.overlapping.Load()
}

// Taken returns how many of u's batch slots are taken: by a collect, or
// by a batch handed on or running.
func Taken(u *UnitOfWork) int {
	if u.group == nil {
		return 0
	}
	u.group.mu.Lock()
	defer u.group.mu.Unlock()
	return u.group.batches - u.group.free
}
