package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// queryContext returns the context of a statement on the subscription's
// connection: not cancelled by Close, since a statement cut short loses the
// connection (and the last write of the acknowledged position with it),
// but bounded by queryTimeout.
func (sub *subscription) queryContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(sub.ctx), queryTimeout)
}

// room returns how many rows the window has room for: it holds at most
// concurrency + BatchSize rows read and not acknowledged in order.
func (sub *subscription) room() int {
	return sub.s.concurrency + sub.s.cfg.BatchSize - len(sub.window)
}

// readDue reports whether to read now: the queue is empty, it is time,
// and the window has room for BatchSize rows, or for fewer when nothing
// in flight can make more (a read costs a round trip and a commit, be it
// for one row or many).
func (sub *subscription) readDue(now time.Time) bool {
	if len(sub.queue) > 0 || now.Before(sub.readAt) {
		return false
	}
	room := sub.room()
	return room >= sub.s.cfg.BatchSize || (room > 0 && len(sub.sent) == 0)
}

// read reads the rows after the cursor that fit the window. With
// marking, the same statement writes the handed-out position and the
// acknowledged one.
func (sub *subscription) read(now time.Time) error {
	room := sub.room()
	if room <= 0 {
		return nil
	}
	sub.stopWaiting()
	ctx, cancel := sub.queryContext()
	defer cancel()
	args := []any{strconv.FormatUint(sub.cursor.xid, 10), sub.cursor.offset, room}
	if sub.marking {
		args = append(args, sub.s.group, sub.acked.offset, strconv.FormatUint(sub.acked.xid, 10))
	}
	rows, err := sub.conn.QueryContext(ctx, sub.q.read, args...)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	schema := schemaAdapter(sub.s.cfg)
	var read []*row
	for rows.Next() {
		wr, err := schema.UnmarshalMessage(wsql.UnmarshalMessageParams{Row: rows})
		if err != nil {
			_ = rows.Close()
			return fmt.Errorf("read: %w", err)
		}
		xid, _ := wr.ExtraData["transaction_id"].(wsql.XID8)
		read = append(read, &row{
			pos:      position{xid: uint64(xid), offset: wr.Offset},
			uuid:     string(wr.UUID),
			payload:  wr.Payload,
			metadata: wr.Metadata,
		})
	}
	// Closed without error, the statement committed: the handed-out
	// position is written, and the rows may be handed out.
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if sub.marking {
		sub.dirty, sub.dirtyN = false, 0
	}
	for _, r := range read {
		sub.window = append(sub.window, r)
		sub.enqueue(r)
		sub.cursor = r.pos
	}
	if len(read) < room {
		sub.readAt = sub.nextRead(now) // caught up
	} else {
		sub.readAt = time.Time{}
	}
	return nil
}

// nextRead returns when to read again after a read that found every
// visible row: after PollInterval, or sooner while the rows of a notified
// transaction are not read yet (they become visible once every
// transaction older than it ended), with pauses doubling up to
// PollInterval.
func (sub *subscription) nextRead(now time.Time) time.Time {
	poll := sub.s.cfg.PollInterval
	if sub.notifiedXID == 0 || sub.cursor.xid >= sub.notifiedXID {
		sub.notifiedXID, sub.notifyRetry = 0, 0
		return now.Add(poll)
	}
	sub.notifyRetry = max(2*sub.notifyRetry, notifyRetryMin)
	if sub.notifyRetry >= poll {
		sub.notifiedXID, sub.notifyRetry = 0, 0
		return now.Add(poll)
	}
	return now.Add(sub.notifyRetry)
}

