package amqp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingConn counts the writes that reach its connection.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// loopback returns the two ends of a TCP connection on 127.0.0.1.
func loopback(t *testing.T) (client, server net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- conn
	}()
	client, err = net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	server, ok := <-accepted
	require.True(t, ok, "accept")
	t.Cleanup(func() { _ = server.Close() })
	return client, server
}

// writeAtOnce writes each of ps to c, and fails the test when the Writes
// do not return soon: they must not wait for the socket.
func writeAtOnce(t *testing.T, c *coalescingConn, ps ...[]byte) {
	t.Helper()
	wrote := make(chan error, 1)
	go func() {
		var err error
		for i := 0; i < len(ps) && err == nil; i++ {
			_, err = c.Write(ps[i])
		}
		wrote <- err
	}()
	select {
	case err := <-wrote:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a Write waited for the socket")
	}
}

// TestCoalescingConnOrder: what many goroutines write at once arrives
// whole, each goroutine's writes in their order, and Close sends what is
// still gathered before the peer sees the end.
func TestCoalescingConnOrder(t *testing.T) {
	t.Parallel()
	client, server := loopback(t)
	c := newCoalescingConn(client)
	const writers, each = 8, 2000
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			// A record: writer, sequence, then a body of 0 to 300 bytes
			// of the writer's byte.
			for i := range each {
				rec := make([]byte, 10+i%301)
				binary.BigEndian.PutUint16(rec, uint16(w))
				binary.BigEndian.PutUint32(rec[2:], uint32(i))
				binary.BigEndian.PutUint32(rec[6:], uint32(len(rec)-10))
				for k := 10; k < len(rec); k++ {
					rec[k] = byte(w)
				}
				if _, err := c.Write(rec); err != nil {
					t.Errorf("write: %v", err)
					return
				}
			}
		})
	}
	received := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(server)
		received <- b
	}()
	wg.Wait()
	require.NoError(t, c.Close())
	b := <-received
	next := make([]uint32, writers)
	for len(b) > 0 {
		require.GreaterOrEqual(t, len(b), 10, "a record cut short")
		w, i, n := binary.BigEndian.Uint16(b), binary.BigEndian.Uint32(b[2:]), binary.BigEndian.Uint32(b[6:])
		require.Less(t, int(w), writers)
		require.Equal(t, next[w], i, "writer %d's records out of order", w)
		require.GreaterOrEqual(t, len(b), 10+int(n))
		require.Equal(t, bytes.Repeat([]byte{byte(w)}, int(n)), b[10:10+n])
		next[w]++
		b = b[10+n:]
	}
	for w := range writers {
		assert.EqualValues(t, each, next[w], "writer %d", w)
	}
}

// TestCoalescingConnGathers: the Writes made while the socket is busy go
// out in one write, and a Write does not wait for the socket.
func TestCoalescingConnGathers(t *testing.T) {
	t.Parallel()
	ours, peer := net.Pipe() // a write waits for the peer to read it
	counted := &countingConn{Conn: ours}
	c := newCoalescingConn(counted)
	defer c.Close()
	// The peer reads nothing yet: the Writes must return all the same.
	writes := [][]byte{[]byte("first")}
	for i := range 100 {
		writes = append(writes, []byte{byte(i)})
	}
	writeAtOnce(t, c, writes...)
	got := make([]byte, 0, 105)
	buf := make([]byte, 256)
	for len(got) < 105 {
		n, err := peer.Read(buf)
		require.NoError(t, err)
		got = append(got, buf[:n]...)
	}
	want := []byte("first")
	for i := range 100 {
		want = append(want, byte(i))
	}
	require.Equal(t, want, got)
	// "first" alone (the writer may have taken one or a few more with
	// it), then the rest together.
	assert.LessOrEqual(t, counted.writes.Load(), int64(3))
}

// TestCoalescingConnBounded: with the peer reading nothing, a Write waits
// once maxPending bytes wait, and goes on when the peer reads.
func TestCoalescingConnBounded(t *testing.T) {
	t.Parallel()
	ours, peer := net.Pipe()
	c := newCoalescingConn(ours)
	defer c.Close()
	chunk := make([]byte, maxPending)
	writeAtOnce(t, c, chunk) // the writer takes it, and waits for the peer
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.pending) == 0
	}, 5*time.Second, time.Millisecond)
	_, err := c.Write(chunk) // waits in pending
	require.NoError(t, err)
	third := make(chan error, 1)
	go func() {
		_, err := c.Write([]byte("third"))
		third <- err
	}()
	select {
	case err := <-third:
		t.Fatalf("a Write beyond maxPending returned at once: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	go func() { _, _ = io.Copy(io.Discard, peer) }()
	require.NoError(t, <-third)
}

// TestCoalescingConnCloseStuckPeer: Close returns when the peer reads
// nothing, after flushTimeout, and closes the socket; Writes after it
// fail.
func TestCoalescingConnCloseStuckPeer(t *testing.T) {
	t.Parallel()
	ours, peer := net.Pipe()
	defer peer.Close()
	c := newCoalescingConn(ours)
	c.flushTimeout = 10 * time.Millisecond
	_, err := c.Write([]byte("never read"))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- c.Close() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung on a peer that reads nothing")
	}
	_, err = c.Write([]byte("after"))
	require.ErrorIs(t, err, net.ErrClosed)
	_, err = peer.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the socket is closed")
}

// TestCoalescingConnPeerGone: once the peer went away, the writer stops and
// Writes fail, whether the socket's write or its read saw it first.
func TestCoalescingConnPeerGone(t *testing.T) {
	t.Parallel()
	t.Run("Read", func(t *testing.T) {
		t.Parallel()
		client, server := loopback(t)
		c := newCoalescingConn(client)
		defer c.Close()
		require.NoError(t, server.Close())
		_, err := c.Read(make([]byte, 1))
		require.Error(t, err)
		<-c.done // the writer returned
		_, err = c.Write([]byte("x"))
		require.Error(t, err)
	})
	t.Run("Write", func(t *testing.T) {
		t.Parallel()
		ours, peer := net.Pipe()
		c := newCoalescingConn(ours)
		defer c.Close()
		require.NoError(t, peer.Close())
		_, err := c.Write([]byte("lost"))
		require.NoError(t, err) // gathered; the writer's write fails
		<-c.done
		_, err = c.Write([]byte("x"))
		require.True(t, errors.Is(err, io.ErrClosedPipe), "got %v", err)
	})
}
