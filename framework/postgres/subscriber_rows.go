package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/jmoiron/sqlx"
)

// A partitioned consumer keeps, in each topic's offsets table, a row per
// partition: its group is partitionGroup's "<consumer>#<p>/<n>" (a
// consumer name never holds '#'), with watermill-sql's columns and the
// handed-out ones, so each partition has a position of its own, read and
// written by the statements of the unpartitioned group's row. n is in the
// name because a partition of n is not one of another count.
//
// When the count changes (from 1, to 1, or between two counts), the rows
// of the new count are made, once, from those of the old: each starts at
// the lowest acknowledged position among the old rows, which none of its
// buckets' messages is behind (the messages between are delivered again:
// at least once), with the highest handed-out position among them (those
// messages count as redeliveries), and the old rows are deleted.

// partitionGroup returns the group, in the offsets tables, of partition p
// of consumer's n.
func partitionGroup(consumer string, p, n int) string {
	return consumer + "#" + strconv.Itoa(p) + "/" + strconv.Itoa(n)
}

// partitionOfGroup reports the partition and count of group when it is a
// partitionGroup of consumer.
func partitionOfGroup(consumer, group string) (p, n int, ok bool) {
	rest, found := strings.CutPrefix(group, consumer+"#")
	if !found {
		return 0, 0, false
	}
	ps, ns, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, false
	}
	p, perr := strconv.Atoi(ps)
	n, nerr := strconv.Atoi(ns)
	if perr != nil || nerr != nil || p < 0 || p >= n || strconv.Itoa(p) != ps || strconv.Itoa(n) != ns {
		return 0, 0, false
	}
	return p, n, true
}

// groups returns the groups of the subscriber's rows in each offsets
// table: the consumer's, or one per partition.
func (s *subscriber) groups() []string {
	if !s.partitioned() {
		return []string{s.group}
	}
	groups := make([]string, s.partitions)
	for p := range groups {
		groups[p] = partitionGroup(s.group, p, s.partitions)
	}
	return groups
}

// storedRow is a row of the offsets table.
type storedRow struct {
	group     string
	acked     position
	handedOut *position // nil when unknown
}

// initializeRows gives the subscriber's groups their rows in topic's
// offsets table, from the first message, or from the rows of the
// consumer's other partition count, which it then deletes; in a
// transaction under an advisory lock when any is missing.
func (s *subscriber) initializeRows(ctx context.Context, topic string) error {
	offsets := OffsetsTable(s.cfg.TablePrefix, topic)
	groups := s.groups()
	var have int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM `+offsets+` WHERE consumer_group = ANY($1::text[])`, groups).Scan(&have); err != nil {
		return fmt.Errorf("rows: %w", err)
	}
	if have == len(groups) {
		return nil
	}
	s.mu.Lock()
	marking := !s.noMarks[topic]
	s.mu.Unlock()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("rows: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1::text::regclass::oid::text || '/' || $2 || '#', 0))`,
		offsets, s.group); err != nil {
		return fmt.Errorf("rows: lock: %w", err)
	}
	marks := `NULL::text, NULL::bigint`
	if marking {
		marks = handedOutColumns[0] + `::text, ` + handedOutColumns[1]
	}
	rows, err := tx.QueryContext(ctx, `SELECT consumer_group, COALESCE(offset_acked, 0), last_processed_transaction_id::text, `+marks+
		` FROM `+offsets+` WHERE consumer_group = $1 OR left(consumer_group, length($1) + 1) = $1 || '#'`, s.group)
	if err != nil {
		return fmt.Errorf("rows: %w", err)
	}
	stored, err := scanStoredRows(rows)
	if err != nil {
		return fmt.Errorf("rows: %w", err)
	}
	mine := make(map[string]bool, len(groups))
	for _, g := range groups {
		mine[g] = true
	}
	var missing, old []string
	var from *storedRow
	for _, r := range stored {
		switch {
		case mine[r.group]:
			delete(mine, r.group)
		case r.group == s.group || s.ownGroup(r.group):
			old = append(old, r.group)
			from = lowest(from, r)
		}
	}
	for _, g := range groups {
		if mine[g] {
			missing = append(missing, g)
		}
	}
	if err := s.insertRows(ctx, tx, offsets, missing, from, marking); err != nil {
		return err
	}
	if from != nil {
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+offsets+` WHERE consumer_group = ANY($1::text[])`, old); err != nil {
			return fmt.Errorf("rows: delete the rows of the other partition count: %w", err)
		}
		s.log.Info("postgres subscriber: partition count changed; the new rows start at the old rows' lowest position",
			slog.String("topic", topic), slog.Int("partitions", s.partitions), slog.Any("old_rows", old))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("rows: commit: %w", err)
	}
	return nil
}

