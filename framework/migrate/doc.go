// Package migrate creates and updates the tables the framework owns —
// processed events, dead letters, the outbox, subject checkpoints and
// parked events, delivery counts — on PostgreSQL or SQLite, and applies
// the application's own migrations after them.
//
// The migrations are goose SQL files embedded in the framework. Each set
// is recorded in a version table of its own: the framework's in
// TablePrefix + VersionTable, the application's in TablePrefix +
// DefaultExtraVersionTable (or Config.ExtraVersionTable).
//
// # Applying the migrations
//
//	db, err := sqlite.Open(ctx, "file:./data/effectively.db", sqlite.OpenConfig{})
//	if err != nil {
//		return err
//	}
//	if err := migrate.Up(ctx, db, migrate.Config{}); err != nil {
//		return err
//	}
//
// Up is idempotent, and processes that start together may all call it
// (see Up). The dialect comes from the database's driver name; set
// Config.Dialect when a wrapper driver hides it.
//
// # Table prefix
//
// Config.TablePrefix prefixes every table name, so that several
// applications, or several tenants of one, share a database or schema:
//
//	err := migrate.Up(ctx, db, migrate.Config{TablePrefix: "billing_"})
//
// The stores must be given the same prefix (sqlite.StoreConfig,
// postgres.StoreConfig).
//
// # The application's migrations
//
// Config.Extra is a file system of goose SQL migrations, named
// NNNNN_what.sql, at its root:
//
//	//go:embed migrations/*.sql
//	var migrations embed.FS
//
//	sub, err := fs.Sub(migrations, "migrations")
//	if err != nil {
//		return err
//	}
//	err = migrate.Up(ctx, db, migrate.Config{Extra: sub})
//
// where migrations/00001_orders.sql reads
//
//	-- +goose Up
//	CREATE TABLE orders (id TEXT PRIMARY KEY, total_cents BIGINT NOT NULL);
//
//	-- +goose Down
//	DROP TABLE orders;
//
// # Checking before serving
//
// Check tells, without changing anything, whether the database has every
// migration this binary ships; a service that does not apply them at start
// calls it and refuses to run on a database that is behind:
//
//	if err := migrate.Check(ctx, db, cfg); err != nil {
//		var behind *migrate.BehindError
//		if errors.As(err, &behind) {
//			return fmt.Errorf("%w: run the migrations first", err)
//		}
//		return err
//	}
//
// A database ahead of the binary, migrated by a newer release during a
// rolling deploy, passes.
//
// # Status
//
// Status lists every migration of both sets with whether it is applied,
// for the operator's command line.
package migrate
