package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/internal/storedmsg"
	"github.com/effectively-once/effectively/framework/internal/subscribers"
	"github.com/effectively-once/effectively/internal/pipeline"
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
// lease) and, on its context, a pipeline.AckInTx that lets the unit of
// work acknowledge it inside the handler's transaction.
type Subscriber struct {
	db     *sqlx.DB
	cfg    SubscriberConfig
	q      pubsubQueries
	schema *pubsubSchemaOnce
	log    *slog.Logger

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
		wantClaim:  true,
		reported:   pipeline.Reported(ctx),
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

// Cleanup deletes, in batches, the messages that every consumer group
// known for their topic has acknowledged, and returns how many it deleted.
// A topic no group is registered for keeps all its messages. The
// Subscriber runs it every CleanupInterval.
func (s *Subscriber) Cleanup(ctx context.Context) (int64, error) {
	type horizon struct {
		topic  string
		offset int64
	}
	rows, err := s.db.QueryContext(ctx, s.q.horizons)
	if err != nil {
		return 0, fmt.Errorf("cleanup: find acked messages: %w", err)
	}
	var hs []horizon
	for rows.Next() {
		var h horizon
		if err := rows.Scan(&h.topic, &h.offset); err != nil {
			_ = rows.Close()
			return 0, fmt.Errorf("cleanup: find acked messages: %w", err)
		}
		hs = append(hs, h)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return 0, fmt.Errorf("cleanup: find acked messages: %w", err)
	}
	var total int64
	for _, h := range hs {
		for {
			res, err := s.db.ExecContext(ctx, s.q.cleanup, h.topic, h.offset, s.cfg.CleanupBatchSize)
			if err != nil {
				return total, fmt.Errorf("cleanup: delete acked messages of %s: %w", h.topic, err)
			}
			n, err := res.RowsAffected()
			if err != nil {
				return total, fmt.Errorf("cleanup: delete acked messages of %s: %w", h.topic, err)
			}
			total += n
			if n < int64(s.cfg.CleanupBatchSize) {
				break
			}
		}
	}
	return total, nil
}

func (s *Subscriber) cleanupLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-s.base.Done():
			return
		case <-t.C:
			n, err := s.Cleanup(s.base)
			switch {
			case err != nil && s.base.Err() == nil:
				s.log.Warn("sqlite pubsub cleanup failed", slog.Any("error", err))
			case n > 0:
				s.log.Debug("sqlite pubsub cleanup", slog.Int64("deleted", n))
			}
		}
	}
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

// pubsubDelivery is one claimed message of a subscription.
type pubsubDelivery struct {
	sub    *pubsubSubscription
	offset int64
	// deliveries is the lease row's count at the claim. Every claim by
	// another subscription increments it, so a renewal that finds it
	// unchanged renews a lease this subscription still holds.
	deliveries int64
	msg        *message.Message
	cancel     context.CancelFunc
	ackedInTx  atomic.Bool
}

// ackInTx acknowledges the message inside the handler's transaction. The
// unit of work calls it just before commit; if the commit fails the
// deletion rolls back with it and the router's Nack releases the lease.
func (d *pubsubDelivery) ackInTx(ctx context.Context, tx pipeline.Execer) error {
	q := d.sub.s.q
	if _, err := tx.ExecContext(ctx, q.ackOne, d.sub.topic, d.sub.s.cfg.ConsumerGroup, d.offset); err != nil {
		return fmt.Errorf("ack message %d of %s: %w", d.offset, d.sub.topic, err)
	}
	d.ackedInTx.Store(true)
	return nil
}

