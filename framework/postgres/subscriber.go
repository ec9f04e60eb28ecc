package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/subscribers"
	"github.com/effectively-once/effectively/internal/bound"
)

// The subscriber reads watermill-sql's tables as watermill-sql's own
// subscriber does (rows whose transaction is older than every transaction
// still running, in (transaction_id, offset) order, after the group's row
// in the offsets table), but hands out up to its concurrency of messages
// at once and holds no transaction while they are handled. Each
// subscription has a connection of its own, on which it holds a session
// advisory lock per (offsets table, consumer group): the one subscription
// holding it reads and acknowledges, the others (other processes) stand
// by and try again every PollInterval. The lock ends with the connection,
// so a process that dies hands over at once. A partitioned consumer's
// subscription holds such a lock per partition assigned (each partition
// is a group of its own: see partitionGroup), all on its one connection,
// and reads them all in one statement (partitionQueries).
//
// The active subscription also LISTENs on its connection: a trigger on the
// messages table notifies after every INSERT statement, whoever runs it,
// and an idle subscription reads at once when notified. The poll stays:
// it finds what a lost notification or a missing trigger leaves behind.
//
// Each delivery says whether it may be a redelivery
// (framework.MetadataRedelivered), so that the delivery guard counts only
// those. For that the group's row in the offsets table has two columns of
// ours beside watermill-sql's (handedOutColumns): the highest position
// handed out. The statement that reads rows writes it, in its own
// transaction, before a row is handed out, so a crash never makes a row
// that was handed out look new: after a takeover, the rows up to it are
// redeliveries, the rows after it first deliveries.

const (
	// ackFlushInterval is the longest the group's acknowledged position
	// waits in memory before it is written, while messages are in flight.
	ackFlushInterval = 20 * time.Millisecond
	// retryInterval is the pause after a failed query before the
	// subscription connects again.
	retryInterval = time.Second
	// queryTimeout bounds each statement on a subscription's connection,
	// at first: one whose request or answer was lost on its way (a
	// middlebox that dropped the connection's state, a proxy) waits for
	// nothing, and the subscription gives it up, and its lock with it,
	// that soon. Each statement cut short doubles the next one's bound,
	// up to maxQueryTimeout, so that a statement slow on its own (a read
	// of large rows from a loaded server) is not cut short for ever; a
	// step that completes sets it back.
	queryTimeout = bound.First
	// maxQueryTimeout is the most a statement on a subscription's
	// connection is given (see queryTimeout).
	maxQueryTimeout = time.Minute
	// cleanupTimeout bounds the statements that undo what a failed
	// statement left: a lock's release, a half-built index's drop.
	cleanupTimeout = 10 * time.Second
	// triggerLockTimeout bounds the wait for the messages table's lock when
	// the notify trigger is created (a long transaction that inserts holds
	// it off); without the trigger, subscriptions poll.
	triggerLockTimeout = 5 * time.Second
	// notifyRetryMin is the first pause before reading again after a
	// notified read found nothing: the notifying transaction is committed,
	// but its rows are read only once every older transaction has ended.
	// The pause doubles up to PollInterval.
	notifyRetryMin = time.Millisecond
	// notifyTrigger names the trigger and the function it runs.
	notifyTrigger = "effectively_notify"
	// handedOutLock names the advisory lock under which the handed-out
	// columns are added to an offsets table.
	handedOutLock = "effectively_handed_out"
)

// errClosed is returned by Subscribe after Close.
var errClosed = errors.New("postgres: subscriber closed")

// subscriber is the subscriber of one consumer group on watermill-sql's
// PostgreSQL tables: each Subscribe call is a subscription that hands out
// up to concurrency messages at once.
type subscriber struct {
	db          *sqlx.DB
	group       string
	concurrency int
	// hold is how many messages a subscription's reader may hold out of
	// its concurrency (driver.SubscribeConfig.Hold, see Hold).
	hold int
	cfg  TransportConfig
	log  *slog.Logger

	base      context.Context // cancelled by Close
	cancel    context.CancelFunc
	mu        sync.Mutex // guards closed, noTrigger, noMarks, noIndex, assigned, running and wg.Add
	closed    bool
	noTrigger map[string]bool // topics whose trigger could not be created
	noMarks   map[string]bool // topics whose handed-out columns could not be added
	noIndex   map[string]bool // topics whose partitions' index could not be created
	wg        sync.WaitGroup
	closeOnce sync.Once
	// settles says that the reader settles each message itself
	// (driver.SubscribeConfig.Settles): no goroutine watches one.
	settles bool
	// partitions is driver.SubscribeConfig.Partitions: above 1, the
	// subscriptions read the partitions assigned (see partitioned).
	partitions int
	assignMu   sync.Mutex // serializes Assign
	assigned   []int      // the partitions assigned, sorted
	running    map[*subscription]struct{}
}

