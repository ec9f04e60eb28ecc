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
// but bounded by the subscription's bound (see queryTimeout).
func (sub *subscription) queryContext() (context.Context, context.CancelFunc) {
	return sub.bound.Context(context.WithoutCancel(sub.ctx))
}

// room returns how many rows st's window has room for: it holds at most
// concurrency + BatchSize rows read and not acknowledged in order, and
// as many more as the reader holds (see subscriber.Hold).
func (sub *subscription) room(st *stream) int {
	return sub.s.concurrency + sub.s.cfg.BatchSize + sub.holds.Held() - len(st.window)
}

// readDue reports whether to read now: it is time, and a stream's window
// has room for half of BatchSize rows while fewer rows are queued than the
// concurrency, or, with the queue empty, for fewer when nothing in flight
// can make more (a read costs a round trip and a commit, be it for one
// row or many). The read does not wait for the queue to run dry: the rows
// still queued keep the places in flight busy while it runs, instead of
// each place freed meanwhile staying empty for its round trip (and, when
// acknowledged out of order, for the rows ahead of it in its window).
func (sub *subscription) readDue(now time.Time) bool {
	if now.Before(sub.readAt) {
		return false
	}
	short := len(sub.queue) < sub.s.concurrency
	for _, st := range sub.streams {
		if !st.readable() {
			continue
		}
		room := sub.room(st)
		if (short && room >= max(sub.s.cfg.BatchSize/2, 1)) || (room > 0 && len(sub.sent) == 0 && len(sub.queue) == 0) {
			return true
		}
	}
	return false
}

// read reads the rows after the cursor that fit the window. With
// marking, the same statement writes the handed-out position and the
// acknowledged one. A partitioned subscription reads all its streams at
// once (readParts).
func (sub *subscription) read(now time.Time) error {
	if sub.partitioned() {
		return sub.readParts(now)
	}
	st := sub.streams[0]
	room := sub.room(st)
	if room <= 0 {
		return nil
	}
	sub.stopWaiting()
	ctx, cancel := sub.queryContext()
	defer cancel()
	args := []any{strconv.FormatUint(st.cursor.xid, 10), st.cursor.offset, room}
	if sub.marking {
		args = append(args, st.group, st.acked.offset, strconv.FormatUint(st.acked.xid, 10))
	}
	at := time.Now() // the rows' ages are the server's at the statement's start
	rows, err := sub.conn.QueryContext(ctx, sub.q.read, args...)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	var read []*row
	for rows.Next() {
		var (
			offset            int64
			xid               wsql.XID8
			uuid              string
			payload, metadata []byte
			age               sql.NullInt64
		)
		if err := rows.Scan(&offset, &xid, &uuid, &payload, &metadata, &age); err != nil {
			_ = rows.Close()
			return fmt.Errorf("read: scan: %w", err)
		}
		read = append(read, &row{
			st:          st,
			pos:         position{xid: uint64(xid), offset: offset},
			uuid:        uuid,
			payload:     payload,
			metadata:    metadata,
			publishedAt: publishedAt(at, age),
		})
	}
	// Closed without error, the statement committed: the handed-out
	// position is written, and the rows may be handed out.
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if sub.marking {
		st.dirty, st.dirtyN = false, 0
	}
	sub.take(read)
	if len(read) < room {
		sub.readAt = sub.nextRead(now) // caught up
	} else {
		sub.readAt = time.Time{}
	}
	return nil
}

// publishedAt returns when a row read at at (the subscriber's clock when
// it sent the read) was published: at less its age by the server's clock
// (ageColumn), never after at; zero without an age.
func publishedAt(at time.Time, age sql.NullInt64) time.Time {
	if !age.Valid {
		return time.Time{}
	}
	return at.Add(-time.Duration(max(age.Int64, 0)) * time.Microsecond)
}

// take adds the rows read to their streams' windows and queues them.
func (sub *subscription) take(read []*row) {
	for _, r := range read {
		r.st.window = append(r.st.window, r)
		sub.enqueue(r)
		r.st.cursor, r.st.cursorUUID = r.pos, r.uuid
	}
}

