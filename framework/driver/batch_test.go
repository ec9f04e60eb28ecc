package driver_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/internal/testenv"
)

// groupBackend is a database with the framework's tables and a table of
// effects, and the framework's store on it.
type groupBackend struct {
	db    *sqlx.DB
	store driver.Store
	// txid returns an id of the transaction tx runs in.
	txid func(ctx context.Context, tx sqlx.QueryerContext) (string, error)
}

// insert writes the effect of id in the attempt's transaction of ctx.
func (b groupBackend) insert(ctx context.Context, id string) error {
	_, err := framework.Conn(ctx, b.db).ExecContext(ctx, b.db.Rebind(`INSERT INTO effects (id, seen) VALUES (?, 1)`), id)
	return err
}

// unitOfWork returns a unit of work on b that runs one batch at a time,
// of up to 8 attempts, whose attempts never overlap: gather's first
// attempt waits in its handler, outside the database, which would make
// the next ones overlap on PostgreSQL (see TestOutsideCallsOverlap).
func (b groupBackend) unitOfWork(t testing.TB) *driver.UnitOfWork {
	t.Helper()
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store, BatchSize: 8, Batches: 1, Overlap: 1})
	require.NoError(t, err)
	return uow
}

func groupBackends() map[string]func(t testing.TB) groupBackend {
	return map[string]func(t testing.TB) groupBackend{
		"SQLite": func(t testing.TB) groupBackend {
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
		"PostgreSQL": func(t testing.TB) groupBackend {
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
// keeps its own fate: a failing and a panicking attempt fail alone while
// their batch-mates commit, in one transaction, with the hooks of each
// attempt run for it alone.
func TestGroupCommit(t *testing.T) {
	t.Parallel()
	for name, open := range groupBackends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := open(t)
			uow := b.unitOfWork(t)

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
			ids := []string{"a", "fails", "b", "panics", "a", "c", "first"}
			results := make([]result, len(ids))
			var wg sync.WaitGroup
			for i, id := range ids {
				wg.Go(func() {
					r := &results[i]
					defer func() { r.panicked = recover() }()
					r.outcome, r.err = uow.Do(ctx, "c", framework.Key{Source: "s", ID: id}, func(ctx context.Context) error {
						tx, ok := driver.TxFromContext(ctx)
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
				require.Eventually(t, func() bool { return driver.Waiting(uow) == i+1 }, 10*time.Second, time.Millisecond,
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
				case id == "first":
					require.NoError(t, r.err)
					require.Equal(t, framework.Duplicate, r.outcome, "processed before the batch")
					require.Empty(t, r.hooks)
				default:
					require.NoError(t, r.err, id)
					require.Equal(t, framework.Processed, r.outcome, id)
				}
			}
			// Each failure rolled the batch back, and the attempts that had
			// run before it ran again without it: a ran thrice, b twice, c
			// once; each effect committed once.
			require.Equal(t, []string{"rollback", "rollback", "commit"}, results[0].hooks)
			require.Equal(t, []string{"rollback", "commit"}, results[2].hooks)
			require.Equal(t, []string{"commit"}, results[5].hooks)
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

// gatherDeadlines is how long gather gives an attempt, by the prefix of
// its id: "late" outlasts the gathering of its batch on a loaded machine,
// so that its batch starts before its deadline.
var gatherDeadlines = map[string]time.Duration{
	"slow":     300 * time.Millisecond,
	"late":     2 * time.Second,
	"deadline": time.Minute,
}

// requireProcessed requires that every attempt gather ran succeeded and
// took effect.
func requireProcessed(t *testing.T, outcomes []framework.Outcome, errs []error) {
	t.Helper()
	for i := range errs {
		require.NoError(t, errs[i], i)
		require.Equal(t, framework.Processed, outcomes[i], i)
	}
}

// gather runs fn for each of ids at once on uow, as attempts of one
// batch: a first attempt holds the only batch slot until all of them
// wait. An attempt whose id starts with a prefix of gatherDeadlines has
// that long. It returns each attempt's outcome and error.
func gather(t *testing.T, uow *driver.UnitOfWork, ids []string, fn func(ctx context.Context, id string) error) ([]framework.Outcome, []error) {
	t.Helper()
	ctx := t.Context()
	started, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: "holder-" + ids[0]}, func(context.Context) error {
			close(started)
			<-release
			return nil
		})
		first <- err
	}()
	<-started
	outcomes, errs := make([]framework.Outcome, len(ids)), make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			actx := ctx
			for prefix, d := range gatherDeadlines {
				if strings.HasPrefix(id, prefix) {
					var cancel context.CancelFunc
					actx, cancel = context.WithTimeout(ctx, d)
					defer cancel()
				}
			}
			outcomes[i], errs[i] = uow.Do(actx, "c", framework.Key{Source: "s", ID: id}, func(ctx context.Context) error { return fn(ctx, id) })
		})
		require.Eventually(t, func() bool { return driver.Waiting(uow) == i+1 }, 10*time.Second, time.Millisecond)
	}
	close(release)
	require.NoError(t, <-first)
	wg.Wait()
	return outcomes, errs
}

// TestGroupCommitTimeout shows that an attempt that runs past its
// deadline rolls back alone: on PostgreSQL its statement fails by the
// statement_timeout the batch sets for it, never by interrupting the
// batch's connection; on SQLite its next statement fails.
func TestGroupCommitTimeout(t *testing.T) {
	t.Parallel()
	for name, open := range groupBackends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := open(t)
			uow := b.unitOfWork(t)
			outcomes, errs := gather(t, uow, []string{"a", "slow", "b"}, func(ctx context.Context, id string) error {
				if err := b.insert(ctx, id); err != nil {
					return err
				}
				if id != "slow" {
					return nil
				}
				if name == "PostgreSQL" {
					_, err := framework.Conn(ctx, b.db).ExecContext(ctx, `SELECT pg_sleep(10)`)
					return err
				}
				<-ctx.Done() // past the deadline, between statements
				return b.insert(ctx, "slow-again")
			})
			require.NoError(t, errs[0])
			require.NoError(t, errs[2])
			require.Equal(t, []framework.Outcome{framework.Processed, framework.Failed, framework.Processed}, outcomes)
			if name == "PostgreSQL" {
				require.ErrorContains(t, errs[1], "statement timeout", "the attempt's own statement_timeout ended it")
			} else {
				require.ErrorIs(t, errs[1], context.DeadlineExceeded)
			}
			var got []string
			require.NoError(t, b.db.SelectContext(t.Context(), &got, `SELECT id FROM effects ORDER BY id`))
			require.Equal(t, []string{"a", "b"}, got)
		})
	}
}

