package framework_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
)

// groupBackend is a database with the framework's tables and a table of
// effects, and the framework's store on it.
type groupBackend struct {
	db    *sqlx.DB
	store framework.Store
	// txid returns an id of the transaction tx runs in.
	txid func(ctx context.Context, tx sqlx.QueryerContext) (string, error)
}

func groupBackends(t *testing.T) map[string]func(t *testing.T) groupBackend {
	return map[string]func(t *testing.T) groupBackend{
		"SQLite": func(t *testing.T) groupBackend {
			db := testenv.SQLite(t)
			require.NoError(t, migrate.Up(t.Context(), db, migrate.Config{}))
			store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
			require.NoError(t, err)
			_, err = db.Exec(`CREATE TABLE effects (id TEXT PRIMARY KEY, seen INTEGER NOT NULL)`)
			require.NoError(t, err)
			return groupBackend{db: db, store: store, txid: func(ctx context.Context, _ sqlx.QueryerContext) (string, error) {
				// SQLite has no transaction id: what another connection
				// sees tells. The rows of attempts that committed alone
				// would show; those of a batch still open do not.
				var n int
				err := db.GetContext(ctx, &n, `SELECT count(*) FROM effects`)
				return fmt.Sprint(n), err
			}}
		},
		"PostgreSQL": func(t *testing.T) groupBackend {
			db := testenv.Postgres(t)
			require.NoError(t, migrate.Up(t.Context(), db, migrate.Config{}))
			store, err := postgres.NewStore(db, postgres.StoreConfig{})
			require.NoError(t, err)
			_, err = db.Exec(`CREATE TABLE effects (id TEXT PRIMARY KEY, seen INTEGER NOT NULL)`)
			require.NoError(t, err)
			return groupBackend{db: db, store: store, txid: func(ctx context.Context, tx sqlx.QueryerContext) (string, error) {
				var id string
				err := sqlx.GetContext(ctx, tx, &id, `SELECT txid_current()::text`)
				return id, err
			}}
		},
	}
}

// TestGroupCommit gathers attempts into one batch and shows that each
// keeps its own fate: a failing and a panicking attempt roll back alone
// while their batch-mates commit, in one transaction, with the hooks of
// each attempt run for it alone.
func TestGroupCommit(t *testing.T) {
	t.Parallel()
	for name, open := range groupBackends(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := open(t)
			uow, err := framework.NewUnitOfWork(framework.UnitOfWorkConfig{DB: b.db, Store: b.store, BatchSize: 8, Batches: 1})
			require.NoError(t, err)

			// The first attempt holds the only batch slot until the
			// others wait, so that they form one batch.
			started, release := make(chan struct{}), make(chan struct{})
			first := make(chan error, 1)
			go func() {
				_, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: "first"}, func(ctx context.Context) error {
					close(started)
					<-release
					_, err := framework.Conn(ctx, b.db).ExecContext(ctx, b.db.Rebind(`INSERT INTO effects (id, seen) VALUES ('first', 1)`))
					return err
				})
				first <- err
			}()
			<-started

			type result struct {
				outcome  framework.Outcome
				err      error
				panicked any
				txid     string
				hooks    []string
			}
			ids := []string{"a", "fails", "b", "panics", "a", "c"}
			results := make([]result, len(ids))
			var wg sync.WaitGroup
			for i, id := range ids {
				wg.Go(func() {
					r := &results[i]
					defer func() { r.panicked = recover() }()
					r.outcome, r.err = uow.Do(ctx, "c", framework.Key{Source: "s", ID: id}, func(ctx context.Context) error {
						tx, ok := framework.TxFromContext(ctx)
						require.True(t, ok)
						tx.OnCommit(func() { r.hooks = append(r.hooks, "commit") })
						tx.OnRollback(func() { r.hooks = append(r.hooks, "rollback") })
						if _, err := framework.Conn(ctx, b.db).ExecContext(ctx, tx.Rebind(`INSERT INTO effects (id, seen) VALUES (?, 1)`), id); err != nil {
							return err
						}
						r.txid, _ = b.txid(ctx, tx)
						switch id {
						case "fails":
							return errors.New("handler failed")
						case "panics":
							panic("handler panicked")
						}
						return nil
					})
				})
				// In order: the duplicate comes after its first.
				require.Eventually(t, func() bool { return framework.Waiting(uow) == i+1 }, 10*time.Second, time.Millisecond,
					"attempt %d waits for a batch", i)
			}
			close(release)
			require.NoError(t, <-first)
			wg.Wait()

			for i, id := range ids {
				r := results[i]
				switch {
				case id == "fails":
					require.EqualError(t, r.err, "handler failed")
					require.Equal(t, framework.Failed, r.outcome)
					require.Equal(t, []string{"rollback"}, r.hooks)
				case id == "panics":
					require.Equal(t, "handler panicked", r.panicked, "the panic goes on up on the attempt's own goroutine")
					require.Equal(t, []string{"rollback"}, r.hooks)
				case i == 4:
					require.NoError(t, r.err)
					require.Equal(t, framework.Duplicate, r.outcome, "the second delivery of a in the same batch")
					require.Empty(t, r.hooks)
				default:
					require.NoError(t, r.err, id)
					require.Equal(t, framework.Processed, r.outcome, id)
					require.Equal(t, []string{"commit"}, r.hooks, id)
				}
			}
			if name == "PostgreSQL" {
				require.Equal(t, results[0].txid, results[2].txid, "a and b committed in one transaction")
				require.Equal(t, results[0].txid, results[5].txid)
			} else {
				for _, i := range []int{0, 2, 5} {
					require.Equal(t, "1", results[i].txid, "%s: outside the batch only the first attempt's row shows", ids[i])
				}
			}

			var got []string
			require.NoError(t, b.db.SelectContext(ctx, &got, `SELECT id FROM effects ORDER BY id`))
			require.Equal(t, []string{"a", "b", "c", "first"}, got)
			for _, id := range []string{"fails", "panics"} {
				out, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: id}, func(ctx context.Context) error { return nil })
				require.NoError(t, err)
				require.Equal(t, framework.Processed, out, "%s left no processed mark: it is retried", id)
			}
		})
	}
}
