package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// amqpSink receives what the run publishes, from a queue of its own
// bound to the run's exchange, and keeps when each message first
// arrived.
type amqpSink struct {
	conn  *amqp091.Connection
	ch    *amqp091.Channel
	queue string
	tag   string
	done  chan struct{}

	mu      sync.Mutex
	first   map[string]time.Time
	total   int
	changed time.Time
	// awaited holds the ids wait waits for that have not arrived yet, so
	// that neither wait nor receive looks at every id each time.
	awaited map[string]struct{}
}

// newAMQPSink declares the exchange typ (as the publishers declare it:
// durable fanout) and an exclusive queue bound to it, and consumes it.
// The exchange is deleted after the run; the queue goes with the
// connection.
func newAMQPSink(ctx context.Context, env *Env, typ string) (*amqpSink, error) {
	conn, err := amqp091.Dial(env.AMQPURL)
	if err != nil {
		return nil, fmt.Errorf("dial RabbitMQ: %w", err)
	}
	s := &amqpSink{conn: conn, tag: "sink-" + randomHex(4), done: make(chan struct{}), first: make(map[string]time.Time), changed: time.Now()}
	env.Cleanup(func(context.Context) error {
		var errs []error
		if ch, err := conn.Channel(); err == nil {
			errs = append(errs, ch.ExchangeDelete(typ, false, false))
		}
		return errors.Join(append(errs, conn.Close())...)
	})
	if s.ch, err = conn.Channel(); err != nil {
		return nil, fmt.Errorf("channel: %w", err)
	}
	if err := s.ch.ExchangeDeclare(typ, "fanout", true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("declare exchange: %w", err)
	}
	q, err := s.ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return nil, fmt.Errorf("declare queue: %w", err)
	}
	s.queue = q.Name
	if err := s.ch.QueueBind(q.Name, "", typ, false, nil); err != nil {
		return nil, fmt.Errorf("bind queue: %w", err)
	}
	deliveries, err := s.ch.ConsumeWithContext(ctx, q.Name, s.tag, true, true, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	go s.receive(deliveries)
	return s, nil
}

func (s *amqpSink) receive(deliveries <-chan amqp091.Delivery) {
	defer close(s.done)
	for d := range deliveries {
		now := time.Now()
		id := deliveryID(d)
		s.mu.Lock()
		s.total++
		if _, ok := s.first[id]; !ok {
			s.first[id] = now
			delete(s.awaited, id)
		}
		s.changed = now
		s.mu.Unlock()
	}
}

// deliveryID is the event id of d: the message UUID that both publishers
// write in watermill's header (the relay's is the event's id); a message
// without one counts under no id. The sink shares the machine's cores
// with what it measures: decoding each body for its id cost it about
// 15 µs of CPU a message.
func deliveryID(d amqp091.Delivery) string {
	id, _ := d.Headers[wamqp.DefaultMessageUUIDHeaderKey].(string)
	return id
}

// received returns when the message id first arrived.
func (s *amqpSink) received(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.first[id]
	return at, ok
}

// wait waits until every one of msgs arrived, failing when p exits or
// nothing arrives for Options.StallTimeout.
func (s *amqpSink) wait(ctx context.Context, env *Env, p *Process, msgs []Message) error {
	// The ids still missing are counted once here, then kept by receive:
	// the sink shares the machine's cores with what it measures, and
	// looking up every id at each poll cost a third of a core at 100,000.
	s.mu.Lock()
	s.awaited = make(map[string]struct{}, len(msgs))
	for _, m := range msgs {
		if _, ok := s.first[m.ID]; !ok {
			s.awaited[m.ID] = struct{}{}
		}
	}
	s.mu.Unlock()
	for {
		s.mu.Lock()
		missing := len(s.awaited)
		changed := s.changed
		s.mu.Unlock()
		if missing == 0 {
			return nil
		}
		if time.Since(changed) > env.StallTimeout {
			return fmt.Errorf("stalled with %d of %d messages missing for %s", missing, len(msgs), env.StallTimeout)
		}
		if err := p.Exited(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// span is the time from the first arrival of msgs to the last.
func (s *amqpSink) span(msgs []Message) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var first, last time.Time
	for _, m := range msgs {
		at := s.first[m.ID]
		if first.IsZero() || at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	return last.Sub(first)
}

// count stops consuming once the queue is empty and returns how many
// messages of the run (ids starting with prefix) arrived, and of how many
// distinct events.
func (s *amqpSink) count(ctx context.Context, prefix string) (total, distinct int, err error) {
	for {
		q, err := s.ch.QueueDeclarePassive(s.queue, false, true, true, false, nil)
		if err == nil && q.Messages == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := s.ch.Cancel(s.tag, false); err != nil {
		return 0, 0, fmt.Errorf("stop consuming: %w", err)
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.first {
		if len(id) > len(prefix) && id[:len(prefix)+1] == prefix+"-" {
			distinct++
		}
	}
	return s.total, distinct, nil
}