// TestGroupCommitFailedCommit shows that when a batch's commit fails, its
// attempts run again alone before any is charged a failure: here two
// attempts insert the same seat under a constraint checked at commit, so
// the batch cannot commit. Alone, x fails this time and y commits; the
// second delivery of x, a duplicate only within the failed batch, is
// decided again and takes effect.
func TestGroupCommitFailedCommit(t *testing.T) {
	t.Parallel()
	b := groupBackends()["PostgreSQL"](t)
	_, err := b.db.Exec(`CREATE TABLE seats (seat TEXT, CONSTRAINT one_per_seat UNIQUE (seat) DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	uow := b.unitOfWork(t)
	var (
		mu     sync.Mutex
		hooks  = map[string][]string{}
		xCalls int
	)
	outcomes, errs := gather(t, uow, []string{"x", "y", "x"}, func(ctx context.Context, id string) error {
		tx, _ := driver.TxFromContext(ctx)
		tx.OnCommit(func() { mu.Lock(); hooks[id] = append(hooks[id], "commit"); mu.Unlock() })
		tx.OnRollback(func() { mu.Lock(); hooks[id] = append(hooks[id], "rollback"); mu.Unlock() })
		if id == "x" {
			mu.Lock()
			xCalls++
			call := xCalls
			mu.Unlock()
			switch call {
			case 2:
				return errors.New("x failed alone")
			case 3:
				return nil // the second delivery of x, run alone
			}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO seats (seat) VALUES ('12A')`)
		return err
	})
	require.EqualError(t, errs[0], "x failed alone")
	require.Equal(t, framework.Failed, outcomes[0])
	require.NoError(t, errs[1])
	require.Equal(t, framework.Processed, outcomes[1], "alone, y commits")
	require.NoError(t, errs[2])
	require.Equal(t, framework.Processed, outcomes[2], "x's second delivery was a duplicate only of an effect that never committed")
	require.Equal(t, 3, xCalls)
	require.Equal(t, []string{"rollback", "rollback", "commit"}, hooks["x"], "with the batch, alone, then the second delivery alone")
	require.Equal(t, []string{"rollback", "commit"}, hooks["y"])
	var seats int
	require.NoError(t, b.db.Get(&seats, `SELECT count(*) FROM seats`))
	require.Equal(t, 1, seats)
}

// BenchmarkGroupCommit runs 32 attempts at a time, each inserting its
// effect, with a transaction per attempt and with group commit.
func BenchmarkGroupCommit(b *testing.B) {
	for name, open := range groupBackends() {
		for _, size := range []int{1, driver.DefaultBatchSize} {
			b.Run(fmt.Sprintf("%s/BatchSize%d", name, size), func(b *testing.B) {
				bk := open(b)
				uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: bk.db, Store: bk.store, BatchSize: size})
				require.NoError(b, err)
				var n atomic.Int64
				b.SetParallelism(16)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						id := strconv.FormatInt(n.Add(1), 10)
						_, err := uow.Do(context.Background(), "c", framework.Key{Source: "s", ID: id}, func(ctx context.Context) error {
							_, err := framework.Conn(ctx, bk.db).ExecContext(ctx, bk.db.Rebind(`INSERT INTO effects (id, seen) VALUES (?, 1)`), id)
							return err
						})
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "effects/s")
			})
		}
	}
}

