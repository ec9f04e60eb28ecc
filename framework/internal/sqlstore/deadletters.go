package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// The dead letters' SQL.
const (
	// A repeat of a dead letter updates its row: the latest failure's
	// code, attempts, delivery count, time and message, one more repeat,
	// and pending again so that an operator sees it. The last resolution's
	// columns stay as they were (the history keeps every resolution); the
	// store reads them only while the dead letter is resolved.
	qPublishDeadLetter = `INSERT INTO {p}dead_letters (
    consumer, topic, source, event_id, type, version, subject, correlation_id,
    code, subject_seq, attempts, deliveries, repeats, first_failed_at, last_failed_at, body, metadata, status)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, 'pending')
ON CONFLICT (consumer, source, event_id) DO UPDATE SET
    topic = excluded.topic,
    type = excluded.type,
    version = excluded.version,
    subject = excluded.subject,
    correlation_id = excluded.correlation_id,
    code = excluded.code,
    subject_seq = excluded.subject_seq,
    attempts = excluded.attempts,
    deliveries = excluded.deliveries,
    repeats = {p}dead_letters.repeats + 1,
    last_failed_at = excluded.last_failed_at,
    body = excluded.body,
    metadata = excluded.metadata,
    status = 'pending'
WHERE {p}dead_letters.body = excluded.body
RETURNING id`

	deadLetterColumns = deadLetterHead + `body` + deadLetterTail
	// deadLetterHead and deadLetterTail are the columns before and after
	// the body, which a filter's WithoutBody replaces with an empty one.
	deadLetterHead = `id, consumer, topic, source, event_id, type, version, subject, correlation_id,
    code, subject_seq, attempts, deliveries, repeats, first_failed_at, last_failed_at, `
	deadLetterTail = `, metadata, status,
    resolved_by, resolved_at, resolve_reason`

	qDeadLetter = `SELECT ` + deadLetterColumns + ` FROM {p}dead_letters WHERE id = ?`

	// qDeadLetters takes the filter's conditions (those set) and ends with
	// qDeadLettersOrder; qDeadLettersWithoutBody reads an empty body (the
	// dialect's, %s) in place of each.
	qDeadLetters            = `SELECT ` + deadLetterColumns + ` FROM {p}dead_letters WHERE id > ?`
	qDeadLettersWithoutBody = `SELECT ` + deadLetterHead + `%s` + deadLetterTail + ` FROM {p}dead_letters WHERE id > ?`
	qDeadLettersOrder       = ` ORDER BY id LIMIT ?`

	qDeadLetterStatus = `SELECT status FROM {p}dead_letters WHERE id = ?`

	// qResolveDeadLetter resolves a dead letter only while it is pending:
	// of two transactions that resolve it at once, the second waits for
	// the first (PostgreSQL's row lock; SQLite's write lock since BEGIN
	// IMMEDIATE) and then finds it resolved.
	qResolveDeadLetter = `UPDATE {p}dead_letters
SET status = ?, resolved_by = ?, resolved_at = ?, resolve_reason = ?
WHERE id = ? AND status = 'pending'
RETURNING ` + deadLetterColumns

	qAddHistory = `INSERT INTO {p}dead_letter_history (
    dead_letter_id, at, kind, code, attempts, deliveries, actor, reason)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)`

	// The history in the order it was written: a resolution's time is the
	// operator's to give, so it does not order the entries.
	qDeadLetterHistory = `SELECT at, kind, code, attempts, deliveries, actor, reason
FROM {p}dead_letter_history WHERE dead_letter_id = ? ORDER BY id`
)

// deadLetterFilter returns the conditions of f that are set, to append to
// qDeadLetters, and their arguments.
func (s *Store) deadLetterFilter(f driver.DeadLetterFilter) (string, []any) {
	var (
		cond string
		args []any
	)
	for _, c := range []struct {
		set  bool
		sql  string
		args any
	}{
		{f.Consumer != "", ` AND consumer = ?`, f.Consumer},
		{f.Code != "", ` AND code = ?`, string(f.Code)},
		{f.Status != "", ` AND status = ?`, string(f.Status)},
		{f.Type != "", ` AND type = ?`, f.Type},
		{f.Subject != "", ` AND subject = ?`, f.Subject},
		{f.Source != "", ` AND source = ?`, f.Source},
		{f.EventID != "", ` AND event_id = ?`, f.EventID},
		{!f.FailedSince.IsZero(), ` AND first_failed_at >= ?`, s.dialect.timeArg(f.FailedSince)},
		{!f.FailedBefore.IsZero(), ` AND first_failed_at < ?`, s.dialect.timeArg(f.FailedBefore)},
	} {
		if c.set {
			cond += c.sql
			args = append(args, c.args)
		}
	}
	return cond, args
}

