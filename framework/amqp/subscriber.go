package amqp

import (
	"context"
	"fmt"
	"sync"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/nackdelay"
	"github.com/effectively-once/effectively/framework/internal/subscribers"
)

// resubscribePause is the pause before a subscription consumes again
// after its channel or connection was lost. It doubles while the queue
// cannot be consumed (a classic queue whose node is down, a queue another
// connection holds exclusively), up to Config.MaxConnectInterval.
const resubscribePause = 100 * time.Millisecond

// subscriber reads the queue of one consumer. The queue is durable, named
// after the consumer, and bound to the fanout exchange of each topic (event
// type) the consumer handles, one SubscribeInitialize per topic. Every
// Subscribe call, whatever its topic, reads that one queue, and dispatches
// on the CloudEvent type.
//
// Each subscription consumes on a channel of its own with a Qos prefetch
// of prefetch, and hands out up to limit deliveries at once without
// waiting for their acks (watermill-amqp's subscriber hands out one at a
// time): the router handles each in a goroutine of its own. Each delivery
// is settled on the channel it came from once its message is, a burst of
// acks in as few frames as is safe (see acker). A lost channel or connection ends its deliveries (the
// broker requeues them) and the subscription consumes again once the
// connection is back.
//
// A nacked message goes back to the queue after a pause, never at once: it
// would loop hot. The pause is Config.NackDelay plus the time the
// subscription has been nacking since its last ack, up to
// Config.MaxNackDelay (see nackdelay.Streak): a message nacked again and again
// waits twice as long each time, while messages in flight together that
// are nacked together (an event waiting for an earlier one under strict
// order) each wait NackDelay.
type subscriber struct {
	conn      *connection
	queueName wamqp.QueueNameGenerator
	limit     int // deliveries handed out at once by a subscription
	prefetch  int // the Qos prefetch count of a subscription's channel
	// ackHold is how many acks a subscription's acker may hold for a
	// multiple ack (see acker); its prefetch leaves room for them.
	ackHold int
	// hold is how many deliveries a subscription's reader may hold out
	// of its limit (see Hold).
	hold int

	mu      sync.Mutex // guards topo, closed, and wg.Add against Close
	topo    *wamqp.Subscriber
	closed  bool
	closing chan struct{}
	wg      sync.WaitGroup
	// settles says that the reader settles each message itself
	// (driver.SubscribeConfig.Settles): no goroutine watches one.
	settles bool
	// parts are the partitions of a partitioned consumer (see
	// partitionedSubscriber); nil for one that is not partitioned.
	parts *partitions
}

var (
	_ message.Subscriber           = (*subscriber)(nil)
	_ message.SubscribeInitializer = (*subscriber)(nil)
	_ driver.Settler               = (*subscriber)(nil)
	_ driver.Holder                = (*subscriber)(nil)
)

// deliveryKey keys the context value that makes a message's context tell
// its delivery, for Settle.
type deliveryKey struct{}

// Settle settles msg, a message of s, on its channel (see
// driver.Settler), for a reader that settles its messages itself
// (driver.SubscribeConfig.Settles). It ignores a message not of s.
func (s *subscriber) Settle(msg *message.Message, acked bool) {
	if d, ok := msg.Context().Value(deliveryKey{}).(*delivery); ok && d.c.sub.subscriber == s {
		d.Settled(acked)
	}
}

// Hold frees the slot of msg, a message of s handed out and not settled,
// for another delivery, while its subscription holds fewer than
// driver.SubscribeConfig.Hold so (see driver.Holder); its settling then
// frees none.
func (s *subscriber) Hold(msg *message.Message) bool {
	d, ok := msg.Context().Value(deliveryKey{}).(*delivery)
	return ok && d.c.sub.subscriber == s && d.hold()
}

// allowHold lets each subscription's reader hold up to n deliveries out
// of its limit: its channel's prefetch grows by n, so that the broker
// sends the deliveries that take their slots.
func (s *subscriber) allowHold(n int) error {
	if s.prefetch+n > 65535 {
		return fmt.Errorf("amqp: subscriber: a prefetch of %d deliveries and %d held is over 65535", s.prefetch, n)
	}
	s.hold, s.prefetch = n, s.prefetch+n
	if s.parts != nil {
		s.parts.holds = subscribers.NewHolds(n) // before any Subscribe
	}
	return nil
}