// TestMarkMany shows the SQL stores' one-statement marks of a batch: new
// marks are reported new, a mark made before, every repeat within the
// keys and an event whose dead letter is discarded are not.
func TestMarkMany(t *testing.T) {
	t.Parallel()
	for name, open := range groupBackends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := open(t)
			uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store, BatchSize: 1})
			require.NoError(t, err)
			_, err = uow.Do(ctx, "c", framework.Key{Source: "s", ID: "old"}, func(context.Context) error { return nil })
			require.NoError(t, err)

			m, ok := b.store.(interface {
				MarkMany(ctx context.Context, tx *driver.Tx, consumer string, keys []framework.Key) ([]bool, error)
			})
			require.True(t, ok)
			k := func(id string) framework.Key { return framework.Key{Source: "s", ID: id} }
			for _, id := range []string{"gone", "kept"} {
				require.NoError(t, b.store.PublishDeadLetter(ctx, driver.DeadLetter{
					Consumer: "c", Topic: "t", Source: "s", EventID: id, Code: framework.CodeInvalidPayload, Body: []byte(id),
				}))
			}
			dls, err := b.store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: "c", EventID: "gone"})
			require.NoError(t, err)
			require.Len(t, dls, 1)
			_, err = b.store.ResolveDeadLetter(ctx, dls[0].ID, driver.Resolution{Status: driver.DeadLetterDiscarded, By: "ops"})
			require.NoError(t, err)
			_, err = uow.Do(ctx, "c", k("holder"), func(ctx context.Context) error {
				tx, _ := driver.TxFromContext(ctx)
				first, err := m.MarkMany(ctx, tx, "c", []framework.Key{k("z"), k("old"), k("gone"), k("a"), k("z"), k("kept"), k("holder")})
				require.NoError(t, err)
				require.Equal(t, []bool{true, false, false, true, false, true, false}, first, "gone is discarded, kept pending")
				return nil
			})
			require.NoError(t, err)

			// Text that JSON escapes, or that SQLite's JSON would not give
			// back (invalid UTF-8, NUL: SQLite stores it, PostgreSQL
			// refuses it), is marked as it is: the one-event mark of the
			// same key finds it.
			odd := []framework.Key{
				{Source: `s"\`, ID: "quote\"\\ control\x01\t line\u2028 <&> \U0001F600"},
				{Source: "s", ID: strings.Repeat("long-", 50)},
				k("gone"), // discarded: not marked, in a statement of their size too
			}
			if name == "SQLite" {
				odd = append(odd, framework.Key{Source: "s", ID: "bad\xffutf8"}, framework.Key{Source: "s", ID: "nul\x00byte"})
			}
			_, err = uow.Do(ctx, "c", k("holder-odd"), func(ctx context.Context) error {
				tx, _ := driver.TxFromContext(ctx)
				first, err := m.MarkMany(ctx, tx, "c", odd)
				require.NoError(t, err)
				want := slices.Repeat([]bool{true}, len(odd))
				want[2] = false // gone is discarded
				require.Equal(t, want, first)
				return nil
			})
			require.NoError(t, err)
			for _, key := range odd {
				out, err := uow.Do(ctx, "c", key, func(context.Context) error { return nil })
				require.NoError(t, err)
				require.Equal(t, framework.Duplicate, out, "%q", key)
			}
		})
	}
}

// TestGroupCommitResetsSettings shows that on PostgreSQL what an attempt
// sets in the batch's transaction (set_config(..., true), SET LOCAL) does
// not reach the next attempt of its batch, while its writes commit with
// the batch, and the batch's statement timeout still holds after the
// reset.
func TestGroupCommitResetsSettings(t *testing.T) {
	t.Parallel()
	b := groupBackends()["PostgreSQL"](t)
	uow := b.unitOfWork(t)
	type seen struct{ tenant, workMem, timeout, txid string }
	var mu sync.Mutex
	saw := map[string]seen{}
	ids := []string{"deadline-a", "deadline-b", "deadline-c"} // with deadlines: the batch sets a statement timeout
	outcomes, errs := gather(t, uow, ids, func(ctx context.Context, id string) error {
		conn := framework.Conn(ctx, b.db)
		var s seen
		if err := sqlx.GetContext(ctx, conn, &s.tenant, `SELECT coalesce(current_setting('app.tenant', true), '')`); err != nil {
			return err
		}
		if err := sqlx.GetContext(ctx, conn, &s.workMem, `SHOW work_mem`); err != nil {
			return err
		}
		if err := sqlx.GetContext(ctx, conn, &s.timeout, `SHOW statement_timeout`); err != nil {
			return err
		}
		var err error
		if s.txid, err = b.txid(ctx, conn); err != nil {
			return err
		}
		mu.Lock()
		saw[id] = s
		mu.Unlock()
		if id != ids[2] {
			if _, err := conn.ExecContext(ctx, `SELECT set_config('app.tenant', $1, true)`, "tenant-"+id); err != nil {
				return err
			}
			if _, err := conn.ExecContext(ctx, `SET LOCAL work_mem = '77MB'`); err != nil {
				return err
			}
		}
		_, err = conn.ExecContext(ctx, `INSERT INTO effects (id, seen) VALUES ($1, 1)`, id)
		return err
	})
	requireProcessed(t, outcomes, errs)
	first := saw[ids[0]]
	require.Equal(t, first.txid, saw[ids[2]].txid, "one batch, one transaction")
	require.NotEqual(t, "0", first.timeout, "the batch sets a statement timeout")
	for _, id := range ids {
		require.Empty(t, saw[id].tenant, "%s sees no tenant of an earlier attempt", id)
		require.Equal(t, first.workMem, saw[id].workMem, "%s sees the session's work_mem", id)
		require.Equal(t, first.timeout, saw[id].timeout, "%s runs under the batch's statement timeout", id)
	}
	var n int
	require.NoError(t, b.db.GetContext(t.Context(), &n, `SELECT count(*) FROM effects`))
	require.Equal(t, 3, n)
}

// TestSetsSession: the statements after which a batch resets the
// session's settings, and the common ones after which it does not.
func TestSetsSession(t *testing.T) {
	for q, want := range map[string]bool{
		`SET LOCAL app.tenant = 'a'`:                    true,
		"  set\tsearch_path TO x":                       true,
		`RESET ALL`:                                     true,
		`SELECT set_config('app.tenant', $1, true)`:     true,
		`select SET_CONFIG('app.tenant', $1, true)`:     true,
		`(SELECT Set_Config('a.b', 'c', true))`:         true,
		`UPDATE t SET x = 1`:                            false,
		`INSERT INTO settings (k) VALUES ('set')`:       false,
		`INSERT INTO reminders (id) VALUES ($1)`:        false,
		`SELECT id FROM t WHERE name = 'offset_config'`: false,
		``:                                     false,
		"SELECT 1; SET LOCAL app.tenant = 'a'": true,
		"/* tenant */ SET LOCAL app.tenant = 'a'": true,
		"INSERT INTO t VALUES ('x; SET y = 1')":   false,
	} {
		for _, pg := range []bool{false, true} {
			require.Equal(t, want, driver.SetsSession(q, pg), "%q, PostgreSQL %t", q, pg)
		}
	}
	// With standard_conforming_strings off, the SET is outside the string.
	require.True(t, driver.SetsSession(`SELECT 'a\'' ; SET LOCAL app.tenant = 'b'; --'`, true))
	require.False(t, driver.SetsSession(`SELECT 'a\'' ; SET LOCAL app.tenant = 'b'; --'`, false))
}

// TestEndsTransaction: the statements a Tx refuses, as they would begin
// or end the attempt's transaction, and the ones it runs.
func TestEndsTransaction(t *testing.T) {
	for q, want := range map[string]bool{
		`COMMIT`:                          true,
		`commit;`:                         true,
		"  -- done\n  Commit Transaction": true,
		`/* x */ END`:                     true,
		`END TRANSACTION`:                 true,
		`ROLLBACK`:                        true,
		`rollback work`:                   true,
		`ABORT`:                           true,
		`BEGIN`:                           true,
		`begin immediate`:                 true,
		`START TRANSACTION`:               true,
		`PREPARE TRANSACTION 'x'`:         true,
		`ROLLBACK TO SAVEPOINT sp`:        false,
		`rollback transaction to sp`:      false,
		`SAVEPOINT sp`:                    false,
		`RELEASE SAVEPOINT sp`:            false,
		`PREPARE q AS SELECT 1`:           false,
		`INSERT INTO log (what) VALUES ('commit')`:     false,
		`UPDATE t SET ended = true`:                    false,
		`SELECT endpoint FROM t`:                       false,
		`WITH begun AS (SELECT 1) SELECT * FROM begun`: false,
		``: false,
		// A COMMIT after another statement of the query, or behind white
		// space of any kind, runs as well as one at its start.
		"SELECT 1; COMMIT":                        true,
		"INSERT INTO t VALUES (1);\n/**/commit":   true,
		"SELECT 1;;\t End":                        true,
		"\fCOMMIT":                                true,
		"\vCOMMIT":                                true,
		"SELECT 'it''s'; ROLLBACK":                true,
		`SELECT "a;b"; BEGIN`:                     true,
		"SELECT 1 -- ; COMMIT\n; COMMIT":          true,
		"SELECT 1; ROLLBACK TO SAVEPOINT sp":      false,
		"SAVEPOINT sp; RELEASE sp":                false,
		"SELECT 1; -- COMMIT":                     false,
		"SELECT 1 /* ; COMMIT */":                 false,
		"INSERT INTO t VALUES ('x; COMMIT')":      false,
		`INSERT INTO "t;commit" VALUES (1)`:       false,
		"SELECT CASE WHEN x THEN 1 END; SELECT 2": false,
		"SELECT commit_id FROM t; SELECT 2":       false,
	} {
		for _, pg := range []bool{false, true} {
			require.Equal(t, want, driver.EndsTransaction(q, pg), "%q, PostgreSQL %t", q, pg)
		}
	}
	// Each database's own lexical rules: PostgreSQL nests comments, quotes
	// with dollars and escapes with backslashes in E'' strings, and its
	// BEGIN ATOMIC bodies hold statements; SQLite quotes names with
	// brackets and backticks, and its triggers' bodies hold statements.
	for _, c := range []struct {
		q      string
		pg     bool
		refuse bool
	}{
		{"/* /* */ x */ COMMIT", true, true},
		{"/* /* */ COMMIT; -- */", false, true},
		{"/* /* */ COMMIT; -- */", true, false},
		{`SELECT E'\''; COMMIT; --'`, true, true},
		{`SELECT E'\''; COMMIT; --'`, false, false},
		// A plain string ends where standard_conforming_strings says: off,
		// a backslash escapes its quote, and the COMMIT is outside.
		{`SELECT 'a\'' ; COMMIT ; --'`, true, true},
		{`SELECT 'a\'' ; COMMIT ; --'`, false, false},
		{`SELECT 'C:\dir\'; SELECT 'x; COMMIT'`, true, true}, // off, the second string is 'x
		{`SELECT 'C:\dir\' || 'x'`, true, false},
		{`SELECT 'C:\dir\' || 'x'; COMMIT`, true, true},
		{"DO $$BEGIN PERFORM 1; END$$", true, false},
		{"SELECT $tag$ ; COMMIT $tag$; SELECT $1", true, false},
		{"SELECT $tag$ x $tag$; COMMIT", true, true},
		{"CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT CASE WHEN true THEN 1 END; END", true, false},
		{"CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END; COMMIT", true, true},
		{"SELECT [a;commit] FROM t", false, false},
		{"SELECT `a;commit` FROM t", false, false},
		{"CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE u SET n = CASE WHEN 1 THEN 2 END; END", false, false},
		{"CREATE TEMP TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END; COMMIT", false, true},
	} {
		require.Equal(t, c.refuse, driver.EndsTransaction(c.q, c.pg), "%q, PostgreSQL %t", c.q, c.pg)
	}
}

// TestHandlerCommitRefused: a handler that runs COMMIT in the attempt's
// transaction, then fails, would commit its write and the processed mark
// with it, and its next attempt would be a duplicate: the failed effect
// taken for done. The statement is refused, also when it follows another
// statement of the query or hides behind white space or a comment that
// the database skips; the attempt rolls back and the next one takes
// effect, once.
func TestHandlerCommitRefused(t *testing.T) {
	t.Parallel()
	for name, open := range groupBackends() {
		commits := []string{`COMMIT`, "SELECT 1; COMMIT", "SELECT 1;\n/**/commit", "\fCOMMIT"}
		if name == "PostgreSQL" {
			commits = append(commits, "/* /* */ x */ COMMIT") // PostgreSQL nests comments
		}
		for _, commit := range commits {
			t.Run(name+"/"+commit, func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				b := open(t)
				uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store})
				require.NoError(t, err)
				key := framework.Key{Source: "s", ID: "e-1"}
				runs := 0
				handle := func(ctx context.Context) error {
					runs++
					conn := framework.Conn(ctx, b.db)
					if _, err := conn.ExecContext(ctx, b.db.Rebind(`INSERT INTO effects (id, seen) VALUES (?, ?)`), key.ID, runs); err != nil {
						return err
					}
					if runs == 1 {
						if _, err := conn.ExecContext(ctx, commit); err != nil {
							return err
						}
						return errors.New("fails after its commit")
					}
					return nil
				}
				_, err = uow.Do(ctx, "c", key, handle)
				require.ErrorIs(t, err, framework.ErrEndsTransaction)
				outcome, err := uow.Do(ctx, "c", key, handle)
				require.NoError(t, err)
				require.Equal(t, framework.Processed, outcome, "the failed attempt left no mark")
				var seen []int
				require.NoError(t, b.db.SelectContext(ctx, &seen, `SELECT seen FROM effects`))
				require.Equal(t, []int{2}, seen, "only the attempt that succeeded took effect")
			})
		}
	}
}

