package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/effectively-once/effectively/framework/driver"
)

// ErrNotConfirmed is returned by the wait of PublishDeferred when the
// broker nacked the message, or when the channel closed (the broker went
// away) before its confirm arrived: the broker may or may not hold it.
var ErrNotConfirmed = errors.New("amqp: the broker did not confirm the message")

// confirmChannel is the publisher's channel in confirm mode for publishing
// without waiting for each confirm (PublishDeferred). It is opened on the
// transport's connection when first used, and again on the connection
// watermill-amqp reconnects once the channel closed.
type confirmChannel struct {
	conn *connection
	cfg  wamqp.Config // the events publisher's: exchange and routing key

	mu        sync.Mutex
	ch        *amqp091.Channel
	returns   *returns            // of ch
	exchanges map[string]struct{} // declared on ch
	closed    bool
}

// returns keeps the messages the broker returned on one channel in
// confirm mode, published mandatory and routed to no queue. RabbitMQ sends
// a message's basic.return before its basic.ack, and amqp091-go hands the
// return to the unbuffered channel it listens on before it reads the ack:
// so once a message is acked, its return, if any, was taken by loop, and
// after sync it is in returned.
type returns struct {
	mu       sync.Mutex
	returned map[string]int // message id: returns not yet claimed by their wait
	sync     chan chan struct{}
	done     chan struct{} // closed when the channel closed
}

// listenReturns registers a listener of the returns of ch.
func listenReturns(ch *amqp091.Channel) *returns {
	r := &returns{returned: map[string]int{}, sync: make(chan chan struct{}), done: make(chan struct{})}
	go r.loop(ch.NotifyReturn(make(chan amqp091.Return)))
	return r
}

// loop records each return until the channel closes, and answers syncs
// in between: a sync answered comes after every return loop took before.
func (r *returns) loop(in <-chan amqp091.Return) {
	defer close(r.done)
	for {
		select {
		case ret, ok := <-in:
			if !ok {
				return
			}
			r.mu.Lock()
			r.returned[ret.MessageId]++
			r.mu.Unlock()
		case c := <-r.sync:
			close(c)
		}
	}
}