// AckAll acknowledges the messages of acks, deliveries of this
// subscription, inside the transaction of a batch of the unit of work, in
// one statement (pipeline.AckBatch): the batch's lease deletions commit
// with its effects. It reads only what never changes in sub.
func (sub *pubsubSubscription) AckAll(ctx context.Context, tx pipeline.Execer, acks []pipeline.AckInTx) error {
	ds := make([]*pubsubDelivery, len(acks))
	offsets := make([]int64, len(acks))
	for i, a := range acks {
		d, ok := a.Item.(*pubsubDelivery)
		if !ok || d.sub != sub {
			return fmt.Errorf("ack messages of %s: %T is not a message of this subscription", sub.topic, a.Item)
		}
		ds[i], offsets[i] = d, d.offset
	}
	q := sub.s.q
	if _, err := tx.ExecContext(ctx, q.ack, sub.topic, sub.s.cfg.ConsumerGroup, pubsubOffsets(offsets)); err != nil {
		return fmt.Errorf("ack %d messages of %s: %w", len(offsets), sub.topic, err)
	}
	for _, d := range ds {
		d.ackedInTx.Store(true)
	}
	return nil
}

type pubsubResult struct {
	d     *pubsubDelivery
	acked bool
}

// pubsubSubscription is the state of one Subscribe call, owned by its run
// goroutine.
type pubsubSubscription struct {
	s          *Subscriber
	topic      string
	ctx        context.Context
	cancel     context.CancelFunc
	out        chan *message.Message
	results    chan pubsubResult
	wake       <-chan struct{}
	stopListen func()
	log        *slog.Logger

	pending   []*pubsubDelivery            // claimed, not yet handed out
	sent      map[*pubsubDelivery]struct{} // handed out, not yet acked or nacked
	acks      []int64
	nacks     []int64
	wantClaim bool
	// reported says that the reader reports each message's outcome
	// (pipeline.SettleReported): no goroutine watches a message then.
	reported bool
	msgWG    sync.WaitGroup // the goroutines watching messages
}