// TestGroupCommitWaitsForRunningBatch: with a batch slot free while
// another batch runs, arriving attempts do not start a batch of one
// each: they wait, unless their batch fills, until the running batch
// ends, and then run together in one transaction.
func TestGroupCommitWaitsForRunningBatch(t *testing.T) {
	t.Parallel()
	b := groupBackends()["PostgreSQL"](t)
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store, BatchSize: 8, Batches: 2, Overlap: 1}) // see unitOfWork
	require.NoError(t, err)
	var mu sync.Mutex
	txids := map[string]bool{}
	// gather holds one slot with a running batch and waits for each
	// attempt to be waiting: an attempt that started a batch of its own
	// in the free slot would never be.
	outcomes, errs := gather(t, uow, []string{"x", "y", "z"}, func(ctx context.Context, id string) error {
		txid, err := b.txid(ctx, framework.Conn(ctx, b.db))
		mu.Lock()
		txids[txid] = true
		mu.Unlock()
		return err
	})
	requireProcessed(t, outcomes, errs)
	require.Len(t, txids, 1, "one batch, one transaction")
}

// TestGroupCommitHookPanics: a hook that panics runs on the goroutine of
// its batch's transaction, which may be a batch-mate's. Its panic goes up
// from its own attempt's Do; the other hooks of the batch still run, and
// the consumer's next attempts still get a batch (the panic used to take
// the batch's slot with it, so they waited forever).
func TestGroupCommitHookPanics(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := groupBackends()["SQLite"](t)
	uow := b.unitOfWork(t)
	started, release := make(chan struct{}), make(chan struct{})
	holder := make(chan error, 1)
	go func() {
		_, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: "holder"}, func(context.Context) error {
			close(started)
			<-release
			return nil
		})
		holder <- err
	}()
	<-started
	var (
		mu       sync.Mutex
		hooks    []string
		panicked = map[string]any{}
		outcomes = map[string]framework.Outcome{}
		wg       sync.WaitGroup
	)
	for i, id := range []string{"a", "panics", "b"} {
		wg.Go(func() {
			defer func() {
				mu.Lock()
				panicked[id] = recover()
				mu.Unlock()
			}()
			out, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: id}, func(ctx context.Context) error {
				tx, _ := driver.TxFromContext(ctx)
				if id == "panics" {
					tx.OnCommit(func() { panic("hook panicked") })
				}
				tx.OnCommit(func() { mu.Lock(); hooks = append(hooks, id); mu.Unlock() })
				return nil
			})
			require.NoError(t, err)
			mu.Lock()
			outcomes[id] = out
			mu.Unlock()
		})
		require.Eventually(t, func() bool { return driver.Waiting(uow) == i+1 }, 10*time.Second, time.Millisecond)
	}
	close(release)
	require.NoError(t, <-holder)
	wg.Wait()
	require.Equal(t, map[string]any{"a": nil, "panics": "hook panicked", "b": nil}, panicked,
		"the panic goes up from its own attempt's Do")
	require.Equal(t, map[string]framework.Outcome{"a": framework.Processed, "b": framework.Processed}, outcomes)
	require.ElementsMatch(t, []string{"a", "panics", "b"}, hooks, "every other hook ran")

	after := make(chan framework.Outcome, 1)
	go func() {
		out, _ := uow.Do(ctx, "c", framework.Key{Source: "s", ID: "after"}, func(context.Context) error { return nil })
		after <- out
	}()
	select {
	case out := <-after:
		require.Equal(t, framework.Processed, out)
	case <-time.After(5 * time.Second):
		t.Fatal("an attempt after the panic gets no batch")
	}
}

