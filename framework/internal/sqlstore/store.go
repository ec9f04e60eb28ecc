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

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
)

// DefaultDeadLetterLimit is how many dead letters DeadLetters returns when
// the filter sets no limit.
const DefaultDeadLetterLimit = 100

// ErrNoTx is returned by the methods that must run in the attempt's
// transaction when they get none.
var ErrNoTx = errors.New("no database transaction (give the unit of work the store's database)")

// Store implements framework.Store, framework.Store and
// framework.Store over a PostgreSQL or SQLite database migrated
// with Migrations.
type Store struct {
	db      *sqlx.DB
	dialect Dialect
	now     func() time.Time
	q       queries

	mark, forgetDelivery                             string
	publishDeadLetter, deadLetter, resolveDeadLetter string

	counts counts // the counts waiting for a statement
}

var _ framework.Store = (*Store)(nil)

// New returns a Store on db, whose tables carry prefix. now is the store's
// clock; nil means time.Now.
func New(db *sqlx.DB, d Dialect, prefix string, now func() time.Time) (*Store, error) {
	if db == nil {
		return nil, errors.New("missing database")
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	if err := ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("TablePrefix: %w", err)
	}
	if got, err := DialectOf(db.DriverName()); err == nil && got != d {
		return nil, fmt.Errorf("the database's driver %q is %s, not %s", db.DriverName(), got, d)
	}
	if now == nil {
		now = time.Now
	}
	q := newQueries(d, prefix)
	return &Store{
		db:                db,
		dialect:           d,
		now:               now,
		q:                 q,
		mark:              q.sql(qMark),
		forgetDelivery:    q.sql(qForgetDelivery),
		publishDeadLetter: q.sql(qPublishDeadLetter),
		deadLetter:        q.sql(qDeadLetter),
		resolveDeadLetter: q.sql(qResolveDeadLetter),
	}, nil
}

// Mark implements framework.Store.
func (s *Store) Mark(ctx context.Context, tx *framework.Tx, consumer string, key framework.Key) (bool, error) {
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

// Count implements framework.Store: one statement, committed on its own,
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

// Forget implements framework.Store.
func (s *Store) Forget(ctx context.Context, tx *framework.Tx, consumer string, key framework.Key) error {
	if !tx.HasDB() {
		return fmt.Errorf("forget delivery count of %s for %s: %w", key, consumer, ErrNoTx)
	}
	if _, err := tx.ExecContext(ctx, s.forgetDelivery, consumer, key.Source, key.ID); err != nil {
		return fmt.Errorf("forget delivery count of %s for %s: %w", key, consumer, err)
	}
	return nil
}

// PublishDeadLetter implements framework.Store. The store
// stamps the failure time with its clock; dl's ID, Repeats,
// FirstFailedAt, LastFailedAt, Status and Resolution are ignored. A repeat
// of (Consumer, Source, EventID) updates the row: the latest Topic, Type,
// Version, Subject, CorrelationID, Code, Attempts, Body and Metadata,
// LastFailedAt, one more Repeat, and status pending again, with an earlier
// resolution cleared; FirstFailedAt stays. The metadata is kept as
// framework.StorableMetadata; a dead letter that fails dl.Validate is
// refused, on either dialect. In the same transaction it
// forgets the message's delivery count for the consumer, so that a replay
// is counted afresh instead of hitting the delivery limit at once.
func (s *Store) PublishDeadLetter(ctx context.Context, dl framework.DeadLetter) error {
	if err := dl.Validate(); err != nil {
		return err
	}
	meta, err := encodeMetadata(dl.Metadata)
	if err != nil {
		return fmt.Errorf("publish dead letter %s for %s: %w", dl.Key(), dl.Consumer, err)
	}
	body := dl.Body
	if body == nil {
		body = []byte{}
	}
	at := s.dialect.timeArg(s.now())
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("publish dead letter %s for %s: begin: %w", dl.Key(), dl.Consumer, err)
	}
	defer tx.Rollback() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, s.publishDeadLetter,
		dl.Consumer, dl.Topic, dl.Source, dl.EventID, dl.Type, dl.Version, dl.Subject, dl.CorrelationID,
		string(dl.Code), dl.Attempts, at, at, body, meta); err != nil {
		return fmt.Errorf("publish dead letter %s for %s: %w", dl.Key(), dl.Consumer, err)
	}
	if _, err := tx.ExecContext(ctx, s.forgetDelivery, dl.Consumer, dl.Source, dl.EventID); err != nil {
		return fmt.Errorf("publish dead letter %s for %s: forget delivery count: %w", dl.Key(), dl.Consumer, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("publish dead letter %s for %s: commit: %w", dl.Key(), dl.Consumer, err)
	}
	return nil
}

// DeadLetter implements framework.Store.
func (s *Store) DeadLetter(ctx context.Context, id int64) (framework.DeadLetter, error) {
	rows, err := s.db.QueryxContext(ctx, s.deadLetter, id)
	if err != nil {
		return framework.DeadLetter{}, fmt.Errorf("get dead letter %d: %w", id, err)
	}
	dls, err := scanDeadLetters(rows)
	if err != nil {
		return framework.DeadLetter{}, fmt.Errorf("get dead letter %d: %w", id, err)
	}
	if len(dls) == 0 {
		return framework.DeadLetter{}, fmt.Errorf("get dead letter %d: %w", id, framework.ErrNotFound)
	}
	return dls[0], nil
}

