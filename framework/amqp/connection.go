package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/effectively-once/effectively/internal/watermilllog"
)

// ErrNotConnected is returned by the publishers and subscribers of a
// connection before Connect succeeded, and while the broker is away.
var ErrNotConnected = errors.New("amqp: not connected (Transport.Connect has not succeeded yet)")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("amqp: connection is closed")

// ErrAccessRefused is returned by Connect when the broker refuses the
// credentials of the URL, or their access to its virtual host (AMQP 403
// ACCESS_REFUSED): trying again cannot help, so Connect does not.
var ErrAccessRefused = errors.New("amqp: the broker refused the credentials")

// connection is one AMQP connection shared by a process's publisher and
// subscribers. It does not dial: Connect does, retrying with
// backoff while the broker is down, so an application can start before its
// broker; a refusal of the credentials is not retried (ErrAccessRefused). Once connected, watermill-amqp reconnects by itself, forever,
// and the subscribers declare their topology again. With several broker
// URLs, each dial, the first and every reconnection, goes to the first
// node that answers from the one after the node last dialed (brokers).
type connection struct {
	cfg     TransportConfig
	logger  watermill.LoggerAdapter
	brokers *brokers

	mu     sync.Mutex
	conn   *wamqp.ConnectionWrapper
	closed bool
	ready  chan struct{} // closed once connected
	probe  *prober       // started once connected

	// lost are the deliveries in flight on channels lost with the
	// connection, whose redeliveries are not charged.
	lost lostDeliveries
}

// newConnection returns an unconnected connection.
func newConnection(cfg TransportConfig) (*connection, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	urls, err := ParseURLs(cfg.URL)
	if err != nil {
		return nil, err
	}
	b, err := newBrokers(urls, cfg.Logger)
	if err != nil {
		return nil, err
	}
	b.heartbeat = cfg.Heartbeat
	return &connection{
		cfg:     cfg,
		logger:  watermilllog.New(cfg.Logger),
		brokers: b,
		ready:   make(chan struct{}),
	}, nil
}

// Connect dials the broker, retrying with exponential backoff
// (Config.ConnectInterval up to Config.MaxConnectInterval) until it
// succeeds or ctx ends. It returns at once when already connected, and
// with ErrAccessRefused, without retrying, when the broker refuses the
// URL's user, password or virtual host. No error shows the password.
func (c *connection) Connect(ctx context.Context) error {
	delay := c.cfg.ConnectInterval
	for attempt := 1; ; attempt++ {
		err := c.dial()
		if err == nil || errors.Is(err, ErrClosed) {
			return err
		}
		if accessRefused(err) {
			return fmt.Errorf("%w of %s (check its user, password and virtual host): %w", ErrAccessRefused, redactURLs(c.cfg.URL), err)
		}
		c.cfg.Logger.WarnContext(ctx, "amqp: broker unreachable, retrying", "attempt", attempt, "retry_in", delay, "error", err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("amqp: broker unreachable at %s (%d attempts): %w (last error: %w)", redactURLs(c.cfg.URL), attempt, ctx.Err(), err)
		case <-t.C:
		}
		delay = min(2*delay, c.cfg.MaxConnectInterval)
	}
}

// accessRefused reports whether err is the broker's refusal of the
// credentials or of the virtual host (amqp091-go's ErrCredentials,
// ErrVhost or ErrSASL, all 403 ACCESS_REFUSED).
func accessRefused(err error) bool {
	var amqpErr *amqp091.Error
	return errors.As(err, &amqpErr) && amqpErr.Code == amqp091.AccessRefused
}

func (c *connection) dial() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return ErrClosed
	case c.conn != nil:
		return nil
	}
	conn, err := wamqp.NewConnection(wamqp.ConnectionConfig{
		AmqpURI:    c.brokers.dialURI(),
		AmqpConfig: c.brokers.config(),
		Reconnect: &wamqp.ReconnectConfig{
			BackoffInitialInterval:     c.cfg.ConnectInterval,
			BackoffRandomizationFactor: 0.2,
			BackoffMultiplier:          2,
			BackoffMaxInterval:         c.cfg.MaxConnectInterval,
		},
	}, c.logger)
	if err != nil {
		return err
	}
	c.conn = conn
	c.probe = startProber(conn)
	close(c.ready)
	return nil
}

// Connected reports whether the connection to the broker is up now and
// the broker answers on it: false before Connect, while watermill-amqp
// reconnects, after Close, and while a round trip to the broker has gone
// unanswered for more than probeStall (a network black hole, which the
// heartbeat detects only after three heartbeats). Report it as readiness.
func (c *connection) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.closed && c.conn != nil && c.conn.IsConnected() && c.probe.answering()
}

// wrapper returns the watermill connection, or ErrNotConnected before
// Connect.
func (c *connection) wrapper() (*wamqp.ConnectionWrapper, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return nil, ErrClosed
	case c.conn == nil:
		return nil, ErrNotConnected
	}
	return c.conn, nil
}

// channel opens a channel of its own on the connection; the caller
// closes it.
func (c *connection) channel() (*amqp091.Channel, error) {
	w, err := c.wrapper()
	if err != nil {
		return nil, err
	}
	ch, err := w.Connection().Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	return ch, nil
}

// frameSize returns the frame size negotiated with the broker, 0 when
// there is no connection (then the publish fails on its own).
func (c *connection) frameSize() int {
	w, err := c.wrapper()
	if err != nil {
		return 0
	}
	if conn := w.Connection(); conn != nil {
		return conn.Config.FrameSize
	}
	return 0
}

// framedMarshaler is Marshaler for the publishers of conn. It sets
// PartitionHeader on a message whose payload is a CloudEvent, for the
// consistent-hash exchanges of partitioned consumers. And it refuses,
// with checkFrame's ErrHeadersTooLarge, a message whose publishing does
// not fit in one frame of the connection, before anything of it is sent.
// Sent, it would make RabbitMQ close the connection under every consumer.
type framedMarshaler struct {
	Marshaler
	conn *connection
}

// Marshal returns the publishing of msg, or ErrHeadersTooLarge.
func (m framedMarshaler) Marshal(msg *message.Message) (amqp091.Publishing, error) {
	p, err := m.Marshaler.Marshal(msg)
	if err != nil {
		return p, err
	}
	if key, ok := partitionKeyOf(msg); ok {
		p.Headers[PartitionHeader] = key // the event's, over a stale copy in the metadata
	}
	if err := checkFrame(p, m.conn.frameSize()); err != nil {
		return amqp091.Publishing{}, fmt.Errorf("message %s: %w", msg.UUID, err)
	}
	return p, nil
}

// publisherConfig is the watermill-amqp configuration of the publishers
// on c: watermillConfig's, with framedMarshaler.
func (c *connection) publisherConfig() wamqp.Config {
	cfg := watermillConfig(c.cfg, nil)
	cfg.Marshaler = framedMarshaler{conn: c}
	return cfg
}

// Close closes the connection. Close the publishers and subscribers first.
func (c *connection) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.probe != nil {
		c.probe.stop()
	}
	var err error
	if c.conn != nil {
		if cerr := c.conn.Close(); cerr != nil {
			err = fmt.Errorf("amqp: close: %w", cerr)
		}
	}
	// A reconnection racing watermill-amqp's Close leaves a connection it
	// never closes; and none may follow.
	if cerr := c.brokers.close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("amqp: close: %w", cerr))
	}
	return err
}
