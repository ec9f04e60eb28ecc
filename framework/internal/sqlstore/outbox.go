package sqlstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
)

// OutboxRow is one event recorded in the outbox and not yet sent.
type OutboxRow struct {
	// ID orders the rows: the order of their insertion.
	ID int64
	// Key is the event's source and id.
	Key framework.Key
	// Type is the event type, the topic it is published to.
	Type string
	// Subject and SubjectSeq are the event's ordering key, if any.
	Subject    string
	SubjectSeq int64
	// Body is the encoded CloudEvent.
	Body []byte
	// CreatedAt is when the row was added.
	CreatedAt time.Time
}

// Outbox is the outbox table's SQL for one dialect and table prefix.
type Outbox struct {
	dialect Dialect
	q       queries

	insert, unsent, claim, lease, leasable, release, markSent, cleanup string
}

// NewOutbox returns the outbox SQL of d on tables prefixed with prefix.
func NewOutbox(d Dialect, prefix string) (*Outbox, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	if err := ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	q := newQueries(d, prefix)
	return &Outbox{
		dialect:  d,
		q:        q,
		insert:   q.sql(qOutboxInsert),
		unsent:   q.sql(qOutboxUnsent),
		claim:    q.sql(qOutboxClaim),
		lease:    q.sql(qOutboxLease),
		leasable: q.sql(qOutboxLeasable),
		release:  q.sql(d.withIDList(qOutboxRelease)),
		markSent: q.sql(d.withIDList(qOutboxMarkSent)),
		cleanup:  q.sql(qOutboxCleanup),
	}, nil
}

// Dialect returns the outbox's dialect.
func (o *Outbox) Dialect() Dialect { return o.dialect }

// Insert records env, encoded as body, in tx at time at. It is a no-op
// when the outbox already holds a row of env's source and id.
func (o *Outbox) Insert(ctx context.Context, tx sqlx.ExecerContext, env framework.Envelope, body []byte, at time.Time) error {
	if tx == nil {
		return errors.New("insert into outbox: nil transaction")
	}
	if _, err := tx.ExecContext(ctx, o.insert,
		env.ID, env.Source, env.Type, env.Subject, env.SubjectSeq, body, o.dialect.timeArg(at)); err != nil {
		return fmt.Errorf("insert %s into outbox: %w", env.Key(), err)
	}
	return nil
}

// Unsent returns up to limit unsent rows in id order.
func (o *Outbox) Unsent(ctx context.Context, q sqlx.QueryerContext, limit int) ([]OutboxRow, error) {
	rows, err := q.QueryxContext(ctx, o.unsent, limit)
	if err != nil {
		return nil, fmt.Errorf("read unsent outbox rows: %w", err)
	}
	out, err := scanOutboxRows(rows)
	if err != nil {
		return nil, fmt.Errorf("read unsent outbox rows: %w", err)
	}
	return out, nil
}

// Claim is the claim of relays on PostgreSQL, in tx: it locks up to limit
// of the oldest unsent rows, skipping rows that another transaction has
// locked (FOR UPDATE SKIP LOCKED), and returns in id order those whose
// bodies fit in maxBytes together: the first one whatever its size, and
// each next one while the bodies before it and its own come to at most
// maxBytes. held reports rows it locked beyond those: they stay locked,
// unread, until tx ends, so that a claim made before then skips them.
// It leaves out the rows of skip's types (see Skip).
// For the rest of tx, the planner may read tables through their indexes
// only (qIndexScansOnly): a claim reads no more rows than it locks; and
// the server ends tx's session once tx waits idle between two statements
// longer than idle (0: the server's setting), so that a relay frozen or
// cut off from the server while it publishes holds the rows, and the
// server's transaction horizon, no longer than that.
func (o *Outbox) Claim(ctx context.Context, tx sqlx.QueryerContext, limit, maxBytes int, skip Skip, idle time.Duration) (rows []OutboxRow, held bool, err error) {
	if o.dialect != Postgres {
		return nil, false, fmt.Errorf("claim unsent outbox rows: locking rows needs %s, not %s", Postgres, o.dialect)
	}
	if err := indexScansOnly(ctx, tx, idle); err != nil {
		return nil, false, fmt.Errorf("claim unsent outbox rows: %w", err)
	}
	query, args, err := o.skipping(o.claim, qOutboxClaim, skip, maxBytes, limit)
	if err != nil {
		return nil, false, fmt.Errorf("claim unsent outbox rows: %w", err)
	}
	res, err := tx.QueryxContext(ctx, query, args...)
	if err != nil {
		return nil, false, fmt.Errorf("claim unsent outbox rows: %w", err)
	}
	defer res.Close()
	for res.Next() {
		var (
			r       OutboxRow
			created timeValue
			fits    bool
		)
		if err := res.Scan(&r.ID, &r.Key.ID, &r.Key.Source, &r.Type, &r.Subject, &r.SubjectSeq, &r.Body, &created, &fits); err != nil {
			return nil, false, fmt.Errorf("claim unsent outbox rows: scan: %w", err)
		}
		if !fits {
			held = true
			continue
		}
		r.CreatedAt = created.t
		rows = append(rows, r)
	}
	if err := res.Err(); err != nil {
		return nil, false, fmt.Errorf("claim unsent outbox rows: %w", err)
	}
	return rows, held, nil
}

