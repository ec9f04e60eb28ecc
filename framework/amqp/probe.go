package amqp

import (
	"sync"
	"sync/atomic"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

const (
	// probeInterval is how often a prober asks the broker for an answer.
	probeInterval = time.Second
	// probeStall is how long a round trip may go unanswered before the
	// connection stops counting as connected: with probeInterval, a
	// network black hole reads as not connected within 3 s, where the
	// heartbeat closes the connection only after three heartbeats.
	probeStall = 2 * time.Second
)

// prober times round trips to the broker on a connection: every
// probeInterval it opens a channel and closes it, two requests the broker
// answers at once. A connection whose path drops every byte stays open to
// amqp091-go until its heartbeat times out; a round trip in flight for
// longer than probeStall says so at once.
type prober struct {
	conn    *wamqp.ConnectionWrapper
	pending atomic.Int64 // when the round trip in flight started (Unix ns); 0 when none is
	done    chan struct{}
	stopped sync.WaitGroup
}

// startProber starts probing conn until stop.
func startProber(conn *wamqp.ConnectionWrapper) *prober {
	p := &prober{conn: conn, done: make(chan struct{})}
	p.stopped.Add(1)
	go p.run()
	return p
}

func (p *prober) run() {
	defer p.stopped.Done()
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
		}
		if !p.conn.IsConnected() {
			continue // watermill-amqp is reconnecting: Connected says so
		}
		conn := p.conn.Connection()
		p.pending.Store(time.Now().UnixNano())
		answered := make(chan struct{})
		go func() {
			defer close(answered)
			roundTrip(conn)
		}()
		select {
		case <-answered:
			p.pending.Store(0)
		case <-p.done:
			// The round trip ends once the connection is closed, which
			// the caller of stop does next.
			return
		}
	}
}

// roundTrip opens a channel on conn and closes it. It returns when the
// broker answered, or when the connection ended (its heartbeat timed
// out, or it was closed): an error needs no handling, as the connection's
// own state then says it is not connected.
func roundTrip(conn *amqp091.Connection) {
	if conn == nil || conn.IsClosed() {
		return
	}
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	_ = ch.Close()
}

// answering reports whether no round trip has been waiting for longer
// than probeStall.
func (p *prober) answering() bool {
	started := p.pending.Load()
	return started == 0 || time.Since(time.Unix(0, started)) <= probeStall
}

// stop stops probing, without waiting for a round trip in flight (it
// ends once the connection is closed). Call it before closing the
// connection: watermill-amqp rewrites the state IsConnected reads, with
// no lock, when its connection closes.
func (p *prober) stop() {
	close(p.done)
	p.stopped.Wait()
}