// PublishDeadLetter implements driver.Store. The store stamps the
// failure time with its clock; dl's ID, Repeats, FirstFailedAt,
// LastFailedAt, Status and Resolution are ignored. A repeat of (Consumer,
// Source, EventID) updates the row: the latest Topic, Type, Version,
// Subject, CorrelationID, Code, SubjectSeq, Attempts, Deliveries, Body and
// Metadata, LastFailedAt, one more Repeat, and status pending again;
// FirstFailedAt stays. Every failure, first or repeat, appends a failed
// entry to the dead letter's history (code, attempts, deliveries). While
// pending, DeadLetter reports no Resolution; an earlier resolution stays
// in the history (and in the row's resolved_* columns, until the next). The metadata is kept as
// driver.StorableMetadata; a dead letter that fails dl.Validate is
// refused, on either dialect. In the same transaction it forgets the
// message's delivery count for the consumer, so that a replay is counted
// afresh instead of hitting the delivery limit at once, and ends the
// event's wait or parking (its row of parked_events under its key, at its
// subject and sequence, that is not a hold).
func (s *Store) PublishDeadLetter(ctx context.Context, dl driver.DeadLetter) error {
	return s.bounded(ctx, func(ctx context.Context) error { return s.storeDeadLetter(ctx, dl, false) })
}

// HoldDeadLetter implements driver.Store: PublishDeadLetter and the
// hold of dl's subject (see hold) in one transaction.
func (s *Store) HoldDeadLetter(ctx context.Context, dl driver.DeadLetter) error {
	return s.bounded(ctx, func(ctx context.Context) error {
		return s.storeDeadLetter(ctx, dl, dl.Subject != "" && dl.SubjectSeq != 0)
	})
}

func (s *Store) storeDeadLetter(ctx context.Context, dl driver.DeadLetter, hold bool) error {
	if err := dl.Validate(); err != nil {
		return err
	}
	meta, err := encodeMetadata(dl.Metadata)
	if err != nil {
		return fmt.Errorf("publish dead letter %s for %s: %w", dl.Key(), dl.Consumer, err)
	}
	at := s.dialect.timeArg(s.now())
	return s.inTx(ctx, func(tx *sqlx.Tx) error {
		switch {
		case hold:
			if err := s.hold(ctx, tx, dl.Consumer, dl.Subject, dl.SubjectSeq, dl.Key(), at); err != nil {
				return fmt.Errorf("hold %s #%d: %w", dl.Subject, dl.SubjectSeq, err)
			}
		case dl.Subject != "" && dl.SubjectSeq != 0:
			if _, err := tx.ExecContext(ctx, s.q.sql(qEndOwnWait),
				dl.Consumer, dl.Subject, dl.SubjectSeq, dl.Source, dl.EventID); err != nil {
				return fmt.Errorf("end the wait of %s #%d: %w", dl.Subject, dl.SubjectSeq, err)
			}
		}
		return s.insertDeadLetter(ctx, tx, dl, meta, at)
	}, "publish dead letter %s for %s", dl.Key(), dl.Consumer)
}

// insertDeadLetter stores dl, with its metadata encoded as meta, failed
// at at, inside tx, with the failure in its history, and forgets its
// delivery count.
func (s *Store) insertDeadLetter(ctx context.Context, tx *sqlx.Tx, dl driver.DeadLetter, meta string, at any) error {
	body := dl.Body
	if body == nil {
		body = []byte{}
	}
	upsert := func(k framework.Key) (id int64, err error) {
		err = tx.QueryRowxContext(ctx, s.publishDeadLetter,
			dl.Consumer, dl.Topic, k.Source, k.ID, dl.Type, dl.Version, dl.Subject, dl.CorrelationID,
			string(dl.Code), dl.SubjectSeq, dl.Attempts, dl.Deliveries, at, at, body, meta).Scan(&id)
		return id, err
	}
	// The upsert updates a dead letter of the same body only: with
	// another one under the key, it returns no row, and the message is
	// kept under its body's digest (see driver.Store.PublishDeadLetter).
	id, err := upsert(dl.Key())
	if errors.Is(err, sql.ErrNoRows) {
		id, err = upsert(framework.DigestKey(body))
	}
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, s.q.sql(qAddHistory),
		id, at, string(driver.HistoryFailed), string(dl.Code), dl.Attempts, dl.Deliveries, "", ""); err != nil {
		return fmt.Errorf("history: %w", err)
	}
	if _, err := tx.ExecContext(ctx, s.forgetDelivery, dl.Consumer, dl.Source, dl.EventID); err != nil {
		return fmt.Errorf("forget delivery count: %w", err)
	}
	return nil
}