// ownGroup reports whether group is a partitionGroup of the consumer.
func (s *subscriber) ownGroup(group string) bool {
	_, _, ok := partitionOfGroup(s.group, group)
	return ok
}

// lowest returns the row that the new rows start from, given the one so
// far and r: the lower acknowledged position and the higher handed-out
// one (unknown when either is).
func lowest(so *storedRow, r storedRow) *storedRow {
	if so == nil {
		return &r
	}
	out := *so
	if r.acked.less(out.acked) {
		out.acked = r.acked
	}
	switch {
	case out.handedOut == nil || r.handedOut == nil:
		out.handedOut = nil
	case out.handedOut.less(*r.handedOut):
		out.handedOut = r.handedOut
	}
	return &out
}

// insertRows inserts the rows of groups: from the first message, or from
// the position of from.
func (s *subscriber) insertRows(ctx context.Context, tx *sqlx.Tx, offsets string, groups []string, from *storedRow, marking bool) error {
	if len(groups) == 0 {
		return nil
	}
	q := `INSERT INTO ` + offsets + ` (consumer_group, offset_acked, last_processed_transaction_id) SELECT g, 0, '0'`
	var args []any
	switch {
	case from != nil && marking:
		var hx, ho any // NULL: unknown
		if from.handedOut != nil {
			hx, ho = strconv.FormatUint(from.handedOut.xid, 10), from.handedOut.offset
		}
		q = `INSERT INTO ` + offsets + ` (consumer_group, offset_acked, last_processed_transaction_id, ` +
			handedOutColumns[0] + `, ` + handedOutColumns[1] + `) SELECT g, $2, $3::text::xid8, $4::text::xid8, $5::bigint`
		args = append(args, from.acked.offset, strconv.FormatUint(from.acked.xid, 10), hx, ho)
	case from != nil:
		q = `INSERT INTO ` + offsets + ` (consumer_group, offset_acked, last_processed_transaction_id) SELECT g, $2, $3::text::xid8`
		args = append(args, from.acked.offset, strconv.FormatUint(from.acked.xid, 10))
	}
	q += ` FROM unnest($1::text[]) AS g ON CONFLICT DO NOTHING`
	if _, err := tx.ExecContext(ctx, q, append([]any{groups}, args...)...); err != nil {
		return fmt.Errorf("rows: insert: %w", err)
	}
	return nil
}

// scanStoredRows reads the rows of a query of (group, offset, transaction
// id as text, handed-out transaction id as text or NULL, handed-out
// offset or NULL), and closes them.
func scanStoredRows(rows *sql.Rows) ([]storedRow, error) {
	defer func() { _ = rows.Close() }()
	var out []storedRow
	for rows.Next() {
		var (
			r          storedRow
			xid        string
			markXID    sql.NullString
			markOffset sql.NullInt64
		)
		if err := rows.Scan(&r.group, &r.acked.offset, &xid, &markXID, &markOffset); err != nil {
			return nil, err
		}
		var err error
		if r.acked.xid, err = strconv.ParseUint(xid, 10, 64); err != nil {
			return nil, fmt.Errorf("group %s: transaction id %q: %w", r.group, xid, err)
		}
		if markXID.Valid && markOffset.Valid {
			mx, err := strconv.ParseUint(markXID.String, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("group %s: handed-out transaction id %q: %w", r.group, markXID.String, err)
			}
			r.handedOut = &position{xid: mx, offset: markOffset.Int64}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
