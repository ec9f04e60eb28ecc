package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/bound"
)

// DefaultDeadLetterLimit is how many dead letters DeadLetters returns when
// the filter sets no limit.
const DefaultDeadLetterLimit = 100

// ErrNoTx is returned by the methods that must run in the attempt's
// transaction when they get none.
var ErrNoTx = errors.New("no database transaction (give the unit of work the store's database)")

// Store implements driver.Store (with MarkMany, which group commit
// finds by type assertion), driver.Inspector, driver.Purger,
// driver.Gauges and driver.Leases over a PostgreSQL or SQLite database
// migrated with Migrations. postgres.Store and sqlite.Store embed it:
// its exported methods are theirs, so add one here only when both
// public stores should have it.
type Store struct {
	db      *sqlx.DB
	dialect Dialect
	now     func() time.Time
	q       queries
	// onResolve is Options.OnResolve.
	onResolve func(driver.DeadLetter, driver.Resolution)

	mark, markMany, countMany, forgetDelivery        string
	markCheckpointMany, markMoveMany, advanceMany    string
	uncount                                          string
	publishDeadLetter, deadLetter, resolveDeadLetter string
	claimReplays                                     string

	counts counts // the counts waiting for a statement
	// outer bounds, on PostgreSQL, the statements of calls whose context
	// has no end of its own (see bounded); nil on SQLite.
	outer *bound.Statement
}

var (
	_ driver.Store     = (*Store)(nil)
	_ driver.Inspector = (*Store)(nil)
	_ driver.Purger    = (*Store)(nil)
	_ driver.Gauges    = (*Store)(nil)
	_ driver.Leases    = (*Store)(nil)
)

// Options configure a Store.
type Options struct {
	// Prefix prefixes the name of every table.
	Prefix string
	// Now is the store's clock; nil means time.Now.
	Now func() time.Time
	// OnResolve, when set, is called after each ResolveDeadLetter that
	// committed, with the dead letter as it was and its resolution.
	OnResolve func(driver.DeadLetter, driver.Resolution)
}

// New returns a Store on db, a database of dialect d.
func New(db *sqlx.DB, d Dialect, opts Options) (*Store, error) {
	if db == nil {
		return nil, errors.New("missing database")
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	prefix := opts.Prefix
	if err := ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("TablePrefix: %w", err)
	}
	if got, err := DialectOf(db.DriverName()); err == nil && got != d {
		return nil, fmt.Errorf("the database's driver %q is %s, not %s", db.DriverName(), got, d)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	q := newQueries(d, prefix)
	var outer *bound.Statement
	if d == Postgres {
		outer = bound.New(bound.First, maxOuterBound)
	}
	return &Store{
		db:                 db,
		dialect:            d,
		now:                now,
		q:                  q,
		onResolve:          opts.OnResolve,
		outer:              outer,
		mark:               q.sql(d.pick(qMarkPostgres, qMarkSQLite)),
		markMany:           q.sql(d.pick(qMarkManyPostgres, qMarkManySQLite)),
		markCheckpointMany: q.sql(qMarkCheckpointManyPostgres),
		markMoveMany:       q.sql(qMarkMoveManyPostgres),
		advanceMany:        q.sql(qOrderAdvanceMany),
		countMany:          q.sql(d.pick(qCountManyPostgres, qCountManySQLite)),
		forgetDelivery:     q.sql(qForgetDelivery),
		uncount:            q.sql(qUncount),
		publishDeadLetter:  q.sql(qPublishDeadLetter),
		deadLetter:         q.sql(qDeadLetter),
		resolveDeadLetter:  q.sql(qResolveDeadLetter),
		claimReplays:       q.sql(d.pick(qClaimReplaysLocked, qClaimReplays)),
	}, nil
}

// Mark implements driver.Store.
func (s *Store) Mark(ctx context.Context, tx *driver.Tx, consumer string, key framework.Key) (bool, error) {
	if !tx.HasDB() {
		return false, fmt.Errorf("mark %s for %s: %w", key, consumer, ErrNoTx)
	}
	res, err := tx.ExecContext(ctx, s.mark, consumer, key.Source, key.ID, s.dialect.timeArg(s.now()))
	if err != nil {
		return false, fmt.Errorf("mark %s for %s: %w", key, consumer, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("mark %s for %s: rows affected: %w", key, consumer, err)
	}
	return n == 1, nil
}

// Count implements driver.Store: one statement, committed on its own,
// which counts the other deliveries asked for at the same time too (see
// counts).
func (s *Store) Count(ctx context.Context, consumer string, key framework.Key, first int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("count delivery of %s to %s: %w", key, consumer, err)
	}
	c := &countCall{ctx: ctx, consumer: consumer, key: key, first: first}
	s.counts.count(s, c)
	return c.n, c.err
}

// maxOuterBound is the most that Store.outer grows to.
const maxOuterBound = 30 * time.Second

// bounded runs f, a call's statements outside its caller's transaction,
// on ctx; on PostgreSQL, when ctx has no deadline, on ctx bounded by
// s.outer (see internal/bound). The consumers' chains call the store on
// the message's context outside an attempt (a delivery's count, its dead
// letter, a wait behind a gap), the sweep of parked events and the replay
// relay on the service's, and neither has an end of its own: a statement whose request or answer the network lost (a
// proxy that dropped it, the connection open) would hold the message
// for ever. Cut short, the call fails, and the message is delivered
// again. On SQLite, which no network stands between, a statement waits
// for the file's write lock as long as its connection's busy timeout.
func (s *Store) bounded(ctx context.Context, f func(ctx context.Context) error) error {
	if _, ok := ctx.Deadline(); ok || s.outer == nil {
		return f(ctx)
	}
	return s.outer.Run(ctx, f)
}

// Uncount implements driver.Store.
func (s *Store) Uncount(ctx context.Context, consumer string, key framework.Key) error {
	err := s.bounded(ctx, func(ctx context.Context) error {
		_, err := s.exec(ctx, s.uncount, consumer, key.Source, key.ID, s.dialect.timeArg(s.now()))
		return err
	})
	if err != nil {
		return fmt.Errorf("uncount delivery of %s to %s: %w", key, consumer, err)
	}
	return nil
}

// Forget implements driver.Store.
func (s *Store) Forget(ctx context.Context, tx *driver.Tx, consumer string, key framework.Key) error {
	if !tx.HasDB() {
		return fmt.Errorf("forget delivery count of %s for %s: %w", key, consumer, ErrNoTx)
	}
	if _, err := tx.ExecContext(ctx, s.forgetDelivery, consumer, key.Source, key.ID); err != nil {
		return fmt.Errorf("forget delivery count of %s for %s: %w", key, consumer, err)
	}
	return nil
}

// encodeMetadata returns driver.StorableMetadata(m) as JSON text (no
// NUL, which PostgreSQL's jsonb refuses even escaped); nil is "{}".
func encodeMetadata(m map[string]string) (string, error) {
	if len(m) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(driver.StorableMetadata(m))
	if err != nil {
		return "", fmt.Errorf("encode metadata: %w", err)
	}
	return string(b), nil
}

// decodeMetadata parses JSON metadata; an empty object is nil.
func decodeMetadata(b []byte) (map[string]string, error) {
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("decode metadata: %w", err)
	}
	if len(m) == 0 {
		return nil, nil
	}
	return m, nil
}