// DeadLetter implements driver.Store.
func (s *Store) DeadLetter(ctx context.Context, id int64) (dl driver.DeadLetter, err error) {
	err = s.bounded(ctx, func(ctx context.Context) (err error) {
		dl, err = s.deadLetterByID(ctx, id)
		return err
	})
	return dl, err
}

// deadLetterByID is DeadLetter's call.
func (s *Store) deadLetterByID(ctx context.Context, id int64) (driver.DeadLetter, error) {
	rows, err := s.db.QueryxContext(ctx, s.deadLetter, id)
	if err != nil {
		return driver.DeadLetter{}, fmt.Errorf("get dead letter %d: %w", id, err)
	}
	dls, err := scanDeadLetters(rows)
	if err != nil {
		return driver.DeadLetter{}, fmt.Errorf("get dead letter %d: %w", id, err)
	}
	if len(dls) == 0 {
		return driver.DeadLetter{}, fmt.Errorf("get dead letter %d: %w", id, driver.ErrNotFound)
	}
	return dls[0], nil
}

// DeadLetters implements driver.Store.
func (s *Store) DeadLetters(ctx context.Context, f driver.DeadLetterFilter) ([]driver.DeadLetter, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("list dead letters: negative limit %d", f.Limit)
	}
	if f.Limit == 0 {
		f.Limit = DefaultDeadLetterLimit
	}
	if !storableText(f.Consumer, string(f.Code), string(f.Status), f.Type, f.Subject, f.Source, f.EventID) {
		return nil, nil // no row holds it (PostgreSQL would refuse the query)
	}
	cond, condArgs := s.deadLetterFilter(f)
	args := append([]any{f.AfterID}, condArgs...)
	args = append(args, f.Limit)
	q := qDeadLetters
	if f.WithoutBody {
		// Not read at all: a body is up to the transport's limit.
		q = fmt.Sprintf(qDeadLettersWithoutBody, s.dialect.pick(`''::bytea`, `X''`))
	}
	rows, err := s.db.QueryxContext(ctx, s.q.sql(q+cond+qDeadLettersOrder), args...)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	dls, err := scanDeadLetters(rows)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return dls, nil
}

