package amqp

import (
	"context"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/effectively-once/effectively/framework/driver"
)

// partitionedSubscriber is the subscriber of a partitioned consumer
// (driver.SubscribeConfig.Partitions above 1), a driver.Assigner: its one
// Subscribe hands out the messages of the partitions it is assigned, each
// carrying its partition (driver.WithPartition), and of no other (see
// partitions for the topology).
//
// Each partition assigned is consumed on a channel of its own, with a Qos
// prefetch of the consumer's concurrency plus Config.Prefetch, as an
// unpartitioned consumer's queue is: one hot partition can fill every slot
// of the consumer's concurrency, which its partitions share, and a
// partition dropped holds at most its prefetch to hand out and settle
// before Assign returns. A partition's channel settles its deliveries and
// ends with it, so that dropping one never touches another's.
type partitionedSubscriber struct {
	*subscriber
}

var (
	_ message.Subscriber           = (*partitionedSubscriber)(nil)
	_ message.SubscribeInitializer = (*partitionedSubscriber)(nil)
	_ driver.Settler               = (*partitionedSubscriber)(nil)
	_ driver.Assigner              = (*partitionedSubscriber)(nil)
)

// partitionedOf returns the subscriber of consumer's n partitions on
// conn, handing out up to limit messages at once.
func partitionedOf(conn *connection, consumer string, limit, n int) (*partitionedSubscriber, error) {
	sub, err := subscriberOf(conn, consumer, limit)
	if err != nil {
		return nil, err
	}
	if sub.parts, err = newPartitions(conn, consumer, n, limit); err != nil {
		return nil, err
	}
	return &partitionedSubscriber{sub}, nil
}

// SubscribeInitialize declares the exchange of topic and the consumer's
// consistent-hash exchange, binds them, and declares the partitions'
// queues bound to it, so that nothing published to topic from now on is
// dropped. It fails with ErrNoConsistentHash on a broker without the
// plugin.
func (s *partitionedSubscriber) SubscribeInitialize(topic string) error {
	if s.isClosed() {
		return ErrClosed
	}
	if err := s.parts.initialize(topic); err != nil {
		return fmt.Errorf("amqp: bind %s to the partitions of %s: %w", topic, s.parts.consumer, err)
	}
	return nil
}

// Subscribe declares like SubscribeInitialize and returns the one channel
// of the messages of the partitions assigned, before or after (Assign).
// It closes once ctx ends or the subscriber closes; a second Subscribe
// fails.
func (s *partitionedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := s.SubscribeInitialize(topic); err != nil {
		return nil, fmt.Errorf("amqp: subscribe to %s: %w", topic, err)
	}
	p := s.parts
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.runCtx != nil {
		return nil, fmt.Errorf("amqp: consumer %s is partitioned: its subscriber is subscribed once, and hands out every partition assigned", p.consumer)
	}
	runCtx, cancel := context.WithCancel(ctx)
	ended := s.spawn(func() {
		select {
		case <-runCtx.Done():
		case <-s.closing:
		}
		cancel()
		p.mu.Lock()
		p.ended = true // no run starts now: running.Wait may begin
		p.mu.Unlock()
		p.running.Wait()
		close(p.out)
	})
	if !ended {
		cancel()
		return nil, ErrClosed
	}
	p.runCtx = runCtx
	for i := range p.assigned {
		s.start(i)
	}
	return p.out, nil
}