// TestGroupCommitAbortedByBatchMate: on PostgreSQL a handler that goes on
// after one of its statements failed (here it takes the failure for
// "nothing to do" and returns nil) leaves the batch's transaction
// aborted, and the next attempt's statements fail with SQLSTATE 25P02.
// That attempt is not charged for it: the attempts run again alone, where
// the one that aborted the transaction fails its own commit and the
// others take effect, once each.
func TestGroupCommitAbortedByBatchMate(t *testing.T) {
	t.Parallel()
	b := groupBackends()["PostgreSQL"](t)
	uow := b.unitOfWork(t)
	outcomes, errs := gather(t, uow, []string{"a", "swallows", "b", "c"}, func(ctx context.Context, id string) error {
		conn := framework.Conn(ctx, b.db)
		if id == "swallows" {
			_, _ = conn.ExecContext(ctx, `INSERT INTO no_such_table VALUES (1)`)
			return nil
		}
		_, err := conn.ExecContext(ctx, `INSERT INTO effects (id, seen) VALUES ($1, 1)`, id)
		return err
	})
	for _, i := range []int{0, 2, 3} {
		require.NoError(t, errs[i], "attempt %d is not charged for its batch-mate's failure", i)
		require.Equal(t, framework.Processed, outcomes[i], i)
	}
	require.Equal(t, framework.Failed, outcomes[1])
	require.ErrorContains(t, errs[1], "commit", "the attempt that aborted the transaction fails its commit")
	var got []string
	require.NoError(t, b.db.SelectContext(t.Context(), &got, `SELECT id FROM effects ORDER BY id`))
	require.Equal(t, []string{"a", "b", "c"}, got)
}

