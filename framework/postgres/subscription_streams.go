package postgres

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// stream is one position of a subscription in its topic, with its row in
// the offsets table and its advisory lock: the consumer group's when the
// consumer is not partitioned, else one partition's (see partitionGroup).
// A partitioned subscription reads all its streams in one statement, on
// its one connection.
type stream struct {
	part   int    // the partition; 0 when not partitioned
	group  string // its row in the offsets table
	key    int64  // the advisory lock's key
	locked bool
	// dropping says that the stream's partition is no longer assigned:
	// it hands out nothing more, and ends once none of its deliveries is
	// in flight (endDrops).
	dropping bool
	gone     bool // ended: the outcomes of its rows are dropped
	inFlight int  // its deliveries in sent

	takenMark  position // the group's handed-out position when the lock was taken
	unknownXID uint64   // when that was unknown, the newest transaction with a row then
	handedHigh position // the last row handed out since the lock was taken

	window []*row   // read and not acknowledged in order, in order
	cursor position // the last row read
	// cursorUUID is the uuid of the row at cursor when this subscription
	// read it; empty when cursor is a position the database gave (see
	// lostCursors).
	cursorUUID string
	// timeline is the database's timeline when the stream last took its
	// lock: a new one means a failover or a restore (see took).
	timeline string
	acked    position // the end of the acknowledged prefix
	dirty    bool     // acked is not written yet
	dirtyN   int      // rows acknowledged since the last write
	dirtyAt  time.Time
}

// readable reports whether the stream reads and hands out rows.
func (st *stream) readable() bool { return st.locked && !st.dropping }

// assignment is the partitions Assign gives a subscription; done closes
// once none of the partitions it dropped has a message in flight.
type assignment struct {
	parts []int
	done  chan struct{}
}

// partitioned reports whether the subscription reads partitions.
func (sub *subscription) partitioned() bool { return sub.s.partitioned() }

// active reports whether the subscription holds a lock: it then reads and
// hands out rows.
func (sub *subscription) active() bool {
	if sub.conn == nil {
		return false
	}
	for _, st := range sub.streams {
		if st.locked {
			return true
		}
	}
	return false
}

// wantsLock reports whether a stream waits for its lock.
func (sub *subscription) wantsLock() bool {
	for _, st := range sub.streams {
		if !st.locked && !st.dropping {
			return true
		}
	}
	return false
}

// unlockAll records that the connection, and every lock with it, is
// gone: nothing is handed out until the locks are taken again, when each
// stream queues its rows again (requeue).
func (sub *subscription) unlockAll() {
	for _, st := range sub.streams {
		st.locked = false
	}
	for _, r := range sub.queue {
		r.queued = false
	}
	clear(sub.queue)
	sub.queue = sub.queue[:0]
	sub.dropNext()
}

// requeue queues the rows of st's window that are neither handed out nor
// waiting for their resend, once st is locked.
func (sub *subscription) requeue(st *stream) {
	for _, r := range st.window {
		if r.current == nil && !r.pending {
			sub.enqueue(r)
		}
	}
}

// reset forgets what a partition's stream read, when another process
// took its partition: it reads from the stored position once locked
// again. Its deliveries in flight stay.
func (sub *subscription) reset(st *stream) {
	sub.removeRows(st)
	clear(st.window)
	st.window = nil
	st.cursor, st.cursorUUID, st.acked = position{}, "", position{}
	st.dirty, st.dirtyN = false, 0
}

// removeRows takes st's rows out of the queue and out of waiting.
func (sub *subscription) removeRows(st *stream) {
	if sub.next != nil && sub.next.r.st == st {
		sub.dropNext()
	}
	keep := func(rows []*row, done func(*row)) []*row {
		kept := rows[:0]
		for _, r := range rows {
			if r.st == st {
				done(r)
				continue
			}
			kept = append(kept, r)
		}
		clear(rows[len(kept):])
		return kept
	}
	sub.queue = keep(sub.queue, func(r *row) { r.queued = false })
	sub.waiting = keep(sub.waiting, func(r *row) { r.pending = false })
}

// reassign makes the subscription read a's partitions: a new one gets a
// stream, locked at once; one no longer assigned drops, handing out
// nothing more (a.done closes once none has a delivery in flight); one
// assigned again while it drops reads on.
func (sub *subscription) reassign(a assignment) {
	want := make(map[int]bool, len(a.parts))
	for _, p := range a.parts {
		want[p] = true
	}
	for _, st := range sub.streams {
		switch {
		case want[st.part] && st.dropping:
			st.dropping = false
			sub.requeue(st)
		case !want[st.part] && !st.dropping:
			st.dropping = true
			sub.removeRows(st)
		}
		delete(want, st.part)
	}
	for p := range want {
		sub.streams = append(sub.streams, &stream{part: p, group: partitionGroup(sub.s.group, p, sub.s.partitions)})
	}
	slices.SortFunc(sub.streams, func(a, b *stream) int { return a.part - b.part })
	sub.retryAt = time.Time{}
	sub.dropped = append(sub.dropped, a.done)
}