// subscriberOf returns the subscriber of consumer on conn, each
// subscription handing out up to limit messages at once, holding up to
// limit acks for a multiple ack (see acker), and buffering conn's
// Prefetch more. It may be built before conn.Connect; its methods return
// ErrNotConnected until then.
func subscriberOf(conn *connection, consumer string, limit int) (*subscriber, error) {
	if consumer == "" {
		return nil, fmt.Errorf("amqp: subscriber: empty consumer name")
	}
	if conn == nil {
		return nil, fmt.Errorf("amqp: subscriber %s: missing connection", consumer)
	}
	s, err := newSubscriber(conn, wamqp.GenerateQueueNameConstant(consumer), limit, 2*limit+conn.cfg.Prefetch)
	if err != nil {
		return nil, err
	}
	s.ackHold = limit
	return s, nil
}

func newSubscriber(conn *connection, queueName wamqp.QueueNameGenerator, limit, prefetch int) (*subscriber, error) {
	switch {
	case conn == nil:
		return nil, fmt.Errorf("amqp: subscriber: missing connection")
	case limit < 1 || prefetch < limit || prefetch > 65535:
		return nil, fmt.Errorf("amqp: subscriber: want 1 <= limit (%d) <= prefetch (%d) <= 65535", limit, prefetch)
	}
	return &subscriber{
		conn:      conn,
		queueName: queueName,
		limit:     limit,
		prefetch:  prefetch,
		closing:   make(chan struct{}),
	}, nil
}

// topology returns the watermill-amqp subscriber that declares the
// exchanges, the queue and their bindings.
func (s *subscriber) topology() (*wamqp.Subscriber, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if s.topo != nil {
		return s.topo, nil
	}
	w, err := s.conn.wrapper()
	if err != nil {
		return nil, err
	}
	topo, err := wamqp.NewSubscriberWithConnection(watermillConfig(s.conn.cfg, s.queueName), s.conn.logger, w)
	if err != nil {
		return nil, fmt.Errorf("amqp: subscriber: %w", err)
	}
	s.topo = topo
	return topo, nil
}

// SubscribeInitialize declares the exchange of topic and the consumer's
// queue, and binds them, so that nothing published to topic from now on is
// dropped. Call it for every topic of the consumer before anything
// publishes.
func (s *subscriber) SubscribeInitialize(topic string) error {
	topo, err := s.topology()
	if err != nil {
		return err
	}
	if err := topo.SubscribeInitialize(topic); err != nil {
		return fmt.Errorf("amqp: bind %s: %w", topic, err)
	}
	return nil
}

// Subscribe declares and binds like SubscribeInitialize, then consumes the
// consumer's queue until ctx ends or the subscriber closes.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := s.SubscribeInitialize(topic); err != nil {
		return nil, fmt.Errorf("amqp: subscribe to %s: %w", topic, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	sub := &subscription{
		subscriber: s,
		topic:      topic,
		queue:      s.queueName(topic),
		out:        make(chan *message.Message),
		slots:      make(chan struct{}, s.limit),
		holds:      subscribers.NewHolds(s.hold),
		reported:   s.settles,
		partition:  -1,
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(sub.out)
		sub.run(ctx)
	}()
	return sub.out, nil
}

// Close stops every subscription: messages in flight go back to the queue.
// The connection stays open.
func (s *subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	topo := s.topo
	s.mu.Unlock()
	s.wg.Wait()
	if topo != nil {
		if err := topo.Close(); err != nil {
			return fmt.Errorf("amqp: close subscriber: %w", err)
		}
	}
	return nil
}