// TestGroupCommitEndedByBatchMate: on SQLite a failed statement may end
// the whole transaction (here the conflict clause OR ROLLBACK does). A
// handler that returns nil after one would have the attempts after it in
// its batch write outside any transaction, for good, and then run again
// alone when the commit fails: their effects twice. The batch sees the
// transaction ended before its next attempt and runs its attempts again
// alone: each effect once, and the attempt that ended it fails. A handler
// that goes on writing after it (WritesAgain) never writes outside a
// transaction either: every statement of the transaction fails from then
// on (sqlite.ErrRolledBack), as on PostgreSQL after a failed statement.
func TestGroupCommitEndedByBatchMate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		again bool // the handler writes again after the failure
	}{{"ReturnsAtOnce", false}, {"WritesAgain", true}} {
		again := c.again
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := groupBackends()["SQLite"](t)
			_, err := b.db.Exec(`INSERT INTO effects (id, seen) VALUES ('taken', 1)`)
			require.NoError(t, err)
			uow := b.unitOfWork(t)
			var afterErr atomic.Value
			outcomes, errs := gather(t, uow, []string{"a", "swallows", "b", "c"}, func(ctx context.Context, id string) error {
				conn := framework.Conn(ctx, b.db)
				if id == "swallows" {
					_, _ = conn.ExecContext(ctx, `INSERT OR ROLLBACK INTO effects (id, seen) VALUES ('taken', 2)`)
					if again {
						if _, err := conn.ExecContext(ctx, `INSERT INTO effects (id, seen) VALUES ('after', 1)`); err != nil {
							afterErr.Store(err)
						}
					}
					return nil
				}
				_, err := conn.ExecContext(ctx, `INSERT INTO effects (id, seen) VALUES (?, 1) ON CONFLICT (id) DO UPDATE SET seen = seen + 1`, id)
				return err
			})
			for _, i := range []int{0, 2, 3} {
				require.NoError(t, errs[i], i)
				require.Equal(t, framework.Processed, outcomes[i], i)
			}
			require.Equal(t, framework.Failed, outcomes[1])
			require.ErrorContains(t, errs[1], "commit", "the attempt that ended the transaction fails its commit")
			if again {
				err, _ := afterErr.Load().(error)
				require.ErrorIs(t, err, sqlite.ErrRolledBack, "the write after the rollback is refused")
			}
			type effect struct {
				ID   string
				Seen int
			}
			var got []effect
			require.NoError(t, b.db.SelectContext(t.Context(), &got, `SELECT id, seen FROM effects ORDER BY id`))
			require.Equal(t, []effect{{"a", 1}, {"b", 1}, {"c", 1}, {"taken", 1}}, got, "each effect once, none outside a transaction")
		})
	}
}