func (sub *pubsubSubscription) run() {
	defer sub.s.wg.Done()
	defer close(sub.out)
	defer sub.stopListen()
	cfg := sub.s.cfg

	poll := time.NewTicker(cfg.PollInterval)
	defer poll.Stop()
	flush := time.NewTimer(cfg.AckFlushInterval)
	flush.Stop()
	flushArmed, flushFired := false, false
	retry := time.NewTimer(cfg.RetryInterval)
	retry.Stop()
	retrying := false
	nackWake := time.NewTimer(cfg.NackDelay)
	nackWake.Stop()
	renew := time.NewTicker(renewInterval(cfg.LeaseDuration))
	defer renew.Stop()

	// A sync (the write of the buffered acks and nacks and a claim) runs
	// on a goroutine of its own, one at a time, while this loop goes on
	// handing out the messages claimed ahead and taking the results: the
	// sync waits for the file's write lock behind the batches of the
	// messages in flight, and they must not run dry meanwhile. The
	// goroutine outlives the syncs: a sync runs down the SQLite driver's
	// deep stack, which a goroutine started for each sync would grow
	// again from its smallest, a copy at each doubling.
	syncs := make(chan syncDone, 1)
	syncWork := make(chan func() syncDone, 1)
	syncExited := make(chan struct{})
	go func() {
		defer close(syncExited)
		for sync := range syncWork {
			syncs <- sync()
		}
	}()
	defer func() {
		close(syncWork) // no sync runs: the loop waits for one before it returns
		<-syncExited
	}()
	syncing := false
	wakes := 0 // counts the wakes, so that a sync's "nothing due" does not drop a later one
	renewDue := false
	for {
		if sub.ctx.Err() != nil {
			if syncing {
				_ = sub.syncEnded(<-syncs, wakes) // shutdown writes what is left
			}
			sub.shutdown()
			return
		}
		if !retrying && !syncing {
			claimN := sub.claimWanted()
			buffered := len(sub.acks) + len(sub.nacks)
			idle := len(sub.pending) == 0 && len(sub.sent) == 0
			flushNow := buffered > 0 && (buffered >= cfg.ClaimBatchSize || idle || flushFired)
			if flushNow || claimN > 0 {
				acks, nacks, at := sub.acks, sub.nacks, wakes
				sub.acks, sub.nacks = nil, nil
				if flushArmed {
					flush.Stop()
					flushArmed = false
				}
				syncing = true
				syncWork <- func() syncDone { return sub.sync(acks, nacks, claimN, at) }
			}
			flushFired = false // a fire is spent by the sync it started, or with nothing buffered
		}

		var out chan<- *message.Message
		var next *message.Message
		if len(sub.pending) > 0 && len(sub.sent) < cfg.MaxInFlight {
			out, next = sub.out, sub.pending[0].msg
		}
		select {
		case <-sub.ctx.Done():
		case r := <-syncs:
			syncing = false
			if err := sub.syncEnded(r, wakes); err != nil {
				if sub.ctx.Err() != nil {
					continue // shutdown writes what is left
				}
				sub.log.Warn("sqlite pubsub: claim or ack failed, retrying",
					slog.Any("error", err), slog.Duration("retry_in", cfg.RetryInterval))
				retrying = true
				retry.Reset(cfg.RetryInterval)
				flushFired = len(sub.acks)+len(sub.nacks) > 0 // written once the retry is due
			} else if len(r.nacks) > 0 {
				nackWake.Reset(cfg.NackDelay)
			}
			if renewDue {
				renewDue = false
				sub.renew()
			}
		case out <- next:
			d := sub.pending[0]
			sub.pending[0] = nil
			sub.pending = sub.pending[1:]
			sub.sent[d] = struct{}{}
			if !sub.reported {
				sub.msgWG.Go(func() { subscribers.Watch(sub.ctx, d.msg, d) })
			}
		case r := <-sub.results:
			delete(sub.sent, r.d)
			switch {
			case !r.acked:
				sub.nacks = append(sub.nacks, r.d.offset)
			case !r.d.ackedInTx.Load():
				sub.acks = append(sub.acks, r.d.offset)
			}
			if !flushArmed && len(sub.acks)+len(sub.nacks) > 0 {
				flush.Reset(cfg.AckFlushInterval)
				flushArmed = true
			}
		case <-flush.C:
			flushArmed, flushFired = false, true
		case <-retry.C:
			retrying = false
		case <-sub.wake:
			sub.wantClaim = true
			wakes++
		case <-poll.C:
			sub.wantClaim = true
			wakes++
		case <-nackWake.C:
			sub.wantClaim = true
			wakes++
		case <-renew.C:
			if syncing {
				renewDue = true // after the sync: one connection at a time
				continue
			}
			sub.renew()
		}
	}
}

// claimWanted returns how many messages to claim now: a batch once at
// least half a batch of slots is free (or nothing is held), so that claims
// and acks share transactions. The slots are MaxInFlight plus claimAhead:
// the messages claimed ahead wait, leased, for a slot of those in flight,
// so that the slots that acks free are filled at once, not after a claim
// that queues for the write lock behind the batches of the messages in
// flight (the unit of work's batches would run dry meanwhile).
func (sub *pubsubSubscription) claimWanted() int {
	cfg := sub.s.cfg
	if !sub.wantClaim {
		return 0
	}
	held := len(sub.sent) + len(sub.pending)
	free := cfg.MaxInFlight + claimAhead(cfg) - held
	batch := min(cfg.ClaimBatchSize, cfg.MaxInFlight)
	if free <= 0 || (free < max(1, batch/2) && held > 0) {
		return 0
	}
	return min(free, batch)
}

// claimAhead is how many messages a subscription holds claimed beyond its
// MaxInFlight, waiting to be handed out: half a claim batch, none when a
// claim takes one message.
func claimAhead(cfg SubscriberConfig) int {
	return min(cfg.ClaimBatchSize, cfg.MaxInFlight) / 2
}

// renewInterval is how often a subscription renews its leases: a third of
// the lease, so that two renewals may fail or wait before one expires.
func renewInterval(lease time.Duration) time.Duration {
	return max(lease/3, time.Millisecond)
}

