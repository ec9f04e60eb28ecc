package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/internal/sqlstore"
)

// syncDone is the outcome of a sync.
type syncDone struct {
	acks, nacks []int64 // written, or, when err is set, still to write
	claimN      int     // how many the sync meant to claim
	claimed     []claimedRow
	drained     bool // nothing more to claim for now
	wakes       int  // the run loop's count of wakes when the sync started
	err         error
	// readErr is a failure to read the new messages of a claim that
	// committed: they are handed out again when their leases end.
	readErr error
}

// sync writes acks and nacks and claims up to claimN messages, in one
// transaction. It runs beside the run loop (see run), so it reads no state
// of the subscription but its configuration; at is the loop's count of
// wakes, handed back.
func (sub *pubsubSubscription) sync(acks, nacks []int64, claimN, at int) syncDone {
	r := syncDone{acks: acks, nacks: nacks, claimN: claimN, wakes: at}
	if len(acks)+len(nacks) == 0 {
		due, err := sub.anyDue()
		if err != nil {
			r.err = err
			return r
		}
		if !due {
			r.drained = true
			return r
		}
	}
	s := sub.s
	tx, err := s.db.BeginTxx(sub.ctx, nil)
	if err != nil {
		r.err = fmt.Errorf("begin: %w", err)
		return r
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	now := time.Now()
	if err := sub.writeResults(sub.ctx, tx, now, acks, nacks, nil, nil); err != nil {
		r.err = err
		return r
	}
	var (
		claimed []claimedRow
		fresh   newRange
	)
	if claimN > 0 {
		claimed, fresh, err = sub.claim(tx, now, claimN)
		if err != nil {
			r.err = err
			return r
		}
	}
	if err := tx.Commit(); err != nil {
		r.err = fmt.Errorf("commit claim: %w", err)
		return r
	}
	r.claimed = claimed
	r.drained = claimN > 0 && len(claimed)+fresh.n < claimN
	if fresh.n > 0 {
		// The new messages claimed are read once the claim committed,
		// without the file's write lock: their leases keep them from
		// the cleanup meanwhile. The read goes on through a shutdown, so
		// that the shutdown hands back their leases with the others not
		// handed out; one that failed to read is handed out again when
		// its lease ends.
		rows, err := s.db.QueryContext(context.WithoutCancel(sub.ctx), s.q.selectNew, sub.topic, fresh.after, fresh.last)
		if err == nil {
			var msgs []claimedRow
			msgs, err = sub.scanMessages(rows, func(int64) int64 { return 1 })
			r.claimed = append(r.claimed, msgs...)
		}
		if err != nil {
			r.readErr = fmt.Errorf("read claimed messages: %w", err)
		}
	}
	return r
}

// newRange is the new messages a claim took: n of them, of the offsets
// after after up to last.
type newRange struct {
	after, last int64
	n           int
}

// syncEnded takes the outcome of a sync into the subscription's state:
// the claimed messages wait to be handed out; the acks and nacks of a sync
// that failed go back to the buffer, before those given since. A sync that
// found nothing more to claim stops the claims until the next wake, unless
// one came while it ran (wakes is the loop's count now). A sync that
// committed but could not read its new messages is taken in, and its
// error returned.
func (sub *pubsubSubscription) syncEnded(r syncDone, wakes int) error {
	if r.err != nil {
		sub.acks = append(r.acks, sub.acks...)
		sub.nacks = append(r.nacks, sub.nacks...)
		return r.err
	}
	// The messages are built after the commit: their metadata's decoding
	// and contexts need not hold the file's write lock.
	for _, row := range r.claimed {
		sub.pending = append(sub.pending, sub.newDelivery(row))
	}
	if r.drained && r.wakes == wakes {
		sub.wantClaim = false
	}
	return r.readErr
}

// anyDue reports, without taking the write lock, whether the group has a
// message to claim on the topic.
func (sub *pubsubSubscription) anyDue() (bool, error) {
	var due bool
	err := sub.s.db.QueryRowxContext(sub.ctx, sub.s.q.anyDue,
		sub.topic, sub.s.cfg.ConsumerGroup, time.Now().UnixMilli()).Scan(&due)
	if err != nil {
		return false, fmt.Errorf("look for messages: %w", err)
	}
	return due, nil
}

// writeResults writes acks (lease deleted), nacks (redelivered after the
// nack delay), releases (redelivered now) and unclaims (never handed out:
// redelivered now, their delivery not counted).
func (sub *pubsubSubscription) writeResults(ctx context.Context, tx *sqlx.Tx, now time.Time, acks, nacks, releases, unclaims []int64) error {
	q, group := sub.s.q, sub.s.cfg.ConsumerGroup
	if len(acks) > 0 {
		if _, err := tx.ExecContext(ctx, q.ack, sub.topic, group, sqlstore.JSONIDs(acks)); err != nil {
			return fmt.Errorf("write acks: %w", err)
		}
	}
	if len(nacks) > 0 {
		until := now.Add(sub.s.cfg.NackDelay).UnixMilli()
		if _, err := tx.ExecContext(ctx, q.release, until, sub.topic, group, sqlstore.JSONIDs(nacks)); err != nil {
			return fmt.Errorf("write nacks: %w", err)
		}
	}
	if len(releases) > 0 {
		if _, err := tx.ExecContext(ctx, q.release, now.UnixMilli(), sub.topic, group, sqlstore.JSONIDs(releases)); err != nil {
			return fmt.Errorf("release leases: %w", err)
		}
	}
	if len(unclaims) > 0 {
		if _, err := tx.ExecContext(ctx, q.unclaim, sub.topic, group, sqlstore.JSONIDs(unclaims)); err != nil {
			return fmt.Errorf("release leases: %w", err)
		}
	}
	return nil
}

// claim takes up to n messages in tx: first those whose lease expired or
// whose nack delay passed, read here, then new ones after the group's
// claimed offset, whose range it returns for the caller to read after
// the commit.
func (sub *pubsubSubscription) claim(tx *sqlx.Tx, now time.Time, n int) ([]claimedRow, newRange, error) {
	s, ctx := sub.s, sub.ctx
	q, group := s.q, s.cfg.ConsumerGroup
	until := now.Add(s.cfg.LeaseDuration).UnixMilli()

	// Messages claimed before: nacked, released or with an expired lease.
	rows, err := tx.QueryContext(ctx, q.reclaim, until, sub.topic, group, now.UnixMilli(), n)
	if err != nil {
		return nil, newRange{}, fmt.Errorf("claim messages: %w", err)
	}
	deliveries := make(map[int64]int64)
	var offsets []int64
	for rows.Next() {
		var off, count int64
		if err := rows.Scan(&off, &count); err != nil {
			_ = rows.Close()
			return nil, newRange{}, fmt.Errorf("claim messages: %w", err)
		}
		deliveries[off] = count
		offsets = append(offsets, off)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, newRange{}, fmt.Errorf("claim messages: %w", err)
	}
	var claimed []claimedRow
	if len(offsets) > 0 {
		rows, err := tx.QueryContext(ctx, q.selectByOff, sqlstore.JSONIDs(offsets))
		if err != nil {
			return nil, newRange{}, fmt.Errorf("claim messages: %w", err)
		}
		claimed, err = sub.scanMessages(rows, func(off int64) int64 { return deliveries[off] })
		if err != nil {
			return nil, newRange{}, err
		}
		if len(claimed) < len(offsets) {
			// Someone deleted messages under their leases: forget the leases.
			found := make(map[int64]bool, len(claimed))
			for _, r := range claimed {
				found[r.offset] = true
			}
			var gone []int64
			for _, off := range offsets {
				if !found[off] {
					gone = append(gone, off)
				}
			}
			if _, err := tx.ExecContext(ctx, q.ack, sub.topic, group, sqlstore.JSONIDs(gone)); err != nil {
				return nil, newRange{}, fmt.Errorf("claim messages: forget leases of deleted messages: %w", err)
			}
		}
	}
	if len(claimed) >= n {
		return claimed, newRange{}, nil
	}

	// New messages.
	var after int64
	err = tx.QueryRowxContext(ctx, q.claimedOffset, sub.topic, group).Scan(&after)
	if errors.Is(err, sql.ErrNoRows) {
		_, err = tx.ExecContext(ctx, q.registerGroup, sub.topic, group, now.UnixMilli())
	}
	if err != nil {
		return nil, newRange{}, fmt.Errorf("claim messages: read claimed offset: %w", err)
	}
	offsets, err = scanOffsets(tx.QueryContext(ctx, q.claimNew, sub.topic, after, n-len(claimed)))
	if err != nil {
		return nil, newRange{}, fmt.Errorf("claim messages: %w", err)
	}
	if len(offsets) == 0 {
		return claimed, newRange{}, nil
	}
	last := offsets[len(offsets)-1]
	if _, err := tx.ExecContext(ctx, q.insertLeases, sub.topic, group, until, sqlstore.JSONIDs(offsets)); err != nil {
		return nil, newRange{}, fmt.Errorf("claim messages: insert leases: %w", err)
	}
	if _, err := tx.ExecContext(ctx, q.setClaimed, last, sub.topic, group); err != nil {
		return nil, newRange{}, fmt.Errorf("claim messages: move claimed offset: %w", err)
	}
	return claimed, newRange{after: after, last: last, n: len(offsets)}, nil
}

// scanOffsets reads and closes rows of one offset each.
func scanOffsets(rows *sql.Rows, err error) ([]int64, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var offsets []int64
	for rows.Next() {
		var off int64
		if err := rows.Scan(&off); err != nil {
			return nil, err
		}
		offsets = append(offsets, off)
	}
	return offsets, rows.Err()
}

// claimedRow is a message as a claim read it, to be made a delivery once
// the claim committed.
type claimedRow struct {
	offset     int64
	uuid       string
	payload    []byte
	metadata   []byte
	createdAt  int64 // when it was published, Unix milliseconds (nowMillis); 0 unknown (millisOf)
	deliveries int64
}

// scanMessages reads rows of (offset, uuid, payload, metadata, created_at);
// deliveriesOf gives the delivery count of each offset.
func (sub *pubsubSubscription) scanMessages(rows *sql.Rows, deliveriesOf func(int64) int64) (rs []claimedRow, err error) {
	defer func() {
		if cerr := rows.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("claim messages: %w", cerr)
		}
	}()
	for rows.Next() {
		var (
			r         claimedRow
			createdAt sql.NullInt64
		)
		if err := rows.Scan(&r.offset, &r.uuid, &r.payload, &r.metadata, &createdAt); err != nil {
			return nil, fmt.Errorf("claim messages: %w", err)
		}
		r.createdAt = createdAt.Int64
		r.deliveries = deliveriesOf(r.offset)
		rs = append(rs, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim messages: %w", err)
	}
	return rs, nil
}

// pubsubClaims encodes (offset, deliveries) pairs as a JSON array of
// two-element arrays for json_each.
func pubsubClaims(claims [][2]int64) string {
	b := make([]byte, 0, len(claims)*12+2)
	b = append(b, '[')
	for i, c := range claims {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendInt(b, c[0], 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, c[1], 10)
		b = append(b, ']')
	}
	return string(append(b, ']'))
}
