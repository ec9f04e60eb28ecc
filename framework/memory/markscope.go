package memory

import "github.com/effectively-once/effectively/framework/driver"

// MarkScope returns driver.MarkReleasedOnRollback: a mark lives in the
// process's memory, outside any database transaction; it is kept when the
// attempt's transaction commits and goes when it rolls back or fails to
// commit, so a failed attempt's redelivery runs the handler again. With a
// UnitOfWork on a database it still cannot join that database's
// transaction: a crash or a restart forgets every mark, so an event
// delivered again afterwards (its ack was lost, or the crash came between
// the commit and the ack) takes effect again, and another process does
// not see the marks of this one.
func (s *Store) MarkScope() driver.MarkScope { return driver.MarkReleasedOnRollback }
