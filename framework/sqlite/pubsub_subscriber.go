package sqlite

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/subscribers"
)

// Defaults of SubscriberConfig.
const (
	// DefaultPollInterval is how often an idle subscription looks for
	// nacked messages whose delay passed and expired leases, and for
	// messages published by other processes when WatchInterval is off.
	DefaultPollInterval = time.Second
	// DefaultWatchInterval is how often the watch of a file reads the
	// newest offset of its messages table, to wake the subscriptions as
	// soon as any process inserted a message. A read takes about 7µs; an
	// idle service handled a message that another process inserted in
	// about 7ms (p50) with it, against 9 to 14ms at 20ms, for about 0.02
	// of a core more while idle (bench -run idle/SQLite).
	DefaultWatchInterval = 10 * time.Millisecond
	// DefaultLeaseDuration is how long a claim lasts without a renewal:
	// the subscription renews the leases of the messages it holds every
	// third of it, so a message whose process died comes back within
	// about this long, however long healthy messages take.
	DefaultLeaseDuration = 30 * time.Second
	// DefaultNackDelay is how long a nacked message waits before it is
	// delivered again.
	DefaultNackDelay = time.Second
	// DefaultMaxInFlight is how many messages a subscription hands out and
	// holds not yet acked or nacked.
	DefaultMaxInFlight = 16
	// DefaultAckFlushInterval is the longest an ack or nack waits in the
	// buffer before it is written.
	DefaultAckFlushInterval = 20 * time.Millisecond
	// DefaultRetryInterval is how long a subscription waits after a failed
	// claim or ack write before it tries again.
	DefaultRetryInterval = time.Second
	// DefaultPubSubCleanupInterval is how often a Subscriber deletes the
	// messages that every known consumer group of their topic acked.
	DefaultPubSubCleanupInterval = time.Minute
	// DefaultPubSubCleanupBatchSize is the most messages one cleanup
	// statement deletes.
	DefaultPubSubCleanupBatchSize = 1000
)

// pubsubShutdownTimeout bounds the final write of a subscription that
// stops: its buffered acks and the release of the messages it still holds.
const pubsubShutdownTimeout = 30 * time.Second

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// ConsumerGroup names the group this Subscriber consumes for: each
	// group gets every message of a topic, and the subscriptions of one
	// group (in this or other processes) share its messages. An empty name
	// is a group of its own, the default group. Defaults to empty.
	ConsumerGroup string
	// TablePrefix is put before the name of every table of the Pub/Sub. It
	// must match ^[a-z_][a-z0-9_]*$. Defaults to empty.
	TablePrefix string
	// SkipSchemaInit leaves creating the tables to InitializePubSubSchema
	// or a migration. Defaults to false: SubscribeInitialize and the first
	// Subscribe create them when they are missing.
	SkipSchemaInit bool
	// Notifier, when set, wakes this Subscriber's subscriptions as soon as
	// a Publisher sharing it commits to their topic. Defaults to nil:
	// subscriptions find new messages when they poll.
	Notifier *Notifier
	// PollInterval is how often an idle subscription looks for new
	// messages, nacked messages whose delay passed and expired leases.
	// Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// WatchInterval is how often the watch reads the newest offset of
	// the messages table (one indexed read) and, when it grew, wakes the
	// subscriptions: a message that another process inserted (a foreign
	// INSERT, another process's Publisher) is claimed within about this
	// long instead of at the next poll. The Subscribers sharing a Notifier
	// and a db share one watch, at the interval of the first of them.
	// Negative turns the watch off. Defaults to DefaultWatchInterval.
	WatchInterval time.Duration
	// LeaseDuration is how long a claim lasts without a renewal. The
	// subscription renews the leases of the messages it holds (claimed and
	// not yet acked or nacked) every LeaseDuration/3, in one short write
	// transaction, and stops on the ack, the nack, or Close; a lease that
	// another subscription took over meanwhile is left alone. When a lease
	// expires (its process died, or a renewal waited for the file's write
	// lock longer than two thirds of it), the message is delivered again,
	// marked redelivered. So it bounds how long the messages of a crashed
	// process wait, and must outlast a renewal period plus the wait of a
	// renewal for the write lock (an attempt holds it at most its
	// timeout). Defaults to DefaultLeaseDuration.
	LeaseDuration time.Duration
	// NackDelay is how long a nacked message waits before it is delivered
	// again. Defaults to DefaultNackDelay.
	NackDelay time.Duration
	// MaxInFlight is how many messages one subscription hands out and
	// holds not yet acked or nacked; they are handled concurrently. Beyond
	// them it holds half of ClaimBatchSize claimed ahead, leased, to hand
	// out as soon as a slot frees. Defaults to DefaultMaxInFlight.
	MaxInFlight int
	// ClaimBatchSize is the most messages one claim transaction takes, and
	// the most acks and nacks buffered before they are written. A
	// subscription claims once at least half of it is free. Defaults to
	// MaxInFlight: every claim is a write transaction, serialised with the
	// handlers' on the file, so a subscription fills its free slots in as
	// few of them as it can.
	ClaimBatchSize int
	// AckFlushInterval is the longest an ack or nack waits in the buffer
	// before it is written. Defaults to DefaultAckFlushInterval.
	AckFlushInterval time.Duration
	// RetryInterval is how long a subscription waits after a failed claim
	// or ack write before it tries again. Defaults to DefaultRetryInterval.
	RetryInterval time.Duration
	// CleanupInterval is how often the Subscriber deletes the messages
	// that every consumer group known for their topic acked; negative turns
	// cleanup off. Defaults to DefaultPubSubCleanupInterval.
	CleanupInterval time.Duration
	// CleanupBatchSize is the most messages one cleanup statement deletes.
	// Defaults to DefaultPubSubCleanupBatchSize.
	CleanupBatchSize int
	// Logger receives the subscriber's logs. Defaults to nil: quiet.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c SubscriberConfig) WithDefaults() SubscriberConfig {
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.WatchInterval = cmp.Or(c.WatchInterval, DefaultWatchInterval)
	c.LeaseDuration = cmp.Or(c.LeaseDuration, DefaultLeaseDuration)
	c.NackDelay = cmp.Or(c.NackDelay, DefaultNackDelay)
	c.AckFlushInterval = cmp.Or(c.AckFlushInterval, DefaultAckFlushInterval)
	c.RetryInterval = cmp.Or(c.RetryInterval, DefaultRetryInterval)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, DefaultPubSubCleanupInterval)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, DefaultMaxInFlight)
	c.ClaimBatchSize = cmp.Or(c.ClaimBatchSize, c.MaxInFlight)
	c.CleanupBatchSize = cmp.Or(c.CleanupBatchSize, DefaultPubSubCleanupBatchSize)
	c.Logger = pubsubLogger(c.Logger)
	return c
}