// TestSessionSettingsEndWithTheAttempt: on PostgreSQL a plain SET or
// set_config(..., false) of an attempt outlives its commit on the pool's
// connection; the attempt after it, on that connection, sees none of it,
// whether the setter ran alone (batch_size 1), last in its batch or in a
// batch of one. Before, RESET ALL ran only between two attempts of one
// batch.
func TestSessionSettingsEndWithTheAttempt(t *testing.T) {
	t.Parallel()
	for _, size := range []int{1, 8} {
		t.Run(fmt.Sprint("BatchSize", size), func(t *testing.T) {
			t.Parallel()
			b := groupBackends()["PostgreSQL"](t)
			b.db.SetMaxOpenConns(1) // the next attempt takes the same connection
			uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store, BatchSize: size, Batches: 1})
			require.NoError(t, err)
			ctx := t.Context()
			_, err = uow.Do(ctx, "c", framework.Key{Source: "s", ID: "setter"}, func(ctx context.Context) error {
				conn := framework.Conn(ctx, b.db)
				if _, err := conn.ExecContext(ctx, `SET app.tenant = 'leaked'`); err != nil {
					return err
				}
				_, err := conn.ExecContext(ctx, `SELECT set_config('app.region', 'leaked', false)`)
				return err
			})
			require.NoError(t, err)
			var tenant, region string
			_, err = uow.Do(ctx, "c", framework.Key{Source: "s", ID: "reader"}, func(ctx context.Context) error {
				conn := framework.Conn(ctx, b.db)
				return conn.QueryRowxContext(ctx, `SELECT coalesce(current_setting('app.tenant', true), ''), coalesce(current_setting('app.region', true), '')`).Scan(&tenant, &region)
			})
			require.NoError(t, err)
			require.Empty(t, tenant, "the setter's SET reached the next attempt")
			require.Empty(t, region, "the setter's set_config(..., false) reached the next attempt")
		})
	}
}