// MarkMany records, inside tx and in one statement, that consumer
// processed each of keys, and reports for each whether its mark is new:
// false for a key marked before, and for every repeat of a key within
// keys but its first. Group commit marks a batch's events with it, one
// round trip for the batch instead of one per event. The rows are
// inserted in key order, so that two batches that mark some of the same
// events wait for each other instead of deadlocking.
func (s *Store) MarkMany(ctx context.Context, tx *driver.Tx, consumer string, keys []framework.Key) ([]bool, error) {
	if !tx.HasDB() {
		return nil, fmt.Errorf("mark %d events for %s: %w", len(keys), consumer, ErrNoTx)
	}
	unique := uniqueKeys(keys)
	rows, err := s.markRows(ctx, tx, consumer, unique)
	if err != nil {
		return nil, fmt.Errorf("mark %d events for %s: %w", len(keys), consumer, err)
	}
	defer rows.Close()
	inserted := make(map[framework.Key]bool, len(unique))
	for rows.Next() {
		var k framework.Key
		if err := rows.Scan(&k.Source, &k.ID); err != nil {
			return nil, fmt.Errorf("mark %d events for %s: %w", len(keys), consumer, err)
		}
		inserted[k] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("mark %d events for %s: %w", len(keys), consumer, err)
	}
	return firstMarks(keys, inserted), nil
}

// MarkCheckpointMany is MarkMany of keys, then CheckpointMany of
// subjects, all of consumer, in one round trip on PostgreSQL (two on
// SQLite): a batch of strict-order events marks them and reads and locks
// their subjects' checkpoints with it. The marks are inserted before a
// checkpoint is locked, as MarkMany then CheckpointMany would, so that
// two batches still wait for each other in the same order.
func (s *Store) MarkCheckpointMany(ctx context.Context, tx *driver.Tx, consumer string, keys []framework.Key, subjects []string) ([]bool, map[string]int64, error) {
	if !tx.HasDB() || s.dialect != Postgres {
		first, err := s.MarkMany(ctx, tx, consumer, keys)
		if err != nil {
			return nil, nil, err
		}
		checkpoints, err := s.CheckpointMany(ctx, tx, consumer, subjects)
		if err != nil {
			return nil, nil, err
		}
		return first, checkpoints, nil
	}
	sources, ids := keyColumns(uniqueKeys(keys))
	rows, err := tx.QueryContext(ctx, s.markCheckpointMany, consumer, s.dialect.timeArg(s.now()), sources, ids, consumer, subjects)
	var first []bool
	var checkpoints map[string]int64
	if err == nil {
		first, checkpoints, _, err = markCheckpointRows(rows, keys)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("mark %d events and lock the checkpoints of %d subjects for %s: %w", len(keys), len(subjects), consumer, err)
	}
	return first, checkpoints, nil
}