// Validate reports the first invalid field of c.
func (c SubscriberConfig) Validate() error {
	if err := validatePubSubPrefix("SubscriberConfig", c.TablePrefix); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"PollInterval", c.PollInterval},
		{"LeaseDuration", c.LeaseDuration},
		{"NackDelay", c.NackDelay},
		{"AckFlushInterval", c.AckFlushInterval},
		{"RetryInterval", c.RetryInterval},
	} {
		if f.d <= 0 {
			return fmt.Errorf("sqlite: SubscriberConfig.%s must be positive, got %s", f.name, f.d)
		}
	}
	for _, f := range []struct {
		name string
		n    int
	}{
		{"MaxInFlight", c.MaxInFlight},
		{"ClaimBatchSize", c.ClaimBatchSize},
		{"CleanupBatchSize", c.CleanupBatchSize},
	} {
		if f.n < 1 {
			return fmt.Errorf("sqlite: SubscriberConfig.%s must be at least 1, got %d", f.name, f.n)
		}
	}
	return nil
}

// Subscriber consumes the messages of a SQLite file for one consumer
// group. Each Subscribe call is a subscription that claims messages in
// batches, with a lease per message, and hands them out to be handled
// concurrently (up to MaxInFlight); acks and nacks are buffered and written
// together. No transaction stays open while a message is handled.
//
// A delivered message carries framework.MetadataRedelivered ("false" on
// its first delivery to the group, "true" after a nack or an expired
// lease). It is a driver.TxAcker: the consumer chain given it
// (middleware.Config.Acker) acknowledges each message inside the
// handler's transaction. And a driver.Settler: a reader that settles
// its messages itself tells it each outcome (Transport.Subscribe with
// driver.SubscribeConfig.Settles); otherwise a goroutine watches each
// message handed out for its Ack or Nack.
type Subscriber struct {
	db     *sqlx.DB
	cfg    SubscriberConfig
	q      pubsubQueries
	schema *pubsubSchemaOnce
	log    *slog.Logger
	// settles says that the reader settles each message itself
	// (driver.SubscribeConfig.Settles): no goroutine watches one.
	settles bool
	// hold is how many messages a subscription's reader may hold out of
	// MaxInFlight (driver.SubscribeConfig.Hold, see Hold).
	hold int

	base       context.Context // cancelled by Close
	cancelBase context.CancelFunc
	mu         sync.Mutex // guards closed and wg.Add
	closed     bool
	wg         sync.WaitGroup
	closeOnce  sync.Once
	cleanOnce  sync.Once
	watchOnce  sync.Once
	leaveWatch func() // guarded by mu
	// notifier is cfg.Notifier, or one of the Subscriber's own: it wakes
	// the subscriptions, and runs the watch.
	notifier *Notifier
}