// Assign makes the subscriber consume the queues of partitions and of no
// other (see driver.Assigner). It starts consuming those newly assigned
// and drops the others: it cancels their consumers, hands out what the
// broker sent them before, then returns once the reader settled every
// message they handed out, or when ctx ends, with its error. Before
// Subscribe it only records the partitions, for Subscribe to start.
func (s *partitionedSubscriber) Assign(ctx context.Context, partitions []int) error {
	p := s.parts
	want := make(map[int]bool, len(partitions))
	for _, i := range partitions {
		if i < 0 || i >= p.n {
			return fmt.Errorf("amqp: consumer %s: no partition %d: it has %d", p.consumer, i, p.n)
		}
		want[i] = true
	}
	p.assignMu.Lock()
	defer p.assignMu.Unlock()
	p.mu.Lock()
	if p.ended || s.isClosed() {
		p.mu.Unlock()
		return fmt.Errorf("amqp: consumer %s: assign: the subscription ended: %w", p.consumer, ErrClosed)
	}
	var dropped, back []*subscription
	for i, sub := range p.live {
		if !want[i] {
			close(sub.stop)
			delete(p.live, i)
			p.draining[i] = sub
		}
	}
	// Every partition not assigned waits for its drop, one begun by an
	// earlier call too (one whose ctx ended first, called again).
	for i, sub := range p.draining {
		if want[i] {
			if p.live[i] == nil {
				back = append(back, sub)
			}
		} else {
			dropped = append(dropped, sub)
		}
	}
	p.assigned = want
	p.mu.Unlock()
	// A partition assigned again while its drop is under way is consumed
	// once the drop is done: one consumer of a queue per process.
	if err := awaitDone(ctx, back); err != nil {
		return fmt.Errorf("amqp: consumer %s: assign: %w", p.consumer, err)
	}
	p.mu.Lock()
	for i, sub := range p.draining {
		select {
		case <-sub.done:
			delete(p.draining, i)
		default:
		}
	}
	if p.runCtx != nil && !p.ended {
		for i := range want {
			if p.live[i] == nil {
				s.start(i)
			}
		}
	}
	p.mu.Unlock()
	if err := awaitDone(ctx, dropped); err != nil {
		return fmt.Errorf("amqp: consumer %s: assign: drop partitions: %w", p.consumer, err)
	}
	return nil
}

// awaitDone waits until each of subs is done, or ctx ends.
func awaitDone(ctx context.Context, subs []*subscription) error {
	for _, sub := range subs {
		select {
		case <-sub.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// start consumes partition i until it is dropped or the subscription
// ends. It holds s.parts.mu, after Subscribe.
func (s *partitionedSubscriber) start(i int) {
	p := s.parts
	sub := &subscription{
		subscriber: s.subscriber,
		queue:      partitionQueue(p.consumer, i),
		out:        p.out,
		slots:      p.slots,
		holds:      p.holds,
		reported:   s.settles,
		partition:  i,
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
	}
	ctx := p.runCtx
	p.running.Add(1)
	if !s.spawn(func() {
		defer p.running.Done()
		defer close(sub.done)
		sub.run(ctx)
	}) {
		p.running.Done()
		close(sub.done)
		return
	}
	p.live[i] = sub
}

// spawn runs f on a goroutine that Close waits for, unless s is closed.
func (s *subscriber) spawn(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

// isClosed reports whether Close was called.
func (s *subscriber) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// consumerTag returns the consumer tag of a new consumption, which its
// end (a dropped partition, the subscription's end: see ender) cancels:
// it names the partition, if any. It is never empty: the client makes up
// a tag for an empty one, and a cancel of "" then cancels nothing, so
// that the deliveries never close and the end waits all of handBackTime.
func (s *subscription) consumerTag() string {
	if s.partition < 0 {
		return "effectively-" + watermill.NewShortUUID()
	}
	return "effectively-p" + strconv.Itoa(s.partition) + "-" + watermill.NewShortUUID()
}

// cancel cancels the consumer tag on ch, for a dropped partition or the
// end of the subscription (see ender): the broker sends nothing after its
// answer, and what it sent before stays to be read from the deliveries,
// which close after it. It reports false when the channel failed, which
// it closes: its deliveries close then too, and the broker requeues what
// was not settled.
func (s *subscription) cancel(ctx context.Context, ch *amqp091.Channel, tag string) bool {
	if err := ch.Cancel(tag, false); err != nil {
		s.conn.cfg.Logger.WarnContext(ctx, "amqp: cancel the consumer", "queue", s.queue, "error", err)
		_ = ch.Close()
		return false
	}
	return true
}

// awaitSettled waits, once the consumer was cancelled (a dropped
// partition, the end of the subscription: see ender) and its last
// delivery handed out, until the reader settled every delivery the
// consumption handed out, or the consume ends (e). It reports whether
// the channel was lost first.
func (c *consumption) awaitSettled(closed <-chan *amqp091.Error, e *ender) bool {
	settled := make(chan struct{})
	go func() {
		c.inFlight.Wait() // abandon finishes the rest if this returns first
		close(settled)
	}()
	for {
		select {
		case <-settled:
			return false
		case <-closed: //nolint:errcheck // the channel's closing is the news; its error is the channel's to report
			return true
		case <-e.ending:
			if e.begin(nil) {
				return false
			}
		case <-e.over:
			return false
		}
	}
}