// TestStatementAfterTheHandlerReturned: a goroutine that a handler left
// running, with the attempt's context, is refused its statements once the
// handler returned (ErrAttemptEnded): they would have run in the batch's
// transaction, into its batch-mates' effect or rollback. The goroutine
// runs its statement while the attempt after it runs; both effects commit
// as before, the late row never.
func TestStatementAfterTheHandlerReturned(t *testing.T) {
	t.Parallel()
	for name, open := range groupBackends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := open(t)
			uow := b.unitOfWork(t)
			var (
				runs     atomic.Int32
				mateRuns sync.Once
				mate     = make(chan struct{})
				late     = make(chan error, 1)
				lateErr  error
			)
			insert := b.db.Rebind(`INSERT INTO effects (id, seen) VALUES (?, 1)`)
			outcomes, errs := gather(t, uow, []string{"a", "b"}, func(ctx context.Context, id string) error {
				conn := framework.Conn(ctx, b.db)
				if runs.Add(1) == 1 { // the first to run leaves a goroutine behind
					go func() {
						<-mate
						_, err := conn.ExecContext(ctx, insert, "late")
						late <- err
					}()
				} else {
					mateRuns.Do(func() {
						close(mate)
						lateErr = <-late
					})
				}
				_, err := conn.ExecContext(ctx, insert, id)
				return err
			})
			requireProcessed(t, outcomes, errs)
			require.ErrorIs(t, lateErr, framework.ErrAttemptEnded)
			var ids []string
			require.NoError(t, b.db.SelectContext(t.Context(), &ids, `SELECT id FROM effects ORDER BY id`))
			require.Equal(t, []string{"a", "b"}, ids)
		})
	}
}

// TestGroupCommitIdleGroupTwoOfASubject: the first event of a subject to
// reach an idle group lets the next one go as it joins the queue (its
// turn's Joined), before it collects its batch; the next one takes the
// other slot and collects too. Each collect used to wait for the other
// slot's batch to end, and neither ran one: both waited until their
// attempts' contexts ended (a partition's backlog arriving at once at a
// process that had nothing to do stalled for the consumer's timeout).
func TestGroupCommitIdleGroupTwoOfASubject(t *testing.T) {
	t.Parallel()
	for name, backend := range groupBackends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := backend(t)
			uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store, BatchSize: 8, Batches: 2, Overlap: 1})
			require.NoError(t, err)
			// A deadline far below the test's, far above a batch's.
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			run := func(ctx context.Context, id string) error {
				_, err := uow.DoDelivery(ctx, "c", framework.Key{Source: "s", ID: id}, driver.Delivery{OrderedSubject: "subject"}, func(ctx context.Context) error {
					_, err := framework.Conn(ctx, b.db).ExecContext(ctx, b.db.Rebind(`INSERT INTO effects (id, seen) VALUES (?, 1)`), id)
					return err
				})
				return err
			}
			second := make(chan error, 1)
			var first *pipeline.Turn
			first = pipeline.NewTurn(nil, func() {
				// The sequencer lets the next event go now; here it
				// also waits until that one took the other slot, as
				// it may before the first collects.
				go func() { second <- run(pipeline.With(ctx, pipeline.NewTurn(first, nil)), "second") }()
				for driver.Taken(uow) < 2 && ctx.Err() == nil {
					time.Sleep(time.Millisecond)
				}
			})
			require.NoError(t, run(pipeline.With(ctx, first), "first"))
			require.NoError(t, <-second)
		})
	}
}

// TestGroupCommitFarDeadline: attempts whose deadline is further than
// PostgreSQL's statement_timeout can say (INT_MAX ms, about 24.8 days: a
// consumer's timeout of a month) commit in batches, under the longest
// bound it takes. The batch's SET LOCAL of their deadline failed, and
// every batched attempt with it.
func TestGroupCommitFarDeadline(t *testing.T) {
	t.Parallel()
	b := groupBackends()["PostgreSQL"](t)
	uow := b.unitOfWork(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*24*time.Hour)
	defer cancel()
	const attempts = 16
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		bounds  = map[string]int{}
		started = make(chan struct{})
	)
	for i := range attempts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-started // together, so that they share batches
			_, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: fmt.Sprint(i)}, func(ctx context.Context) error {
				var bound string
				conn := framework.Conn(ctx, b.db)
				if err := sqlx.GetContext(ctx, conn, &bound, `SELECT current_setting('statement_timeout')`); err != nil {
					return err
				}
				mu.Lock()
				bounds[bound]++
				mu.Unlock()
				_, err := conn.ExecContext(ctx, `INSERT INTO effects (id, seen) VALUES ($1, 1)`, fmt.Sprint(i))
				return err
			})
			assert.NoError(t, err, "attempt %d", i)
		}()
	}
	close(started)
	wg.Wait()
	var n int
	require.NoError(t, b.db.GetContext(ctx, &n, `SELECT count(*) FROM effects`))
	require.Equal(t, attempts, n)
	t.Logf("statement_timeout seen by the attempts: %v", bounds)
	require.Contains(t, bounds, "2147483647ms", "some attempts ran in a batch, under the longest bound")
}