// Lease is the claim of relays on SQLite (one short write; see
// qOutboxLease): it takes a lease until until on up to limit of the oldest
// unsent rows whose lease ended before now, as many of them as fit in
// maxBytes (as Claim counts them), and returns them in id order, leaving
// out the rows of skip's types (see Skip). more
// reports whether rows may wait after them: limit rows were leased, or an
// unleased row follows the last one (which the budget left out, or one
// added since), looked for only after a lease of fewer rows; a failure to
// look reports more.
func (o *Outbox) Lease(ctx context.Context, q sqlx.QueryerContext, limit, maxBytes int, now, until time.Time, skip Skip) (rows []OutboxRow, more bool, err error) {
	query, args, err := o.skipping(o.lease, qOutboxLease, skip, o.dialect.timeArg(until), o.dialect.timeArg(now), limit, maxBytes)
	if err != nil {
		return nil, false, fmt.Errorf("lease unsent outbox rows: %w", err)
	}
	res, err := q.QueryxContext(ctx, query, args...)
	if err != nil {
		return nil, false, fmt.Errorf("lease unsent outbox rows: %w", err)
	}
	rows, err = scanOutboxRows(res)
	if err != nil {
		return nil, false, fmt.Errorf("lease unsent outbox rows: %w", err)
	}
	slices.SortFunc(rows, func(a, b OutboxRow) int { return cmp.Compare(a.ID, b.ID) })
	if len(rows) == 0 || len(rows) == limit {
		return rows, len(rows) == limit, nil
	}
	if err := q.QueryRowxContext(ctx, o.leasable, rows[len(rows)-1].ID, o.dialect.timeArg(now)).Scan(&more); err != nil {
		return rows, true, nil // the leased rows are published; the next lease looks again
	}
	return rows, more, nil
}

// Release gives up the lease of the rows of ids that are still unsent, so
// that the next batch takes them at once.
func (o *Outbox) Release(ctx context.Context, ex sqlx.ExecerContext, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := ex.ExecContext(ctx, o.release, o.dialect.idList(ids)); err != nil {
		return fmt.Errorf("release %d outbox rows: %w", len(ids), err)
	}
	return nil
}

// scanOutboxRows reads and closes rows of outboxColumns.
func scanOutboxRows(rows *sqlx.Rows) ([]OutboxRow, error) {
	defer rows.Close()
	var out []OutboxRow
	for rows.Next() {
		var (
			r       OutboxRow
			created timeValue
		)
		if err := rows.Scan(&r.ID, &r.Key.ID, &r.Key.Source, &r.Type, &r.Subject, &r.SubjectSeq, &r.Body, &created); err != nil {
			return nil, fmt.Errorf("scan: %w", err)
		}
		r.CreatedAt = created.t
		out = append(out, r)
	}
	return out, rows.Err()
}

// MarkSent stamps the rows of ids as sent at at. Rows already sent keep
// their time.
func (o *Outbox) MarkSent(ctx context.Context, ex sqlx.ExecerContext, ids []int64, at time.Time) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := ex.ExecContext(ctx, o.markSent, o.dialect.timeArg(at), o.dialect.idList(ids)); err != nil {
		return fmt.Errorf("mark %d outbox rows sent: %w", len(ids), err)
	}
	return nil
}

// Cleanup deletes up to limit of the oldest rows sent before before, and
// returns how many it deleted.
func (o *Outbox) Cleanup(ctx context.Context, ex sqlx.ExecerContext, before time.Time, limit int) (int64, error) {
	res, err := ex.ExecContext(ctx, o.cleanup, o.dialect.timeArg(before), limit)
	if err != nil {
		return 0, fmt.Errorf("delete sent outbox rows: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("delete sent outbox rows: rows affected: %w", err)
	}
	return n, nil
}