var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
	_ driver.TxAcker               = (*Subscriber)(nil)
	_ driver.Settler               = (*Subscriber)(nil)
	_ driver.Holder                = (*Subscriber)(nil)
)

// NewSubscriber returns a Subscriber that reads db, which should come from
// Open (WAL, busy timeout, BEGIN IMMEDIATE).
func NewSubscriber(db *sqlx.DB, cfg SubscriberConfig) (*Subscriber, error) {
	if db == nil {
		return nil, ErrMissingDB
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	notifier := cfg.Notifier
	if notifier == nil {
		notifier = NewNotifier()
	}
	base, cancel := context.WithCancel(context.Background())
	return &Subscriber{
		db:         db,
		cfg:        cfg,
		q:          newPubSubQueries(cfg.TablePrefix),
		schema:     newPubSubSchemaOnce(cfg.SkipSchemaInit),
		log:        cfg.Logger.With(slog.String("consumer_group", cfg.ConsumerGroup)),
		base:       base,
		cancelBase: cancel,
		notifier:   notifier,
	}, nil
}

// SubscribeInitialize creates the tables when they are missing (unless
// SkipSchemaInit) and registers the consumer group for topic, so that the
// group keeps every message published from now on even before it first
// subscribes, and cleanup waits for it.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if topic == "" {
		return ErrEmptyTopic
	}
	return s.initialize(s.base, topic)
}

func (s *Subscriber) initialize(ctx context.Context, topic string) error {
	if err := s.schema.ensure(ctx, s.db, s.q); err != nil {
		return err
	}
	var known bool
	err := s.db.QueryRowxContext(ctx, s.q.groupKnown, topic, s.cfg.ConsumerGroup).Scan(&known)
	if err != nil {
		return fmt.Errorf("register consumer group for %s: %w", topic, err)
	}
	if known {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, s.q.registerGroup, topic, s.cfg.ConsumerGroup, time.Now().UnixMilli()); err != nil {
		return fmt.Errorf("register consumer group for %s: %w", topic, err)
	}
	return nil
}

// Subscribe starts a subscription of topic for the Subscriber's consumer
// group. The channel closes when ctx ends or the Subscriber closes; the
// context of each message is cancelled then too, and after its Ack or
// Nack.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == "" {
		return nil, ErrEmptyTopic
	}
	if s.base.Err() != nil {
		return nil, ErrSubscriberClosed
	}
	initCtx, stop := mergeDone(ctx, s.base)
	err := s.initialize(initCtx, topic)
	stop()
	if err != nil {
		if s.base.Err() != nil {
			return nil, ErrSubscriberClosed
		}
		return nil, fmt.Errorf("subscribe to %s: %w", topic, err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrSubscriberClosed
	}
	subCtx, cancel := mergeDone(ctx, s.base)
	wake, stopListen := s.notifier.listen(topic)
	sub := &pubsubSubscription{
		s:          s,
		topic:      topic,
		ctx:        subCtx,
		cancel:     cancel,
		out:        make(chan *message.Message),
		results:    make(chan pubsubResult),
		wake:       wake,
		stopListen: stopListen,
		sent:       make(map[*pubsubDelivery]struct{}),
		holds:      subscribers.NewHolds(s.hold),
		wantClaim:  true,
		reported:   s.settles,
		log:        s.log.With(slog.String("topic", topic)),
	}
	s.wg.Add(1)
	go sub.run()
	s.cleanOnce.Do(func() {
		if s.cfg.CleanupInterval > 0 {
			s.wg.Add(1)
			go s.cleanupLoop()
		}
	})
	s.watchOnce.Do(func() {
		if s.cfg.WatchInterval > 0 {
			s.leaveWatch = s.notifier.watch(s.db, s.q.newestOffset, s.cfg.WatchInterval, s.log)
		}
	})
	return sub.out, nil
}

// Close stops every subscription: message contexts are cancelled, acks
// already given are written, and the messages still held are released for
// redelivery. It waits for all goroutines of the Subscriber and is
// idempotent.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.cancelBase()
		leave := s.leaveWatch
		s.mu.Unlock()
		s.wg.Wait()
		if leave != nil {
			leave()
		}
	})
	return nil
}

// mergeDone returns a context with the values of ctx that is done when ctx
// or other is done.
func mergeDone(ctx, other context.Context) (context.Context, context.CancelFunc) {
	merged, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(other, cancel)
	return merged, func() {
		stop()
		cancel()
	}
}
