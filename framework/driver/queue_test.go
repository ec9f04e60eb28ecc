package driver_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// TestWrites shows which statements may wait in a batch's queue on
// PostgreSQL: a single INSERT, UPDATE, DELETE or MERGE, whatever blanks
// and comments come first, and nothing else.
func TestWrites(t *testing.T) {
	t.Parallel()
	for query, want := range map[string]bool{
		`INSERT INTO t VALUES ($1)`:                          true,
		"  \n\tupdate t SET a = $1":                          true,
		`-- a comment` + "\n" + `DELETE FROM t WHERE a = $1`: true,
		`/* a /* nested */ comment */ MERGE INTO t USING s ON true WHEN MATCHED THEN DO NOTHING`: true,
		`INSERT INTO t VALUES ($1);`:                          true,
		`SELECT pg_advisory_xact_lock($1)`:                    false,
		`WITH x AS (SELECT $1) INSERT INTO t SELECT * FROM x`: false,
		`INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)`:  false,
		`INSERT INTO t VALUES (1); SELECT pg_sleep(1)`:        false,
		`/* unterminated INSERT`:                              false,
		`-- only a comment, INSERT`:                           false,
		`INSERTED`:                                            false,
		``:                                                    false,
	} {
		require.Equal(t, want, driver.Writes(query, true), "%q", query)
	}
	require.False(t, driver.Writes(`UPDATE t SET a = 'x\'; SELECT 1; --' WHERE b = $1`, true),
		"read with backslash escapes too, it is two statements")
}

// TestGroupCommitQueuedWriteFails shows what a handler sees of a write
// that waits in its batch's queue on PostgreSQL and fails there: the
// batch rolls back and every attempt runs again alone, uncharged, where
// each statement runs as it is made, so the handler that wrote it sees
// its error as it would alone and decides with it. On SQLite, where
// nothing waits, it sees the error at once.
func TestGroupCommitQueuedWriteFails(t *testing.T) {
	t.Parallel()
	for name, open := range groupBackends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := open(t)
			_, err := b.db.Exec(`INSERT INTO effects (id, seen) VALUES ('taken', 1)`)
			require.NoError(t, err)
			uow := b.unitOfWork(t)
			var (
				mu    sync.Mutex
				seen  = map[string][]error{}
				hooks = map[string][]string{}
			)
			outcomes, errs := gather(t, uow, []string{"a", "dup", "b"}, func(ctx context.Context, id string) error {
				tx, _ := driver.TxFromContext(ctx)
				tx.OnCommit(func() { mu.Lock(); hooks[id] = append(hooks[id], "commit"); mu.Unlock() })
				tx.OnRollback(func() { mu.Lock(); hooks[id] = append(hooks[id], "rollback"); mu.Unlock() })
				effect := id
				if id == "dup" {
					effect = "taken"
				}
				err := b.insert(ctx, effect)
				mu.Lock()
				seen[id] = append(seen[id], err)
				mu.Unlock()
				if err != nil {
					return framework.Permanent("already_taken", err)
				}
				return nil
			})
			require.Equal(t, []framework.Outcome{framework.Processed, framework.Failed, framework.Processed}, outcomes, "%v", errs)
			require.NoError(t, errs[0])
			require.NoError(t, errs[2])
			require.Equal(t, framework.Code("already_taken"), framework.CodeOf(errs[1]), "the handler saw its own statement's error and gave it its code")
			if name == "PostgreSQL" {
				require.Len(t, seen["dup"], 2, "in the batch, then alone")
				require.NoError(t, seen["dup"][0], "in the batch, the insert waited in the queue")
				var pgErr *pgconn.PgError
				require.ErrorAs(t, seen["dup"][1], &pgErr, "alone, it ran as it was made")
				require.Equal(t, "23505", pgErr.Code)
				require.Equal(t, []string{"rollback", "commit"}, hooks["a"], "a ran again alone, uncharged")
				require.Equal(t, []string{"rollback", "commit"}, hooks["b"])
			} else {
				require.Len(t, seen["dup"], 1)
				require.Error(t, seen["dup"][0])
			}
			var got []string
			require.NoError(t, b.db.SelectContext(t.Context(), &got, `SELECT id FROM effects ORDER BY id`))
			require.Equal(t, []string{"a", "b", "taken"}, got)
		})
	}
}

