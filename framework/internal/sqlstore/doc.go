// Package sqlstore is the one SQL implementation of the framework's stores
// for PostgreSQL and SQLite, with the migrations that create every table
// the framework owns. All of the framework's store SQL lives here, beside
// the migrations it depends on; framework/sqlite, framework/postgres and
// framework/migrate are thin public wrappers.
//
// # Tables
//
// Every table name takes the configured prefix (see ValidatePrefix). The
// shapes are a contract that operators and reports rely on, documented
// column by column in docs/contracts.md ("Tables"): change a migration
// and that page together.
//
// # Time
//
// Times are stored in UTC. PostgreSQL keeps them as timestamptz
// (microsecond precision); SQLite as INTEGER nanoseconds since the Unix
// epoch, so that they sort and compare as numbers. Metadata is JSON: jsonb
// on PostgreSQL, TEXT on SQLite.
//
// The store's clock (Options.Now) stamps what it writes, but for the
// members of consumers' groups and the partition leases (driver.Leases):
// their times are the database's own (statement_timestamp() on
// PostgreSQL, unixepoch('subsec') on SQLite), so that the processes of a
// group need not agree on their clocks.
package sqlstore