// acquire connects when not connected and tries the group's lock; with
// it, it reads the group's position. Without it, it stands by until
// PollInterval passed.
func (sub *subscription) acquire() error {
	if sub.conn == nil {
		conn, err := sub.s.db.Conn(sub.ctx)
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		sub.conn = conn
	}
	ctx, cancel := sub.queryContext()
	defer cancel()
	var got bool
	err := sub.conn.QueryRowContext(ctx, sub.q.lock, OffsetsTable(sub.s.cfg.TablePrefix, sub.topic), sub.s.group).Scan(&sub.key, &got)
	if err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	if !got {
		sub.retryAt = time.Now().Add(sub.s.cfg.PollInterval)
		return nil
	}
	sub.listen(ctx)
	// The rows already there are read as soon as they are visible, as if
	// their transactions had just notified: a transaction open elsewhere
	// may hide them from the first read, and no notification comes for
	// them.
	var newest string
	if err := sub.conn.QueryRowContext(ctx, sub.q.newest).Scan(&newest); err != nil {
		return fmt.Errorf("newest message: %w", err)
	}
	if xid, err := strconv.ParseUint(newest, 10, 64); err == nil {
		sub.notifiedXID = max(sub.notifiedXID, xid)
	}
	stored, mark, err := sub.storedPosition(ctx)
	if err != nil {
		return err
	}
	// The rows handed out up to now (see redelivered) are the ones up to
	// the group's handed-out position; when that is unknown, any row there
	// now may have been.
	sub.dropNext() // prepared before, it may say otherwise
	sub.handedHigh = position{}
	sub.takenMark, sub.unknownXID = position{}, 0
	if mark != nil {
		sub.takenMark = *mark
	} else if xid, err := strconv.ParseUint(newest, 10, 64); err == nil {
		sub.unknownXID = xid
	} else {
		sub.unknownXID = math.MaxUint64
	}
	if sub.cursor.less(stored) {
		sub.cursor = stored
	}
	if sub.acked.less(stored) {
		sub.acked = stored
	}
	sub.locked = true
	sub.readAt = time.Time{}
	sub.log.Debug("postgres subscriber: active for its group")
	return nil
}

// storedPosition reads the group's acknowledged position, giving it the
// zero row when it has none, and its handed-out position: nil when
// unknown (see handedOutColumns).
func (sub *subscription) storedPosition(ctx context.Context) (acked position, handedOut *position, err error) {
	var (
		xid        wsql.XID8
		markXID    sql.NullString
		markOffset sql.NullInt64
	)
	err = sub.conn.QueryRowContext(ctx, sub.q.position, sub.s.group).Scan(&acked.offset, &xid, &markXID, &markOffset)
	if errors.Is(err, sql.ErrNoRows) {
		if _, err := sub.conn.ExecContext(ctx, sub.q.zero, sub.s.group); err != nil {
			return position{}, nil, fmt.Errorf("give the group its row: %w", err)
		}
		return position{}, &position{}, nil // a new row: nothing handed out
	}
	if err != nil {
		return position{}, nil, fmt.Errorf("read the group's position: %w", err)
	}
	acked.xid = uint64(xid)
	if !markXID.Valid || !markOffset.Valid {
		return acked, nil, nil
	}
	mx, err := strconv.ParseUint(markXID.String, 10, 64)
	if err != nil {
		return position{}, nil, fmt.Errorf("read the group's handed-out position %q: %w", markXID.String, err)
	}
	return acked, &position{xid: mx, offset: markOffset.Int64}, nil
}

// lost gives up the connection, and the lock with it, after a failed
// query; the subscription connects again after retryInterval. It keeps
// its window: the rows in flight keep their place.
func (sub *subscription) lost(what string, err error) {
	if sub.ctx.Err() != nil {
		return
	}
	sub.log.Warn("postgres subscriber: could not "+what+"; connecting again",
		slog.Any("error", err), slog.Duration("retry_in", retryInterval))
	sub.discard()
	sub.retryAt = time.Now().Add(retryInterval)
}

// discard closes the subscription's connection instead of returning it to
// the pool, which ends its session and its lock.
func (sub *subscription) discard() {
	sub.stopWaiting()
	if sub.conn == nil {
		return
	}
	_ = sub.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = sub.conn.Close()
	sub.conn, sub.locked, sub.listening = nil, false, false
}