// nextRead returns when to read again after a read that found every
// visible row: after PollInterval, or sooner while the rows of a notified
// transaction are not read yet (they become visible once every
// transaction older than it ended), with pauses doubling up to
// PollInterval. A partitioned read knows when they are visible (horizon),
// since they may belong to partitions of other processes.
func (sub *subscription) nextRead(now time.Time) time.Time {
	poll := sub.s.cfg.PollInterval
	var cursor uint64
	for _, st := range sub.streams {
		cursor = max(cursor, st.cursor.xid)
	}
	if sub.notifiedXID == 0 || cursor >= sub.notifiedXID || sub.horizon > sub.notifiedXID {
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

// acquire connects when not connected and tries the locks of the streams
// that want one; with a stream's lock, it reads the stream's position.
// The streams it could not lock stand by until PollInterval passed; a
// partitioned one forgets what it read, since another process reads its
// partition now.
func (sub *subscription) acquire(now time.Time) error {
	if sub.conn == nil {
		// The connection's making is bounded as its statements are: a
		// handshake lost on its way (a black hole that ends while the
		// connection is made) would otherwise wait for the driver's
		// connect timeout.
		ctx, cancel := sub.bound.Context(sub.ctx)
		conn, err := sub.s.db.Conn(ctx)
		cancel()
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		sub.conn = conn
	}
	sub.stopWaiting()
	ctx, cancel := sub.queryContext()
	defer cancel()
	want := make(map[string]*stream)
	var groups []string
	for _, st := range sub.streams {
		if !st.locked && !st.dropping {
			want[st.group] = st
			groups = append(groups, st.group)
		}
	}
	rows, err := sub.conn.QueryContext(ctx, sub.q.lock, OffsetsTable(sub.s.cfg.TablePrefix, sub.topic), groups)
	if err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	var got []*stream
	for rows.Next() {
		var (
			group string
			key   int64
			ok    bool
		)
		if err := rows.Scan(&group, &key, &ok); err != nil {
			_ = rows.Close()
			return fmt.Errorf("lock: %w", err)
		}
		if st := want[group]; st != nil {
			st.key = key
			if ok {
				got = append(got, st)
				delete(want, group)
			}
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	if len(want) > 0 {
		sub.retryAt = now.Add(sub.s.cfg.PollInterval)
		if sub.partitioned() {
			for _, st := range want {
				sub.reset(st)
			}
		}
	}
	if len(got) == 0 {
		return nil
	}
	return sub.took(ctx, got)
}

// took reads the positions of the streams whose locks it just took.
func (sub *subscription) took(ctx context.Context, got []*stream) error {
	if !sub.listening {
		sub.listen(ctx)
	}
	// The rows already there are read as soon as they are visible, as if
	// their transactions had just notified: a transaction open elsewhere
	// may hide them from the first read, and no notification comes for
	// them.
	var newest string
	if err := sub.conn.QueryRowContext(ctx, sub.q.newest).Scan(&newest); err != nil {
		return fmt.Errorf("newest message: %w", err)
	}
	newestXID, newestErr := strconv.ParseUint(newest, 10, 64)
	if newestErr == nil {
		sub.notifiedXID = max(sub.notifiedXID, newestXID)
	}
	stored, err := sub.storedPositions(ctx, got)
	if err != nil {
		return err
	}
	lost, err := sub.lostCursors(ctx, got)
	if err != nil {
		return err
	}
	timeline := sub.timeline(ctx)
	sub.dropNext() // prepared before, it may say otherwise
	for _, st := range got {
		r := stored[st.group]
		switch {
		case lost[st]:
			sub.log.Warn("postgres subscriber: the last row read is no longer in the database, which lost transactions (a failover to a standby that had not received them, or a restore); reading on from the group's stored position",
				slog.Int64("offset", st.cursor.offset))
			sub.reset(st)
		case st.timeline != "" && timeline != "" && timeline != st.timeline:
			// A failover or a restore: the database may lack the last
			// acknowledgements, and the effects committed before them
			// (asynchronous replication). The rows after the stored
			// position come again; the processed marks skip those whose
			// effects it kept.
			sub.log.Warn("postgres subscriber: the database's timeline changed (a failover or a restore); reading on from the group's stored position",
				slog.String("timeline", timeline), slog.String("was", st.timeline))
			sub.reset(st)
		}
		if timeline != "" {
			st.timeline = timeline
		}
		// The rows handed out up to now (see redelivered) are the ones up
		// to the group's handed-out position; when that is unknown, any
		// row there now may have been.
		st.handedHigh = position{}
		st.takenMark, st.unknownXID = position{}, 0
		switch {
		case r.handedOut != nil:
			st.takenMark = *r.handedOut
		case newestErr == nil:
			st.unknownXID = newestXID
		default:
			st.unknownXID = math.MaxUint64
		}
		if st.cursor.less(r.acked) {
			st.cursor, st.cursorUUID = r.acked, ""
		}
		if st.acked.less(r.acked) {
			st.acked = r.acked
		}
		st.locked = true
		sub.requeue(st)
	}
	sub.readAt = time.Time{}
	sub.log.Debug("postgres subscriber: active for its group", slog.Int("streams", len(got)))
	return nil
}

// timeline returns the database's timeline, or "" when it cannot tell
// (a server that offers no WAL functions): a failover is then seen only
// by the rows it lost (see lostCursors).
func (sub *subscription) timeline(ctx context.Context) string {
	var tl string
	if err := sub.conn.QueryRowContext(ctx, sub.q.timeline).Scan(&tl); err != nil {
		sub.log.Debug("postgres subscriber: no timeline", slog.Any("error", err))
		return ""
	}
	return tl
}

// lostCursors returns the streams of got whose cursor is a row this
// subscription read that the database no longer holds, as one that
// failed over to a standby that had not received it (asynchronous
// replication) or was restored from a backup. The database then assigns
// the ids of the transactions it lost again: rows written from now on
// may sort before the cursor, and reading on from it would skip them.
// Such a stream must read on from its group's stored position, which the
// database kept with the rows it did. On the same database no row
// appears before the cursor: a read takes only the rows of transactions
// older than every one still open. A cursor row purged since (every
// group passed it) is taken for lost too, and the stream reads on from
// its stored position, which is past it: nothing is read again.
func (sub *subscription) lostCursors(ctx context.Context, got []*stream) (map[*stream]bool, error) {
	var (
		offsets []int64
		xids    []string
		uuids   []string
		byOff   = make(map[int64]*stream)
	)
	for _, st := range got {
		if st.cursorUUID == "" {
			continue
		}
		offsets = append(offsets, st.cursor.offset)
		xids = append(xids, strconv.FormatUint(st.cursor.xid, 10))
		uuids = append(uuids, st.cursorUUID)
		byOff[st.cursor.offset] = st
	}
	if len(offsets) == 0 {
		return nil, nil
	}
	rows, err := sub.conn.QueryContext(ctx, sub.q.lost, offsets, xids, uuids)
	if err != nil {
		return nil, fmt.Errorf("find the last rows read: %w", err)
	}
	defer rows.Close()
	lost := make(map[*stream]bool)
	for rows.Next() {
		var off int64
		if err := rows.Scan(&off); err != nil {
			return nil, fmt.Errorf("find the last rows read: %w", err)
		}
		if st := byOff[off]; st != nil {
			lost[st] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("find the last rows read: %w", err)
	}
	return lost, nil
}

// storedPositions reads the acknowledged and handed-out positions of
// streams' groups (see handedOutColumns), giving a group without a row
// the zero row, which has handed out nothing.
func (sub *subscription) storedPositions(ctx context.Context, streams []*stream) (map[string]storedRow, error) {
	groups := make([]string, len(streams))
	for i, st := range streams {
		groups[i] = st.group
	}
	rows, err := sub.conn.QueryContext(ctx, sub.q.position, groups)
	if err != nil {
		return nil, fmt.Errorf("read the group's position: %w", err)
	}
	read, err := scanStoredRows(rows)
	if err != nil {
		return nil, fmt.Errorf("read the group's position: %w", err)
	}
	stored := make(map[string]storedRow, len(streams))
	for _, r := range read {
		stored[r.group] = r
	}
	var missing []string
	for _, g := range groups {
		if _, ok := stored[g]; !ok {
			missing = append(missing, g)
			stored[g] = storedRow{group: g, handedOut: &position{}} // a new row: nothing handed out
		}
	}
	if len(missing) > 0 {
		if _, err := sub.conn.ExecContext(ctx, sub.q.zero, missing); err != nil {
			return nil, fmt.Errorf("give the group its row: %w", err)
		}
	}
	return stored, nil
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
	if errors.Is(err, context.DeadlineExceeded) {
		sub.bound.Expired()
	}
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
	spoil(sub.conn)
	_ = sub.conn.Close()
	sub.conn, sub.listening = nil, false
	sub.unlockAll()
}

// spoil makes conn's Close close its session instead of returning it to
// the pool, which ends the session's locks.
func spoil(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
}