// subscription is one Subscribe call: it consumes the queue on one
// channel at a time.
type subscription struct {
	*subscriber
	topic string
	queue string
	out   chan *message.Message
	slots chan struct{}      // one per message handed out and not yet settled, unless held
	holds *subscribers.Holds // the messages handed out, not settled and held (see Hold)
	nacks nackdelay.Streak   // the pause after a nack
	// reported says that the reader reports each message's outcome
	// (subscriber.Settle): no goroutine watches a message then.
	reported bool
	// partition is the partition whose queue the subscription consumes,
	// -1 when its consumer is not partitioned. Its messages carry it
	// (driver.WithPartition).
	partition int
	// stop, closed when the partition is dropped (Assign), ends the
	// subscription once it handed out what the broker sent before it
	// cancelled the consumer and the reader settled it (see consume).
	// Nil when the consumer is not partitioned.
	stop chan struct{}
	// done is closed once a partition's run returned.
	done chan struct{}
}

// run consumes until ctx ends, the subscriber closes or the partition is
// dropped, again on a new channel each time the channel or the connection
// is lost, after a pause that doubles while the queue cannot be consumed.
func (s *subscription) run(ctx context.Context) {
	pause := resubscribePause
	for first := true; ; first = false {
		w, err := s.conn.wrapper()
		if err != nil {
			return
		}
		consumed := false
		select {
		case <-w.Connected():
			// Declare again: the broker may have lost a queue that was
			// not durable yet, or its bindings. A partition declares its
			// queue before it first consumes too: it may be assigned
			// before the subscription was initialized.
			if !first || s.partition >= 0 {
				if err := s.declare(w.Connection()); err != nil {
					s.conn.cfg.Logger.WarnContext(ctx, "amqp: declare before consuming", "queue", s.queue, "error", err)
				}
			}
			consumed = s.consume(ctx, w.Connection())
		case <-s.closing:
			return
		case <-ctx.Done():
			return
		case <-s.stop:
			return
		}
		if consumed {
			pause = resubscribePause
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-s.closing:
			t.Stop()
			return
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.stop:
			t.Stop()
			return
		}
		if !consumed {
			pause = min(2*pause, max(resubscribePause, s.conn.cfg.MaxConnectInterval))
		}
	}
}

// declare declares the queue the subscription consumes, and its
// bindings.
func (s *subscription) declare(conn *amqp091.Connection) error {
	if s.partition >= 0 {
		return s.parts.declarePartition(conn, s.partition)
	}
	return s.SubscribeInitialize(s.topic)
}

