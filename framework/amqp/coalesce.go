package amqp

import (
	"errors"
	"net"
	"sync"
	"time"
)

const (
	// maxPending bounds the bytes a coalescingConn holds unwritten: a
	// Write beyond it waits for the writer to catch up.
	maxPending = 1 << 20
	// closeFlushTimeout bounds how long Close waits for what is gathered
	// to go out before it closes the socket under the writer.
	closeFlushTimeout = time.Second
)

// coalescingConn is a connection whose writes are sent by one goroutine of
// its own: Write appends to a buffer and returns, and the writer sends
// whatever gathered meanwhile in one write to the socket.
//
// amqp091-go flushes its buffer after every frame or message: a system
// call and a TCP segment each, which the broker reads one by one. Through
// a coalescingConn, what is written while the writer is busy (a relay
// publishing a batch, a consumer acking its deliveries) goes out together,
// and a lone frame goes out as soon as the writer runs. Bytes go out in
// the order of the Writes.
//
// A Write returns before its bytes reach the socket, as a write to a
// socket returns before they reach the peer: the socket's first error is
// returned by the Writes after it, and by Close. A read error (the peer went away, a
// missed heartbeat's deadline: amqp091-go gives the connection up on
// any) stops the writer too, and what it had not sent is dropped.
type coalescingConn struct {
	net.Conn
	flushTimeout time.Duration // how long Close waits for the rest to go out

	mu      sync.Mutex
	more    sync.Cond // wakes the writer: data, close, error
	room    sync.Cond // wakes Writes waiting for room: the writer took pending, error
	pending []byte
	err     error // the socket's first error; net.ErrClosed after Close
	closing bool
	done    chan struct{} // closed once the writer returned
}

// newCoalescingConn returns conn with its writes coalesced, and starts its
// writer, which runs until Close or an error of the socket.
func newCoalescingConn(conn net.Conn) *coalescingConn {
	c := &coalescingConn{Conn: conn, flushTimeout: closeFlushTimeout, done: make(chan struct{})}
	c.more.L, c.room.L = &c.mu, &c.mu
	go c.write()
	return c
}

// Read reads from the socket; its first error stops the writer.
func (c *coalescingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.fail(err)
	}
	return n, err
}

// fail records the socket's first error and wakes the writer and the
// waiting Writes.
func (c *coalescingConn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failLocked(err)
}

// failLocked is fail with c.mu held.
func (c *coalescingConn) failLocked(err error) {
	if c.err == nil {
		c.err = err
	}
	c.more.Signal()
	c.room.Broadcast()
}

// Write appends a copy of p to what the writer sends next, waiting first
// while maxPending bytes wait already.
func (c *coalescingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.err == nil && !c.closing && len(c.pending) > 0 && len(c.pending)+len(p) > maxPending {
		c.room.Wait()
	}
	switch {
	case c.err != nil:
		return 0, c.err
	case c.closing:
		return 0, net.ErrClosed
	}
	c.pending = append(c.pending, p...)
	c.more.Signal()
	return len(p), nil
}

// write sends what Write gathered, until Close (once the rest went out)
// or a write error.
func (c *coalescingConn) write() {
	defer close(c.done)
	var out []byte
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		for len(c.pending) == 0 && !c.closing && c.err == nil {
			c.more.Wait()
		}
		if c.err != nil || len(c.pending) == 0 {
			return
		}
		out, c.pending = c.pending, out[:0]
		c.room.Broadcast()
		c.mu.Unlock()
		_, err := c.Conn.Write(out)
		if cap(out) > 4*maxPending {
			out = nil // a huge message's buffer is not kept
		}
		c.mu.Lock()
		if err != nil {
			c.failLocked(err)
		}
	}
}

// Close sends what is gathered, waiting for it at most flushTimeout (a
// peer that reads nothing holds it), then closes the socket.
func (c *coalescingConn) Close() error {
	c.mu.Lock()
	c.closing = true
	c.more.Signal()
	c.room.Broadcast()
	c.mu.Unlock()
	flushed := time.NewTimer(c.flushTimeout)
	defer flushed.Stop()
	select {
	case <-c.done:
	case <-flushed.C:
	}
	err := c.Conn.Close() // ends a write the peer holds
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil && !errors.Is(c.err, net.ErrClosed) {
		err = errors.Join(c.err, err)
	}
	c.err = net.ErrClosed
	return err
}