// renew renews the leases held, and logs a failure: the next renewal
// tries again.
func (sub *pubsubSubscription) renew() {
	if err := sub.renewLeases(); err != nil && sub.ctx.Err() == nil {
		sub.log.Warn("sqlite pubsub: could not renew the leases of the messages in flight; retrying at the next renewal",
			slog.Any("error", err), slog.Duration("lease", sub.s.cfg.LeaseDuration))
	}
}

// renewLeases extends, in one short write transaction, the leases of the
// messages the subscription holds: handed out and not yet acked or
// nacked, or claimed and waiting to be handed out. A lease is renewed only
// while its deliveries count is the one of this subscription's claim: one
// that expired and was claimed by another subscription (or process) stays
// theirs, and one deleted by an ack stays deleted.
func (sub *pubsubSubscription) renewLeases() error {
	held := make([][2]int64, 0, len(sub.sent)+len(sub.pending))
	for d := range sub.sent {
		held = append(held, [2]int64{d.offset, d.deliveries})
	}
	for _, d := range sub.pending {
		held = append(held, [2]int64{d.offset, d.deliveries})
	}
	if len(held) == 0 {
		return nil
	}
	s := sub.s
	tx, err := s.db.BeginTxx(sub.ctx, nil)
	if err != nil {
		return fmt.Errorf("renew leases: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	until := time.Now().Add(s.cfg.LeaseDuration).UnixMilli()
	if _, err := tx.ExecContext(sub.ctx, s.q.renew, until, sub.topic, s.cfg.ConsumerGroup, pubsubClaims(held)); err != nil {
		return fmt.Errorf("renew leases: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("renew leases: commit: %w", err)
	}
	return nil
}

// Settled cancels the message's context and hands its outcome to the run
// loop (pipeline.Settler). After the subscription ended it drops it: the
// shutdown read the message's state itself.
func (d *pubsubDelivery) Settled(acked bool) {
	d.cancel()
	select {
	case d.sub.results <- pubsubResult{d: d, acked: acked}:
	case <-d.sub.ctx.Done():
	}
}

// syncDone is the outcome of a sync.
type syncDone struct {
	acks, nacks []int64 // written, or, when err is set, still to write
	claimN      int     // how many the sync meant to claim
	claimed     []claimedRow
	drained     bool // nothing more to claim for now
	wakes       int  // the run loop's count of wakes when the sync started
	err         error
	// readErr is a failure to read the new messages of a claim that
	// committed: they are handed out again when their leases end.
	readErr error
}

// sync writes acks and nacks and claims up to claimN messages, in one
// transaction. It runs beside the run loop (see run), so it reads no state
// of the subscription but its configuration; at is the loop's count of
// wakes, handed back.
func (sub *pubsubSubscription) sync(acks, nacks []int64, claimN, at int) syncDone {
	r := syncDone{acks: acks, nacks: nacks, claimN: claimN, wakes: at}
	if len(acks)+len(nacks) == 0 {
		due, err := sub.anyDue()
		if err != nil {
			r.err = err
			return r
		}
		if !due {
			r.drained = true
			return r
		}
	}
	s := sub.s
	tx, err := s.db.BeginTxx(sub.ctx, nil)
	if err != nil {
		r.err = fmt.Errorf("begin: %w", err)
		return r
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	now := time.Now()
	if err := sub.writeResults(sub.ctx, tx, now, acks, nacks, nil, nil); err != nil {
		r.err = err
		return r
	}
	var (
		claimed []claimedRow
		fresh   newRange
	)
	if claimN > 0 {
		claimed, fresh, err = sub.claim(tx, now, claimN)
		if err != nil {
			r.err = err
			return r
		}
	}
	if err := tx.Commit(); err != nil {
		r.err = fmt.Errorf("commit claim: %w", err)
		return r
	}
	r.claimed = claimed
	r.drained = claimN > 0 && len(claimed)+fresh.n < claimN
	if fresh.n > 0 {
		// The new messages claimed are read once the claim committed,
		// without the file's write lock: their leases keep them from
		// the cleanup meanwhile. The read goes on through a shutdown, so
		// that the shutdown hands back their leases with the others not
		// handed out; one that failed to read is handed out again when
		// its lease ends.
		rows, err := s.db.QueryContext(context.WithoutCancel(sub.ctx), s.q.selectNew, sub.topic, fresh.after, fresh.last)
		if err == nil {
			var msgs []claimedRow
			msgs, err = sub.scanMessages(rows, func(int64) int64 { return 1 })
			r.claimed = append(r.claimed, msgs...)
		}
		if err != nil {
			r.readErr = fmt.Errorf("read claimed messages: %w", err)
		}
	}
	return r
}

// newRange is the new messages a claim took: n of them, of the offsets
// after after up to last.
type newRange struct {
	after, last int64
	n           int
}

// syncEnded takes the outcome of a sync into the subscription's state:
// the claimed messages wait to be handed out; the acks and nacks of a sync
// that failed go back to the buffer, before those given since. A sync that
// found nothing more to claim stops the claims until the next wake, unless
// one came while it ran (wakes is the loop's count now). A sync that
// committed but could not read its new messages is taken in, and its
// error returned.
func (sub *pubsubSubscription) syncEnded(r syncDone, wakes int) error {
	if r.err != nil {
		sub.acks = append(r.acks, sub.acks...)
		sub.nacks = append(r.nacks, sub.nacks...)
		return r.err
	}
	// The messages are built after the commit: their metadata's decoding
	// and contexts need not hold the file's write lock.
	for _, row := range r.claimed {
		sub.pending = append(sub.pending, sub.newDelivery(row))
	}
	if r.drained && r.wakes == wakes {
		sub.wantClaim = false
	}
	return r.readErr
}

// anyDue reports, without taking the write lock, whether the group has a
// message to claim on the topic.
func (sub *pubsubSubscription) anyDue() (bool, error) {
	var due bool
	err := sub.s.db.QueryRowxContext(sub.ctx, sub.s.q.anyDue,
		sub.topic, sub.s.cfg.ConsumerGroup, time.Now().UnixMilli()).Scan(&due)
	if err != nil {
		return false, fmt.Errorf("look for messages: %w", err)
	}
	return due, nil
}

// writeResults writes acks (lease deleted), nacks (redelivered after the
// nack delay), releases (redelivered now) and unclaims (never handed out:
// redelivered now, their delivery not counted).
func (sub *pubsubSubscription) writeResults(ctx context.Context, tx *sqlx.Tx, now time.Time, acks, nacks, releases, unclaims []int64) error {
	q, group := sub.s.q, sub.s.cfg.ConsumerGroup
	if len(acks) > 0 {
		if _, err := tx.ExecContext(ctx, q.ack, sub.topic, group, pubsubOffsets(acks)); err != nil {
			return fmt.Errorf("write acks: %w", err)
		}
	}
	if len(nacks) > 0 {
		until := now.Add(sub.s.cfg.NackDelay).UnixMilli()
		if _, err := tx.ExecContext(ctx, q.release, until, sub.topic, group, pubsubOffsets(nacks)); err != nil {
			return fmt.Errorf("write nacks: %w", err)
		}
	}
	if len(releases) > 0 {
		if _, err := tx.ExecContext(ctx, q.release, now.UnixMilli(), sub.topic, group, pubsubOffsets(releases)); err != nil {
			return fmt.Errorf("release leases: %w", err)
		}
	}
	if len(unclaims) > 0 {
		if _, err := tx.ExecContext(ctx, q.unclaim, sub.topic, group, pubsubOffsets(unclaims)); err != nil {
			return fmt.Errorf("release leases: %w", err)
		}
	}
	return nil
}

// claim takes up to n messages in tx: first those whose lease expired or
// whose nack delay passed, read here, then new ones after the group's
// claimed offset, whose range it returns for the caller to read after
// the commit.
func (sub *pubsubSubscription) claim(tx *sqlx.Tx, now time.Time, n int) ([]claimedRow, newRange, error) {
	s, ctx := sub.s, sub.ctx
	q, group := s.q, s.cfg.ConsumerGroup
	until := now.Add(s.cfg.LeaseDuration).UnixMilli()

	// Messages claimed before: nacked, released or with an expired lease.
	rows, err := tx.QueryContext(ctx, q.reclaim, until, sub.topic, group, now.UnixMilli(), n)
	if err != nil {
		return nil, newRange{}, fmt.Errorf("claim messages: %w", err)
	}
	deliveries := make(map[int64]int64)
	var offsets []int64
	for rows.Next() {
		var off, count int64
		if err := rows.Scan(&off, &count); err != nil {
			_ = rows.Close()
			return nil, newRange{}, fmt.Errorf("claim messages: %w", err)
		}
		deliveries[off] = count
		offsets = append(offsets, off)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, newRange{}, fmt.Errorf("claim messages: %w", err)
	}
	var claimed []claimedRow
	if len(offsets) > 0 {
		rows, err := tx.QueryContext(ctx, q.selectByOff, pubsubOffsets(offsets))
		if err != nil {
			return nil, newRange{}, fmt.Errorf("claim messages: %w", err)
		}
		claimed, err = sub.scanMessages(rows, func(off int64) int64 { return deliveries[off] })
		if err != nil {
			return nil, newRange{}, err
		}
		if len(claimed) < len(offsets) {
			// Someone deleted messages under their leases: forget the leases.
			found := make(map[int64]bool, len(claimed))
			for _, r := range claimed {
				found[r.offset] = true
			}
			var gone []int64
			for _, off := range offsets {
				if !found[off] {
					gone = append(gone, off)
				}
			}
			if _, err := tx.ExecContext(ctx, q.ack, sub.topic, group, pubsubOffsets(gone)); err != nil {
				return nil, newRange{}, fmt.Errorf("claim messages: forget leases of deleted messages: %w", err)
			}
		}
	}
	if len(claimed) >= n {
		return claimed, newRange{}, nil
	}

	// New messages.
	var after int64
	err = tx.QueryRowxContext(ctx, q.claimedOffset, sub.topic, group).Scan(&after)
	if errors.Is(err, sql.ErrNoRows) {
		_, err = tx.ExecContext(ctx, q.registerGroup, sub.topic, group, now.UnixMilli())
	}
	if err != nil {
		return nil, newRange{}, fmt.Errorf("claim messages: read claimed offset: %w", err)
	}
	offsets, err = scanOffsets(tx.QueryContext(ctx, q.claimNew, sub.topic, after, n-len(claimed)))
	if err != nil {
		return nil, newRange{}, fmt.Errorf("claim messages: %w", err)
	}
	if len(offsets) == 0 {
		return claimed, newRange{}, nil
	}
	last := offsets[len(offsets)-1]
	if _, err := tx.ExecContext(ctx, q.insertLeases, sub.topic, group, until, pubsubOffsets(offsets)); err != nil {
		return nil, newRange{}, fmt.Errorf("claim messages: insert leases: %w", err)
	}
	if _, err := tx.ExecContext(ctx, q.setClaimed, last, sub.topic, group); err != nil {
		return nil, newRange{}, fmt.Errorf("claim messages: move claimed offset: %w", err)
	}
	return claimed, newRange{after: after, last: last, n: len(offsets)}, nil
}

// scanOffsets reads and closes rows of one offset each.
func scanOffsets(rows *sql.Rows, err error) ([]int64, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var offsets []int64
	for rows.Next() {
		var off int64
		if err := rows.Scan(&off); err != nil {
			return nil, err
		}
		offsets = append(offsets, off)
	}
	return offsets, rows.Err()
}

// claimedRow is a message as a claim read it, to be made a delivery once
// the claim committed.
type claimedRow struct {
	offset     int64
	uuid       string
	payload    []byte
	metadata   []byte
	deliveries int64
}

// scanMessages reads rows of (offset, uuid, payload, metadata);
// deliveriesOf gives the delivery count of each offset.
func (sub *pubsubSubscription) scanMessages(rows *sql.Rows, deliveriesOf func(int64) int64) (rs []claimedRow, err error) {
	defer func() {
		if cerr := rows.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("claim messages: %w", cerr)
		}
	}()
	for rows.Next() {
		var r claimedRow
		if err := rows.Scan(&r.offset, &r.uuid, &r.payload, &r.metadata); err != nil {
			return nil, fmt.Errorf("claim messages: %w", err)
		}
		r.deliveries = deliveriesOf(r.offset)
		rs = append(rs, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim messages: %w", err)
	}
	return rs, nil
}

func (sub *pubsubSubscription) newDelivery(r claimedRow) *pubsubDelivery {
	// Metadata that is not a JSON object of strings (a row inserted by
	// hand) marks the message unreadable, to be dead-lettered.
	msg := storedmsg.Message(r.uuid, r.payload, r.metadata)
	msg.Metadata.Set(framework.MetadataRedelivered, strconv.FormatBool(r.deliveries > 1))
	d := &pubsubDelivery{sub: sub, offset: r.offset, deliveries: r.deliveries, msg: msg}
	ctx, cancel := context.WithCancel(sub.ctx)
	d.cancel = cancel
	if sub.reported {
		ctx = pipeline.With[pipeline.Settler](ctx, d)
	}
	msg.SetContext(pipeline.With(ctx, pipeline.AckInTx{DB: sub.s.db.DB, Ack: d.ackInTx, Batch: sub, Item: d}))
	return d
}

// shutdown ends the subscription: it cancels the message contexts, writes
// the acks and nacks given so far, and releases every message still held
// so that it is delivered again at once (those never handed out without
// counting a delivery).
func (sub *pubsubSubscription) shutdown() {
	sub.cancel()
	sub.msgWG.Wait()
	var releases, unclaims []int64
	for d := range sub.sent {
		select {
		case <-d.msg.Acked():
			if !d.ackedInTx.Load() {
				sub.acks = append(sub.acks, d.offset)
			}
		case <-d.msg.Nacked():
			sub.nacks = append(sub.nacks, d.offset)
		default:
			releases = append(releases, d.offset)
		}
	}
	for _, d := range sub.pending {
		d.cancel()
		unclaims = append(unclaims, d.offset)
	}
	if len(sub.acks)+len(sub.nacks)+len(releases)+len(unclaims) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(sub.ctx), pubsubShutdownTimeout)
	defer cancel()
	err := func() error {
		tx, err := sub.s.db.BeginTxx(ctx, nil)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		defer func() { _ = tx.Rollback() }() // no-op after Commit
		if err := sub.writeResults(ctx, tx, time.Now(), sub.acks, sub.nacks, releases, unclaims); err != nil {
			return err
		}
		return tx.Commit()
	}()
	if err != nil {
		sub.log.Warn("sqlite pubsub: could not write acks or release messages on close; unacked messages come back when their leases expire",
			slog.Any("error", err))
		return
	}
	if len(releases)+len(unclaims) > 0 {
		sub.s.cfg.Notifier.Notify(sub.topic)
	}
}

// pubsubClaims encodes (offset, deliveries) pairs as a JSON array of
// two-element arrays for json_each.
func pubsubClaims(claims [][2]int64) string {
	b := make([]byte, 0, len(claims)*12+2)
	b = append(b, '[')
	for i, c := range claims {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendInt(b, c[0], 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, c[1], 10)
		b = append(b, ']')
	}
	return string(append(b, ']'))
}

// pubsubOffsets encodes offsets as a JSON array for json_each.
func pubsubOffsets(offsets []int64) string {
	b := make([]byte, 0, len(offsets)*8+2)
	b = append(b, '[')
	for i, off := range offsets {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, off, 10)
	}
	return string(append(b, ']'))
}