// endDrops ends the dropping streams with no delivery in flight, and
// closes the waits of Assign once none is left.
func (sub *subscription) endDrops() {
	if !slices.ContainsFunc(sub.streams, func(st *stream) bool { return st.dropping }) {
		sub.endDropWaits()
		return
	}
	var ending []*stream
	kept := make([]*stream, 0, len(sub.streams))
	dropping := false
	for _, st := range sub.streams {
		switch {
		case !st.dropping:
			kept = append(kept, st)
		case st.inFlight > 0:
			dropping = true
			kept = append(kept, st)
		default:
			ending = append(ending, st)
		}
	}
	sub.streams = kept
	for _, st := range ending {
		sub.end(st)
	}
	if !dropping {
		sub.endDropWaits()
	}
}

// endDropWaits closes the waits of Assign.
func (sub *subscription) endDropWaits() {
	for _, done := range sub.dropped {
		close(done)
	}
	sub.dropped = nil
}

// end ends a dropped stream: it writes its acknowledged position, lowers
// its handed-out position, and releases its lock, so that the partition's
// next owner starts where it stopped. A failed write loses the
// connection: the next owner delivers again what was not written.
func (sub *subscription) end(st *stream) {
	st.gone = true
	defer func() {
		st.locked = false
		clear(st.window)
		st.window = nil
	}()
	if !st.locked || sub.conn == nil {
		return
	}
	if st.dirty {
		if err := sub.writeAcked([]*stream{st}); err != nil {
			sub.lost("write the acknowledged position of a dropped partition", err)
			return
		}
	}
	sub.stopWaiting()
	ctx, cancel := sub.queryContext()
	defer cancel()
	if err := sub.lower(ctx, st); err != nil {
		sub.lost("write the handed-out position of a dropped partition", err)
		return
	}
	if _, err := sub.conn.ExecContext(ctx, sub.q.unlock, st.key); err != nil {
		sub.lost("release a dropped partition", fmt.Errorf("unlock %s: %w", st.group, err))
	}
}

// readParts reads, in one statement, the rows after the cursor of each
// readable stream that fit its window (see partitionQueries), and writes
// the positions of those that read rows or whose acknowledged position is
// not written. It records the visibility horizon of the statement (the
// sentinel row of partition -1), past which every row is visible.
func (sub *subscription) readParts(now time.Time) error {
	var (
		in                    []*stream
		parts, lims           []int32
		groups, xids, ackXIDs []string
		offsets, ackOffsets   []int64
		dirty                 []bool
	)
	byPart := make(map[int]*stream)
	for _, st := range sub.streams {
		if !st.readable() {
			continue
		}
		in = append(in, st)
		byPart[st.part] = st
		parts = append(parts, int32(st.part))
		groups = append(groups, st.group)
		xids = append(xids, strconv.FormatUint(st.cursor.xid, 10))
		offsets = append(offsets, st.cursor.offset)
		lims = append(lims, int32(max(sub.room(st), 0)))
		ackOffsets = append(ackOffsets, st.acked.offset)
		ackXIDs = append(ackXIDs, strconv.FormatUint(st.acked.xid, 10))
		dirty = append(dirty, st.dirty)
	}
	if len(in) == 0 {
		return nil
	}
	sub.stopWaiting()
	ctx, cancel := sub.queryContext()
	defer cancel()
	at := time.Now() // the rows' ages are the server's at the statement's start
	rows, err := sub.conn.QueryContext(ctx, sub.q.readParts, parts, groups, xids, offsets, lims, ackOffsets, ackXIDs, dirty)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	var read []*row
	count := make(map[*stream]int32)
	for rows.Next() {
		var (
			part              int
			offset            int64
			xid               wsql.XID8
			uuid              string
			payload, metadata []byte
			age               sql.NullInt64
		)
		if err := rows.Scan(&part, &offset, &xid, &uuid, &payload, &metadata, &age); err != nil {
			_ = rows.Close()
			return fmt.Errorf("read: scan: %w", err)
		}
		st := byPart[part]
		if st == nil { // the horizon
			sub.horizon = uint64(xid)
			continue
		}
		count[st]++
		read = append(read, &row{
			st: st, pos: position{xid: uint64(xid), offset: offset}, uuid: uuid, payload: payload, metadata: metadata,
			publishedAt: publishedAt(at, age),
		})
	}
	// Closed without error, the statement committed: the handed-out
	// positions are written, and the rows may be handed out.
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	for _, st := range in {
		st.dirty, st.dirtyN = false, 0
	}
	sub.take(read)
	for i, st := range in {
		if lims[i] > 0 && count[st] == lims[i] {
			sub.readAt = time.Time{} // more to read
			return nil
		}
	}
	sub.readAt = sub.nextRead(now) // caught up
	return nil
}