// DeadLetters implements framework.Store.
func (s *Store) DeadLetters(ctx context.Context, f framework.DeadLetterFilter) ([]framework.DeadLetter, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("list dead letters: negative limit %d", f.Limit)
	}
	if f.Limit == 0 {
		f.Limit = DefaultDeadLetterLimit
	}
	query := qDeadLetters
	args := []any{f.AfterID}
	if f.Consumer != "" {
		query += qDeadLettersConsumer
		args = append(args, f.Consumer)
	}
	if f.Code != "" {
		query += qDeadLettersCode
		args = append(args, string(f.Code))
	}
	if f.Status != "" {
		query += qDeadLettersStatus
		args = append(args, string(f.Status))
	}
	query += qDeadLettersOrder
	args = append(args, f.Limit)
	rows, err := s.db.QueryxContext(ctx, s.q.sql(query), args...)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	dls, err := scanDeadLetters(rows)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return dls, nil
}

// ResolveDeadLetter implements framework.Store. A zero r.At
// means now, by the store's clock.
func (s *Store) ResolveDeadLetter(ctx context.Context, id int64, r framework.Resolution) error {
	if r.Status != framework.DeadLetterReplayed && r.Status != framework.DeadLetterDiscarded {
		return fmt.Errorf("resolve dead letter %d: status %q, want %q or %q",
			id, r.Status, framework.DeadLetterReplayed, framework.DeadLetterDiscarded)
	}
	at := r.At
	if at.IsZero() {
		at = s.now()
	}
	res, err := s.db.ExecContext(ctx, s.resolveDeadLetter,
		string(r.Status), r.By, s.dialect.timeArg(at), r.Reason, id)
	if err != nil {
		return fmt.Errorf("resolve dead letter %d: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("resolve dead letter %d: rows affected: %w", id, err)
	}
	if n == 0 {
		return fmt.Errorf("resolve dead letter %d: no pending dead letter: %w", id, framework.ErrNotFound)
	}
	return nil
}

func scanDeadLetters(rows *sqlx.Rows) (_ []framework.DeadLetter, err error) {
	defer func() {
		if cerr := rows.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	var out []framework.DeadLetter
	for rows.Next() {
		var (
			dl                      framework.DeadLetter
			code, status            string
			first, last, resolvedAt timeValue
			meta                    []byte
			resolvedBy, resolveWhy  sql.NullString
		)
		if err := rows.Scan(&dl.ID, &dl.Consumer, &dl.Topic, &dl.Source, &dl.EventID, &dl.Type,
			&dl.Version, &dl.Subject, &dl.CorrelationID, &code, &dl.Attempts, &dl.Repeats,
			&first, &last, &dl.Body, &meta, &status, &resolvedBy, &resolvedAt, &resolveWhy); err != nil {
			return nil, fmt.Errorf("scan dead letter: %w", err)
		}
		dl.Code = framework.Code(code)
		dl.Status = framework.DeadLetterStatus(status)
		dl.FirstFailedAt, dl.LastFailedAt = first.t, last.t
		if dl.Metadata, err = decodeMetadata(meta); err != nil {
			return nil, fmt.Errorf("dead letter %d: %w", dl.ID, err)
		}
		if dl.Status != framework.DeadLetterPending {
			dl.Resolution = framework.Resolution{
				Status: dl.Status,
				By:     resolvedBy.String,
				Reason: resolveWhy.String,
				At:     resolvedAt.t,
			}
		}
		out = append(out, dl)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// encodeMetadata returns framework.StorableMetadata(m) as JSON text (no
// NUL, which PostgreSQL's jsonb refuses even escaped); nil is "{}".
func encodeMetadata(m map[string]string) (string, error) {
	if len(m) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(framework.StorableMetadata(m))
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
func (s *Store) MarkMany(ctx context.Context, tx *framework.Tx, consumer string, keys []framework.Key) ([]bool, error) {
	if !tx.HasDB() {
		return nil, fmt.Errorf("mark %d events for %s: %w", len(keys), consumer, ErrNoTx)
	}
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
	var q strings.Builder
	q.WriteString(`INSERT INTO {p}processed_events (consumer, source, event_id, processed_at) VALUES `)
	args := make([]any, 0, 4*len(unique))
	at := s.dialect.timeArg(s.now())
	for i, k := range unique {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(?, ?, ?, ?)")
		args = append(args, consumer, k.Source, k.ID, at)
	}
	q.WriteString(` ON CONFLICT (consumer, source, event_id) DO NOTHING RETURNING source, event_id`)
	rows, err := tx.QueryContext(ctx, s.q.sql(q.String()), args...)
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
	first := make([]bool, len(keys))
	for i, k := range keys {
		first[i] = inserted[k]
		delete(inserted, k) // a repeat of k within keys is a duplicate
	}
	return first, nil
}