// wasReturned reports whether the message of id, acked, was returned
// first, and forgets that return.
func (r *returns) wasReturned(id string) bool {
	c := make(chan struct{})
	select {
	case r.sync <- c:
		<-c
	case <-r.done: // loop took every return of the channel
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.returned[id] == 0 {
		return false
	}
	if r.returned[id]--; r.returned[id] == 0 {
		delete(r.returned, id)
	}
	return true
}

func newConfirmChannel(conn *connection) *confirmChannel {
	return &confirmChannel{conn: conn, cfg: conn.publisherConfig()}
}

// channel returns the open channel in confirm mode, opening it when there
// is none or the last one closed. It holds c.mu.
func (c *confirmChannel) channel() (*amqp091.Channel, error) {
	if c.closed {
		return nil, ErrClosed
	}
	if c.ch != nil && !c.ch.IsClosed() {
		return c.ch, nil
	}
	w, err := c.conn.wrapper()
	if err != nil {
		return nil, err
	}
	if !w.IsConnected() {
		return nil, ErrNotConnected
	}
	ch, err := w.Connection().Channel()
	if err != nil {
		return nil, fmt.Errorf("amqp: open confirm channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("amqp: put channel in confirm mode: %w", err)
	}
	c.ch, c.returns, c.exchanges = ch, listenReturns(ch), map[string]struct{}{}
	return ch, nil
}

// publish publishes msg to the exchange topic, mandatory, declaring the
// exchange on the channel's first use of it as watermill-amqp's publisher
// does, and returns the deferred confirm and the returns of its channel.
func (c *confirmChannel) publish(ctx context.Context, topic string, msg *message.Message) (*amqp091.DeferredConfirmation, *returns, error) {
	p, err := c.cfg.Marshaler.Marshal(msg)
	if err != nil {
		return nil, nil, fmt.Errorf("amqp: publish to %s: %w", topic, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, err := c.channel()
	if err != nil {
		return nil, nil, err
	}
	exchange := c.cfg.Exchange.GenerateName(topic)
	if _, ok := c.exchanges[exchange]; !ok && exchange != "" {
		if err := c.declare(exchange); err != nil {
			return nil, nil, err
		}
		c.exchanges[exchange] = struct{}{}
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, c.cfg.Publish.GenerateRoutingKey(topic),
		true, c.cfg.Publish.Immediate, p) // mandatory: an unroutable message is returned
	if err != nil {
		return nil, nil, fmt.Errorf("amqp: publish %s to %s: %w", msg.UUID, topic, err)
	}
	return dc, c.returns, nil
}

// declare declares exchange as watermill-amqp's publisher does, on a
// channel of its own: the broker closes the channel on which a declare
// fails (an exchange of that name of another kind, no permission), and
// on the confirm channel that would end unconfirmed every publish still
// awaiting its confirm, of every topic. A declare the broker refuses so
// is driver.ErrTopicRefused. It holds c.mu.
func (c *confirmChannel) declare(exchange string) error {
	ch, err := c.conn.channel()
	if err != nil {
		return fmt.Errorf("amqp: declare exchange %s: %w", exchange, err)
	}
	defer func() { _ = ch.Close() }()
	if err := c.cfg.TopologyBuilder.ExchangeDeclare(ch, exchange, c.cfg); err != nil {
		var ae *amqp091.Error
		if errors.As(err, &ae) && (ae.Code == amqp091.PreconditionFailed || ae.Code == amqp091.AccessRefused) {
			return fmt.Errorf("amqp: declare exchange %s: %w: %w", exchange, driver.ErrTopicRefused, err)
		}
		return fmt.Errorf("amqp: declare exchange %s: %w", exchange, err)
	}
	return nil
}

// Close closes the channel; the deferred confirms still awaited end
// unconfirmed.
func (c *confirmChannel) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.ch == nil || c.ch.IsClosed() {
		return nil
	}
	if err := c.ch.Close(); err != nil && !errors.Is(err, amqp091.ErrClosed) {
		return fmt.Errorf("amqp: close confirm channel: %w", err)
	}
	return nil
}

// PublishDeferred publishes msg to the exchange topic exactly as Publish
// does (same exchange, headers, content type and persistent delivery
// mode), on a channel in confirm mode, and returns without waiting for the
// broker's confirm: wait waits for it, and returns nil once the broker
// confirmed the message, ErrNotConfirmed when it nacked it or the
// connection went away first, or ctx's error. The message is published
// mandatory: when no queue is bound to the exchange, the broker returns
// it before its confirm and wait returns driver.ErrUnroutable (wrapped),
// where Publish would lose it without a word.
//
// Messages published by one goroutine are published in that order, on one
// channel. Many may await their confirms at once, which is how the outbox
// relay publishes a batch of rows and marks each sent after its confirm.
func (p *publisher) PublishDeferred(ctx context.Context, topic string, msg *message.Message) (wait func(context.Context) error, err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	confirms := p.confirms
	p.mu.Unlock()
	dc, returned, err := confirms.publish(ctx, topic, msg)
	if err != nil {
		return nil, err
	}
	id := msg.UUID
	return func(ctx context.Context) error {
		acked, err := dc.WaitContext(ctx)
		switch {
		case err != nil:
			return fmt.Errorf("amqp: wait for the confirm of %s: %w", id, err)
		case !acked:
			return fmt.Errorf("%w: %s to %s", ErrNotConfirmed, id, topic)
		case returned.wasReturned(messageID(id)):
			return fmt.Errorf("amqp: %s to %s: %w", id, topic, driver.ErrUnroutable)
		}
		return nil
	}, nil
}