// keyColumns returns the sources and the ids of keys, as two columns.
func keyColumns(keys []framework.Key) (sources, ids []string) {
	sources, ids = make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		sources[i], ids[i] = k.Source, k.ID
	}
	return sources, ids
}

// markCheckpointRows reads, and closes, rows of qMarkCheckpointManyPostgres
// or qMarkMoveManyPostgres for keys: the keys inserted
// (0, source, event_id, 0), the checkpoints (1, subject, ”, seq) and the
// moves' report (2, ”, ”, 1 when made). It returns, for each of keys,
// whether its mark is new (see firstMarks), the checkpoints by subject,
// and the report.
func markCheckpointRows(rows *sql.Rows, keys []framework.Key) ([]bool, map[string]int64, bool, error) {
	defer rows.Close()
	var (
		inserted    = make(map[framework.Key]bool, len(keys))
		checkpoints = map[string]int64{}
		moved       bool
	)
	for rows.Next() {
		var (
			kind int
			a, b string
			seq  int64
		)
		if err := rows.Scan(&kind, &a, &b, &seq); err != nil {
			return nil, nil, false, err
		}
		switch kind {
		case 0:
			inserted[framework.Key{Source: a, ID: b}] = true
		case 1:
			checkpoints[a] = seq
		default:
			moved = seq == 1
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, false, err
	}
	return firstMarks(keys, inserted), checkpoints, moved, nil
}

// uniqueKeys returns keys without repeats, in key order: the order in
// which a batch inserts its marks (see MarkMany).
func uniqueKeys(keys []framework.Key) []framework.Key {
	unique := make([]framework.Key, 0, len(keys))
	seen := make(map[framework.Key]bool, len(keys))
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			unique = append(unique, k)
		}
	}
	slices.SortFunc(unique, func(a, b framework.Key) int {
		return cmp.Or(strings.Compare(a.Source, b.Source), strings.Compare(a.ID, b.ID))
	})
	return unique
}

// firstMarks reports for each of keys whether its mark is new: inserted
// holds the keys whose marks were; a repeat of a key within keys is a
// duplicate. It empties inserted.
func firstMarks(keys []framework.Key, inserted map[framework.Key]bool) []bool {
	first := make([]bool, len(keys))
	for i, k := range keys {
		first[i] = inserted[k]
		delete(inserted, k) // a repeat of k within keys is a duplicate
	}
	return first
}

// markRows inserts the marks of keys, in their order, and returns the
// keys it inserted (source, event_id), those not marked before. The
// statement is the same whatever the number of keys, so that each
// connection prepares it once: a statement per batch size kept up to 32
// of them prepared on each connection (SQLite's statement cache, pgx's).
// PostgreSQL reads the keys from two text arrays; SQLite from a JSON
// array of [source, id] pairs, which holds only valid UTF-8 without NUL:
// keys of other text, which no decoded event has, are inserted with a
// statement of their own size.
func (s *Store) markRows(ctx context.Context, tx *driver.Tx, consumer string, keys []framework.Key) (*sql.Rows, error) {
	at := s.dialect.timeArg(s.now())
	if s.dialect == Postgres {
		sources, ids := keyColumns(keys)
		return tx.QueryContext(ctx, s.markMany, consumer, at, sources, ids)
	}
	if list, ok := jsonKeys(keys); ok {
		return tx.QueryContext(ctx, s.markMany, consumer, at, list)
	}
	args := make([]any, 0, 4*len(keys))
	for _, k := range keys {
		args = append(args, consumer, k.Source, k.ID, at)
	}
	q := "WITH k (consumer, source, event_id, at) AS (VALUES " + valueRows(len(keys), 4) + ")\n" + qMarkInto + "k\n" + qMarkReturning
	return tx.QueryContext(ctx, s.q.sql(q), args...)
}

// valueRows returns the placeholders of n rows of width values each:
// "(?, ?), (?, ?)" for 2 and 2.
func valueRows(n, width int) string {
	row := "(" + strings.Repeat("?, ", width-1) + "?)"
	return strings.Repeat(row+", ", n-1) + row
}

// jsonKeys returns keys as a JSON array of [source, id] pairs, or false
// when one of them is not storable text (see storableText), which JSON
// would not give back as it is.
func jsonKeys(keys []framework.Key) (string, bool) {
	pairs := make([][2]string, len(keys))
	for i, k := range keys {
		if !storableText(k.Source, k.ID) {
			return "", false
		}
		pairs[i] = [2]string{k.Source, k.ID}
	}
	b, err := json.Marshal(pairs)
	if err != nil {
		return "", false // strings always marshal
	}
	return string(b), true
}

// storableText reports whether every one of ss is text that a row can
// hold: valid UTF-8 without NUL. A store writes no other (see
// driver.StorableMetadata, framework.Key.Validate), so a filter of any
// other text matches nothing, and PostgreSQL refuses it in a query.
func storableText(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
			return false
		}
	}
	return true
}