// TestGroupCommitQueuedReads shows that a batch's queued writes run
// before the statements that read: an attempt reads its own writes and
// its batch-mates', and a queued statement's RowsAffected is its own,
// all in the batch's one transaction.
func TestGroupCommitQueuedReads(t *testing.T) {
	t.Parallel()
	for name, open := range groupBackends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := open(t)
			uow := b.unitOfWork(t)
			var (
				mu    sync.Mutex
				txids = map[string]string{}
			)
			ids := []string{"a", "b", "c"}
			outcomes, errs := gather(t, uow, ids, func(ctx context.Context, id string) error {
				if err := b.insert(ctx, id); err != nil {
					return err
				}
				conn := framework.Conn(ctx, b.db)
				res, err := conn.ExecContext(ctx, b.db.Rebind(`UPDATE effects SET seen = seen + 1 WHERE id <= ?`), id)
				if err != nil {
					return err
				}
				n, err := res.RowsAffected()
				if err != nil {
					return err
				}
				want := map[string]int64{"a": 1, "b": 2, "c": 3}[id]
				if n != want {
					return fmt.Errorf("rows affected: %d, want %d", n, want)
				}
				var seen int
				if err := sqlx.GetContext(ctx, conn, &seen, b.db.Rebind(`SELECT seen FROM effects WHERE id = ?`), id); err != nil {
					return err
				}
				if seen != 2 {
					return errors.New("did not read its own update")
				}
				tx, _ := driver.TxFromContext(ctx)
				txid, err := b.txid(ctx, tx)
				mu.Lock()
				txids[id] = txid
				mu.Unlock()
				return err
			})
			requireProcessed(t, outcomes, errs)
			if name == "PostgreSQL" {
				require.Equal(t, txids["a"], txids["b"], "one batch")
				require.Equal(t, txids["a"], txids["c"])
			}
			var total int
			require.NoError(t, b.db.Get(&total, `SELECT sum(seen) FROM effects`))
			require.Equal(t, 4+3+2, total, "a updated a, b updated a and b, c all three")
		})
	}
}

// TestGroupCommitQueuedArgs shows that a write that waits in its batch's
// queue runs with its arguments as they were when the handler made it:
// a buffer the handler reuses after ExecContext returned changes nothing.
func TestGroupCommitQueuedArgs(t *testing.T) {
	t.Parallel()
	for name, open := range groupBackends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := open(t)
			blob := "BLOB"
			if name == "PostgreSQL" {
				blob = "bytea"
			}
			_, err := b.db.Exec(`CREATE TABLE bodies (id TEXT PRIMARY KEY, body ` + blob + ` NOT NULL)`)
			require.NoError(t, err)
			uow := b.unitOfWork(t)
			ids := []string{"a", "b", "c"}
			outcomes, errs := gather(t, uow, ids, func(ctx context.Context, id string) error {
				buf := []byte("body of " + id)
				_, err := framework.Conn(ctx, b.db).ExecContext(ctx, b.db.Rebind(`INSERT INTO bodies (id, body) VALUES (?, ?)`), id, buf)
				copy(buf, "overwritten")
				return err
			})
			requireProcessed(t, outcomes, errs)
			var got []struct {
				ID   string `db:"id"`
				Body []byte `db:"body"`
			}
			require.NoError(t, b.db.Select(&got, `SELECT id, body FROM bodies ORDER BY id`))
			require.Len(t, got, 3)
			for _, r := range got {
				require.Equal(t, "body of "+r.ID, string(r.Body))
			}
		})
	}
}

// TestGroupCommitQueuedWriteTimeout shows that a write that waits in its
// batch's queue and runs past its attempt's deadline ends that attempt
// by the statement_timeout the batch sets for it, as a write run at once
// does (TestGroupCommitTimeout), while its batch-mates run again alone
// and commit: the attempt fails with its statement's error, not with a
// begin of its own that its ended context would refuse.
func TestGroupCommitQueuedWriteTimeout(t *testing.T) {
	t.Parallel()
	b := groupBackends()["PostgreSQL"](t)
	uow := b.unitOfWork(t)
	outcomes, errs := gather(t, uow, []string{"a", "late", "b"}, func(ctx context.Context, id string) error {
		query := `INSERT INTO effects (id, seen) VALUES ($1, 1)`
		if id == "late" {
			query = `INSERT INTO effects (id, seen) SELECT $1, 1 FROM pg_sleep(10)`
		}
		_, err := framework.Conn(ctx, b.db).ExecContext(ctx, query, id)
		return err
	})
	require.Equal(t, []framework.Outcome{framework.Processed, framework.Failed, framework.Processed}, outcomes, "%v", errs)
	require.NoError(t, errs[0])
	require.NoError(t, errs[2])
	require.ErrorContains(t, errs[1], "statement timeout", "the attempt's own statement_timeout ended it")
	var got []string
	require.NoError(t, b.db.SelectContext(t.Context(), &got, `SELECT id FROM effects ORDER BY id`))
	require.Equal(t, []string{"a", "b"}, got)
}