// ResolveDeadLetter implements driver.Store, in one transaction: the
// conditional update of the pending dead letter, its history entry and,
// for a replay, the replays row of its message (see
// driver.DeadLetter.ReplayMessage). A zero r.At means now, by the
// store's clock. Once it committed, it calls Options.OnResolve.
func (s *Store) ResolveDeadLetter(ctx context.Context, id int64, r driver.Resolution) (driver.DeadLetter, error) {
	if err := r.Validate(); err != nil {
		return driver.DeadLetter{}, fmt.Errorf("resolve dead letter %d: %w", id, err)
	}
	now := s.now()
	if r.At.IsZero() {
		r.At = now
	}
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return driver.DeadLetter{}, fmt.Errorf("resolve dead letter %d: begin: %w", id, err)
	}
	defer tx.Rollback() // a no-op after Commit
	dl, err := s.resolve(ctx, tx, id, r)
	if err != nil {
		return driver.DeadLetter{}, fmt.Errorf("resolve dead letter %d: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, s.q.sql(qAddHistory),
		id, s.dialect.timeArg(r.At), string(r.Status), "", 0, 0, r.By, r.Reason); err != nil {
		return driver.DeadLetter{}, fmt.Errorf("resolve dead letter %d: history: %w", id, err)
	}
	if r.Status == driver.DeadLetterReplayed {
		msg := dl.ReplayMessage()
		rp := driver.Replay{
			DeadLetterID: dl.ID, Consumer: dl.Consumer, Topic: dl.Topic,
			Body: msg.Payload, Metadata: msg.Metadata,
		}
		if err := s.addReplays(ctx, tx, []driver.Replay{rp}, now); err != nil {
			return driver.DeadLetter{}, fmt.Errorf("resolve dead letter %d: %w", id, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return driver.DeadLetter{}, fmt.Errorf("resolve dead letter %d: commit: %w", id, err)
	}
	if s.onResolve != nil {
		s.onResolve(dl, r)
	}
	return dl, nil
}

// resolve moves the pending dead letter id to r inside tx and returns it
// as it was before: driver.ErrNotFound when there is none,
// driver.ErrNotPending naming the status when it is not pending.
func (s *Store) resolve(ctx context.Context, tx *sqlx.Tx, id int64, r driver.Resolution) (driver.DeadLetter, error) {
	rows, err := tx.QueryxContext(ctx, s.resolveDeadLetter,
		string(r.Status), r.By, s.dialect.timeArg(r.At), r.Reason, id)
	if err != nil {
		return driver.DeadLetter{}, err
	}
	dls, err := scanDeadLetters(rows)
	if err != nil {
		return driver.DeadLetter{}, err
	}
	if len(dls) == 1 {
		dl := dls[0]
		dl.Status, dl.Resolution = driver.DeadLetterPending, driver.Resolution{}
		return dl, nil
	}
	var status string
	err = tx.QueryRowxContext(ctx, s.q.sql(qDeadLetterStatus), id).Scan(&status)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.DeadLetter{}, driver.ErrNotFound
	}
	if err != nil {
		return driver.DeadLetter{}, err
	}
	return driver.DeadLetter{}, fmt.Errorf("%w: %s", driver.ErrNotPending, status)
}

// DeadLetterHistory implements driver.Store: the entries in the order
// they were written. It returns driver.ErrNotFound when there is no
// dead letter id (every dead letter has its first failure).
func (s *Store) DeadLetterHistory(ctx context.Context, id int64) (_ []driver.HistoryEntry, err error) {
	rows, err := s.db.QueryxContext(ctx, s.q.sql(qDeadLetterHistory), id)
	if err != nil {
		return nil, fmt.Errorf("history of dead letter %d: %w", id, err)
	}
	defer func() {
		if cerr := rows.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("history of dead letter %d: %w", id, cerr)
		}
	}()
	var out []driver.HistoryEntry
	for rows.Next() {
		var (
			h          driver.HistoryEntry
			at         timeValue
			kind, code string
		)
		if err := rows.Scan(&at, &kind, &code, &h.Attempts, &h.Deliveries, &h.By, &h.Reason); err != nil {
			return nil, fmt.Errorf("history of dead letter %d: scan: %w", id, err)
		}
		h.At, h.Kind, h.Code = at.t, driver.HistoryKind(kind), framework.Code(code)
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("history of dead letter %d: %w", id, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("history of dead letter %d: %w", id, driver.ErrNotFound)
	}
	return out, nil
}

func scanDeadLetters(rows *sqlx.Rows) (_ []driver.DeadLetter, err error) {
	defer func() {
		if cerr := rows.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	var out []driver.DeadLetter
	for rows.Next() {
		var (
			dl                      driver.DeadLetter
			code, status            string
			first, last, resolvedAt timeValue
			meta                    []byte
			resolvedBy, resolveWhy  sql.NullString
		)
		if err := rows.Scan(&dl.ID, &dl.Consumer, &dl.Topic, &dl.Source, &dl.EventID, &dl.Type,
			&dl.Version, &dl.Subject, &dl.CorrelationID, &code, &dl.SubjectSeq, &dl.Attempts,
			&dl.Deliveries, &dl.Repeats, &first, &last, &dl.Body, &meta, &status,
			&resolvedBy, &resolvedAt, &resolveWhy); err != nil {
			return nil, fmt.Errorf("scan dead letter: %w", err)
		}
		dl.Code = framework.Code(code)
		dl.Status = driver.DeadLetterStatus(status)
		dl.FirstFailedAt, dl.LastFailedAt = first.t, last.t
		if dl.Metadata, err = decodeMetadata(meta); err != nil {
			return nil, fmt.Errorf("dead letter %d: %w", dl.ID, err)
		}
		if dl.Status != driver.DeadLetterPending {
			dl.Resolution = driver.Resolution{
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