// consume consumes the queue on a new channel of conn until the channel
// closes, ctx ends, the subscriber closes or the partition is dropped,
// and returns once every delivery it handed out is settled or abandoned.
// It reports whether it consumed: false when the queue could not be
// consumed at all.
//
// A dropped partition (stop) cancels its consumer, hands out what the
// broker sent before the cancel, then waits until the reader settled
// every delivery, nacks sent without their pause: from a classic queue
// none goes back unless the reader nacks it, so that the partition's next
// owner sees no redelivery. (A quorum queue of RabbitMQ 3.10 returns what
// it had in flight to the consumer when it was cancelled, up to its
// prefetch: the next owner gets those as redeliveries.)
func (s *subscription) consume(ctx context.Context, conn *amqp091.Connection) bool {
	tag := s.consumerTag()
	ch, deliveries, err := s.open(conn, tag)
	if err != nil {
		s.conn.cfg.Logger.WarnContext(ctx, "amqp: consume", "queue", s.queue, "error", err)
		return false
	}
	closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
	lost := false
	c := &consumption{
		sub: s, ctx: ctx, acks: newAcker(ch, 2*s.limit, s.ackHold),
		dead: make(chan struct{}), live: make(map[*delivery]struct{}),
	}
	ackerDone := make(chan struct{})
	go func() {
		defer close(ackerDone)
		c.acks.run()
	}()
	defer func() {
		if lost {
			close(c.dead)
		}
		c.abandon(lost)
		c.watchers.Wait() // they end with the channel, ctx or the subscriber
		c.inFlight.Wait()
		c.acks.close()
		<-ackerDone
		_ = ch.Close()
	}()
	stop := s.stop     // nil unless a partition's
	cancelled := false // the consumer was cancelled: the channel stays
	// cancelConsumer cancels the consumer once: a dropped partition, or
	// the end of the subscription (see ender).
	cancelConsumer := func() {
		if !cancelled {
			stop, cancelled = nil, s.cancel(ctx, ch, tag)
		}
	}
	e := s.ender(ctx)
	defer e.release()
	for {
		// A delivery, then a slot: the partitions of a consumer share its
		// slots, and one idle would hold a slot while it waits.
		var d amqp091.Delivery
		ok := false
		for received := false; !received; {
			select {
			case d, ok = <-deliveries:
				// Closed: the channel or the connection closed, or the
				// consumer was cancelled.
				received, lost = true, !ok && !cancelled
			case <-stop:
				cancelConsumer()
			case <-e.ending:
				if e.begin(cancelConsumer) {
					return true
				}
			case <-e.over:
				return true
			}
		}
		if !ok {
			if cancelled {
				lost = c.awaitSettled(closed, e)
			}
			return true
		}
		// Until it has a slot the delivery is not the acker's: when the
		// consume ends first, closing the channel requeues it.
		for slot := false; !slot; {
			select {
			case s.slots <- struct{}{}:
				slot = true
			case err := <-closed: // lost while every slot is taken
				lost = true
				_ = err // why is the connection's to report, and it reconnects
				return true
			case <-stop:
				cancelConsumer()
			case <-e.ending:
				if e.begin(cancelConsumer) {
					return true
				}
			case <-e.over:
				return true
			}
		}
		c.acks.add(d.DeliveryTag)
		msg, err := Marshaler{}.Unmarshal(d)
		if err != nil { // Marshaler never fails; kept for its contract
			s.conn.cfg.Logger.ErrorContext(ctx, "amqp: unmarshal", "queue", s.queue, "error", err)
			c.acks.settle(d.DeliveryTag, false)
			<-s.slots
			continue
		}
		switch {
		case d.Redelivered && s.conn.lost.take(s.queue, msg.UUID):
			// The delivery that a lost channel cut short, resumed: the
			// outage is not charged to it (see lostDeliveries).
			msg.Metadata.Set(framework.MetadataRedelivered, "false")
		case d.Redelivered: // as watermill-amqp's subscriber marks it
			msg.Metadata.Set(wamqp.MetadataRedeliveredKey, "true")
		}
		msgCtx, cancel := context.WithCancel(ctx)
		if s.partition >= 0 {
			msgCtx = driver.WithPartition(msgCtx, s.partition)
		}
		hd := c.add(d.DeliveryTag, msg, cancel)
		if s.reported {
			msgCtx = context.WithValue(msgCtx, deliveryKey{}, hd)
		}
		msg.SetContext(msgCtx)
		sent, gone := false, false
		for !sent && !gone {
			select {
			case s.out <- msg:
				sent = true
			case <-e.ending:
				gone = e.begin(cancelConsumer)
			case <-e.over:
				gone = true
			}
		}
		if !sent {
			if hd.claim() {
				c.acks.settle(hd.tag, false)
				hd.finish()
			}
			return true
		}
		if !s.reported {
			c.watchers.Go(hd.watch)
		}
	}
}

// open opens a channel on conn with the subscription's prefetch and
// consumes the queue on it, with the consumer tag tag ("": the client
// makes one up).
func (s *subscription) open(conn *amqp091.Connection, tag string) (*amqp091.Channel, <-chan amqp091.Delivery, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(s.prefetch, 0, false); err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("set prefetch %d: %w", s.prefetch, err)
	}
	deliveries, err := ch.Consume(s.queue, tag, false, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("consume %s: %w", s.queue, err)
	}
	return ch, deliveries, nil
}

// pause waits the pause of a nack (see nackdelay.Streak), or less when the
// subscriber closes, ctx ends or the partition is dropped (its next owner
// takes the message, and its drop waits for the nack). It reports false
// when the channel was lost meanwhile.
func (s *subscription) pause(ctx context.Context, dead <-chan struct{}) bool {
	t := time.NewTimer(s.nacks.Nacked(time.Now(), nackdelay.Backoff{First: s.conn.cfg.NackDelay, Max: s.conn.cfg.MaxNackDelay}))
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.closing:
	case <-ctx.Done():
	case <-s.stop:
	case <-dead:
		return false
	}
	return true
}
