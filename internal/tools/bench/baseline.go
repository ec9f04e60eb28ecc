package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
)

// The hand-written consumer's tables, in the run's own PostgreSQL
// schema: the dedup marks and the business rows (the example's reminders,
// timestamped).
const (
	baselineConsumer = "bench.baseline"
	baselineSchema   = `CREATE TABLE bench_processed (
    consumer     TEXT NOT NULL,
    source       TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, source, event_id)
);
CREATE TABLE bench_reminders (
    appointment_id TEXT NOT NULL,
    starts_at      TEXT NOT NULL,
    event_id       TEXT NOT NULL,
    ` + handledAtPostgres + `
)`
)

// baselineHandler is what a team writes by hand instead of the framework:
// per message its own transaction with the dedup insert and the business
// insert, commit, then the ack (the handler returning nil). A duplicate
// commits nothing new and is acked; an error nacks. With wait above zero
// it first waits that long, as a handler that calls an outside service
// does before writing what came of the call.
func baselineHandler(db *sqlx.DB, wait time.Duration) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		ev, err := decodeBaseline(msg)
		if err != nil {
			return err
		}
		ctx := msg.Context()
		if wait > 0 {
			if err := sleep(ctx, wait); err != nil {
				return fmt.Errorf("outside call: %w", err)
			}
		}
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		defer func() { _ = tx.Rollback() }()
		if err := writeBaselineEffect[sql.Result](ctx, tx, ev); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		return nil
	}
}

// openBaselineDB opens the baseline's pool with room for conns
// connections, all kept open: database/sql keeps two idle by default, and
// a pool that closes and opens a connection per message measures
// PostgreSQL's connection set-up instead of the consumer.
func openBaselineDB(c *ChildEnv, conns int) (*sqlx.DB, error) {
	db, err := sqlx.Open("pgx", c.Getenv(envBaselineDB))
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return db, nil
}

// runRouter runs router until ctx ends, calling ready once it runs.
func runRouter(ctx context.Context, router *message.Router, ready func()) error {
	errc := make(chan error, 1)
	go func() { errc <- router.Run(ctx) }()
	select {
	case <-router.Running():
		ready()
	case err := <-errc:
		return fmt.Errorf("router: %w", err)
	}
	<-ctx.Done()
	if err := router.Close(); err != nil {
		return fmt.Errorf("close router: %w", err)
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("router: %w", err)
	}
	return nil
}

// newRouter returns a router with no middleware, as the hand-written
// consumer has none: a failing message is nacked and comes back.
func newRouter() (*message.Router, error) {
	router, err := message.NewRouter(message.RouterConfig{}, quietLogger())
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	return router, nil
}

// quietLogger logs watermill's warnings and errors to standard error.
func quietLogger() watermill.LoggerAdapter {
	return watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// openPostgres opens a pool on url, closed after the run.
func openPostgres(ctx context.Context, env *Env, url string) (*sqlx.DB, error) {
	db, err := sqlx.Open("pgx", url)
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	env.Cleanup(func(context.Context) error { return db.Close() })
	if err := db.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	return db, nil
}

// openSchema creates a schema of the run's own and opens a pool on it,
// closed after the run. It returns the schema's URL and the pool.
func openSchema(ctx context.Context, env *Env) (string, *sqlx.DB, error) {
	url, err := env.PostgresSchema(ctx)
	if err != nil {
		return "", nil, err
	}
	db, err := openPostgres(ctx, env, url)
	if err != nil {
		return "", nil, err
	}
	return url, db, nil
}

// baselineDB opens a schema of the run's own holding the hand-written
// baselines' tables.
func baselineDB(ctx context.Context, env *Env) (string, *sqlx.DB, error) {
	url, db, err := openSchema(ctx, env)
	if err != nil {
		return "", nil, err
	}
	if _, err := db.ExecContext(ctx, baselineSchema); err != nil {
		return "", nil, fmt.Errorf("baseline schema: %w", err)
	}
	return url, db, nil
}

// serviceDB opens a schema of the run's own prepared for the example
// service on transport (see prepareService).
func serviceDB(ctx context.Context, env *Env, transport string) (string, *sqlx.DB, error) {
	url, db, err := openSchema(ctx, env)
	if err != nil {
		return "", nil, err
	}
	if err := prepareService(ctx, env, db, transport, url); err != nil {
		return "", nil, err
	}
	return url, db, nil
}

// serviceVars returns the example service's variables for transport and
// the database at url, with its auto migration on and config as its
// configuration file (none when empty).
func serviceVars(transport, url, config string) map[string]string {
	vars := map[string]string{
		"EFFECTIVELY_TRANSPORT":    transport,
		"EFFECTIVELY_DATABASE_URL": url,
		"EFFECTIVELY_AUTO_MIGRATE": "true",
	}
	if config != "" {
		vars["EFFECTIVELY_CONFIG"] = config
	}
	return vars
}

// prepareService applies the example service's migrations to the database
// at url, for transport, and adds the handled_at column to its reminders.
func prepareService(ctx context.Context, env *Env, db *sqlx.DB, transport, url string) error {
	vars := map[string]string{"EFFECTIVELY_TRANSPORT": transport, "EFFECTIVELY_DATABASE_URL": url}
	if err := env.Service(ctx, vars, "migrate"); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `ALTER TABLE reminders ADD COLUMN `+handledAtPostgres); err != nil {
		return fmt.Errorf("timestamp the reminders: %w", err)
	}
	return nil
}

// decodeBaseline decodes the event of msg as the hand-written consumers
// do, refusing one without its id, source or appointment.
func decodeBaseline(msg *message.Message) (cloudEvent, error) {
	var ev cloudEvent
	if err := json.Unmarshal(msg.Payload, &ev); err != nil {
		return ev, fmt.Errorf("decode: %w", err)
	}
	if ev.ID == "" || ev.Source == "" || ev.Data.AppointmentID == "" {
		return ev, errors.New("decode: missing id, source or appointment")
	}
	return ev, nil
}

// execer is a transaction whose statements return results of type R:
// database/sql's, or watermill-sql's for its subscriber's transaction.
type execer[R interface{ RowsAffected() (int64, error) }] interface {
	ExecContext(ctx context.Context, query string, args ...any) (R, error)
}

// writeBaselineEffect writes the hand-written consumers' effect of ev in
// tx: its dedup mark, and its reminder unless the mark was there.
func writeBaselineEffect[R interface{ RowsAffected() (int64, error) }](ctx context.Context, tx execer[R], ev cloudEvent) error {
	res, err := tx.ExecContext(ctx, `INSERT INTO bench_processed (consumer, source, event_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
		baselineConsumer, ev.Source, ev.ID)
	if err != nil {
		return fmt.Errorf("dedup insert: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("dedup insert: %w", err)
	} else if n == 1 {
		if _, err := tx.ExecContext(ctx, `INSERT INTO bench_reminders (appointment_id, starts_at, event_id) VALUES ($1, $2, $3)`,
			ev.Data.AppointmentID, ev.Data.StartsAt.UTC().Format(time.RFC3339), ev.ID); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
	}
	return nil
}