var (
	_ message.Subscriber           = (*subscriber)(nil)
	_ message.SubscribeInitializer = (*subscriber)(nil)
	_ driver.Settler               = (*subscriber)(nil)
	_ driver.Holder                = (*subscriber)(nil)
)

// newSubscriber returns the subscriber of consumer, whose name is its
// consumer group in every topic, handing out up to concurrency messages
// of each topic at once. Each subscription holds one connection of db for
// as long as it runs: give db a pool of its own, with a connection per
// subscription and one to spare for SubscribeInitialize.
func newSubscriber(db *sqlx.DB, consumer string, concurrency int, cfg TransportConfig) (*subscriber, error) {
	if db == nil {
		return nil, errors.New("postgres: subscriber: missing database (open a pool of its own with postgres.Open)")
	}
	if consumer == "" {
		return nil, errors.New("postgres: subscriber: empty consumer name")
	}
	if concurrency < 1 {
		return nil, fmt.Errorf("postgres: subscriber of %s: concurrency must be at least 1, got %d", consumer, concurrency)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	base, cancel := context.WithCancel(context.Background())
	return &subscriber{
		db:          db,
		group:       consumer,
		concurrency: concurrency,
		cfg:         cfg,
		log:         cfg.Logger.With(slog.String("consumer_group", consumer)),
		base:        base,
		cancel:      cancel,
		noTrigger:   make(map[string]bool),
		noMarks:     make(map[string]bool),
		noIndex:     make(map[string]bool),
		partitions:  1,
		running:     make(map[*subscription]struct{}),
	}, nil
}

// Subscribe initializes topic and starts a subscription of it for the
// group. The channel closes when ctx ends or the subscriber closes; the
// context of each message is cancelled then too, and after its Ack or
// Nack.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == "" {
		return nil, errors.New("postgres: subscribe: empty topic")
	}
	subCtx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.base, cancel)
	if err := s.initialize(subCtx, topic); err != nil {
		stop()
		cancel()
		if s.base.Err() != nil {
			return nil, errClosed
		}
		return nil, fmt.Errorf("postgres: subscribe to %s: %w", topic, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		stop()
		cancel()
		return nil, errClosed
	}
	marking := !s.noMarks[topic]
	q := newSubscriptionQueries(s.cfg, topic, marking)
	streams := []*stream{{group: s.group}}
	if s.partitioned() {
		q, streams = partitionQueries(s.cfg, topic, s.partitions), nil
		for _, p := range s.assigned {
			streams = append(streams, &stream{part: p, group: partitionGroup(s.group, p, s.partitions)})
		}
	}
	sub := &subscription{
		s:        s,
		topic:    topic,
		q:        q,
		bound:    bound.New(queryTimeout, maxQueryTimeout),
		marking:  marking,
		streams:  streams,
		assign:   make(chan assignment),
		finished: make(chan struct{}),
		ctx:      subCtx,
		cancel:   func() { stop(); cancel() },
		out:      make(chan *message.Message),
		results:  make(chan result),
		sent:     make(map[*delivery]struct{}, s.concurrency),
		holds:    subscribers.NewHolds(s.hold),
		log:      s.log.With(slog.String("topic", topic)),

		reported: s.settles,
	}
	s.running[sub] = struct{}{}
	s.wg.Add(1)
	go sub.run()
	return sub.out, nil
}

// forget removes sub, which ended, from the running subscriptions.
func (s *subscriber) forget(sub *subscription) {
	s.mu.Lock()
	delete(s.running, sub)
	s.mu.Unlock()
}

// partitioned reports whether the subscriber reads partitions.
func (s *subscriber) partitioned() bool { return s.partitions > 1 }

// Close stops every subscription: message contexts are cancelled, the
// acknowledgements given so far are written, and the locks released. It
// waits for the subscriptions and is idempotent.
func (s *subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.cancel()
		s.mu.Unlock()
		s.wg.Wait()
	})
	return nil
}
