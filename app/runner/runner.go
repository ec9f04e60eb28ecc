package runner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectively-once/effectively/app/internal/purge"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/internal/keypath"
	"github.com/effectively-once/effectively/internal/watermilllog"
	"github.com/effectively-once/effectively/internal/workers"
	"github.com/effectively-once/effectively/middleware"
)

// ConsumerConfig is one consumer and how the runner handles its messages.
// Zero settings take their defaults (see middleware.Settings.WithDefaults).
type ConsumerConfig struct {
	// Consumer is the consumer (see framework.NewConsumer). Required.
	Consumer *framework.Consumer
	// Settings are the consumer's settings: retries, time limits,
	// concurrency, ordering, batches, breaker (see middleware.Settings),
	// the same type as a consumer's entry in the application's YAML file.
	middleware.Settings
	// RenamedFrom are the consumer's former names, whose processed marks
	// it adopts at Start.
	RenamedFrom []string
	// WithoutDedup, when not empty, is why the consumer takes no
	// processed marks (handlers.WithoutDedup): every delivery runs its
	// handler (framework.UnitOfWorkConfig.WithoutMark).
	WithoutDedup string
}

// WithDefaults returns a copy of c with zero settings set to their
// defaults (see middleware.Settings.WithDefaults).
func (c ConsumerConfig) WithDefaults() ConsumerConfig {
	c.Settings = c.Settings.WithDefaults()
	return c
}

// unitOfWork is the configuration of the consumer's unit of work on db.
func (c ConsumerConfig) unitOfWork(db *sqlx.DB, store framework.Store) framework.UnitOfWorkConfig {
	return framework.UnitOfWorkConfig{
		DB: db, Store: store, BatchSize: c.BatchSize, Batches: c.Batches, Linger: c.BatchLinger,
		WithoutMark: c.WithoutDedup != "",
	}
}

// Validate reports a missing Consumer, else every invalid setting (see
// middleware.Settings.Validate), named ConsumerConfig.Settings.<key>.
func (c ConsumerConfig) Validate() error {
	if c.Consumer == nil {
		return errors.New("ConsumerConfig.Consumer: required (build it with framework.NewConsumer)")
	}
	return keypath.Prefix("ConsumerConfig.Settings", c.Settings.Validate())
}

// The defaults of Config's service-level fields.
const (
	// DefaultPurgeInterval is how often the runner purges (see
	// Config.PurgeInterval).
	DefaultPurgeInterval = 10 * time.Minute
	// MinProcessedRetention is the shortest Config.ProcessedRetention
	// allowed: a processed mark must outlive any redelivery of its
	// message.
	MinProcessedRetention = time.Hour
	// DefaultOutboxRetention is how long sent outbox rows are kept.
	DefaultOutboxRetention = 24 * time.Hour
	// DefaultReplayRetention is how long sent replays are kept.
	DefaultReplayRetention = 7 * 24 * time.Hour
	// DefaultDeadLetterRetention is how long resolved (replayed or
	// discarded) dead letters are kept.
	DefaultDeadLetterRetention = 30 * 24 * time.Hour
)

// Config is what New takes: the consumers, the transport they consume
// from and the database they take effect in, and the service's settings
// of the outbox relay, the purge and the gauges.
type Config struct {
	// Consumers are the consumers to run, each with its settings.
	Consumers []ConsumerConfig
	// Transport delivers the consumers' messages. The runner subscribes
	// through it but never closes it. Required.
	Transport framework.Transport
	// DB is the database of the handlers' transactions. Required.
	DB *sqlx.DB
	// Store is the consumers' store in DB. Required.
	Store framework.Store
	// Logger logs the router and the messages. Defaults to a logger that
	// discards.
	Logger *slog.Logger
	// Metrics, when set, counts the messages (see middleware.NewMetrics).
	Metrics *middleware.Metrics
	// Tracer, when set, traces the messages.
	Tracer trace.Tracer
	// Outer middleware runs once per delivery, outside the retries and
	// the transaction (see middleware.Config). A consumer's RateLimit
	// waits before it.
	Outer []message.HandlerMiddleware
	// Inner middleware runs inside each attempt, in its transaction.
	Inner []message.HandlerMiddleware

	// OutboxRelay is the relay of the service's outbox: when its Outbox
	// is set, the runner runs it from Start to Stop, publishing through
	// Transport's publisher (see outbox.RelayConfig; its TablePrefix must
	// be the outbox's). Its Logger and Tracer default to the runner's.
	// While the runner purges, the purge deletes the sent rows (see
	// OutboxRetention) and the relay's own cleanup is off. Defaults to no
	// relay.
	OutboxRelay outbox.RelayConfig
	// PurgeInterval is how often the runner deletes what is past its
	// retention (the delivery counts of messages that finished, and the
	// rows older than the retentions below), one process of the service
	// at a time; the first purge is at Start. A negative interval turns
	// the purge off, and so does a Store that does not implement
	// framework.Purger. Defaults to DefaultPurgeInterval.
	PurgeInterval time.Duration
	// ProcessedRetention is how long processed marks are kept; at least
	// MinProcessedRetention. Zero keeps them for ever.
	ProcessedRetention time.Duration
	// OutboxRetention is how long sent outbox rows are kept. Defaults to
	// DefaultOutboxRetention.
	OutboxRetention time.Duration
	// ReplayRetention is how long sent replays are kept. Defaults to
	// DefaultReplayRetention.
	ReplayRetention time.Duration
	// DeadLetterRetention is how long replayed or discarded dead letters
	// are kept, with their history; pending ones are never purged.
	// Defaults to DefaultDeadLetterRetention.
	DeadLetterRetention time.Duration
	// Registerer, when set, is where New registers the gauges read from
	// the database on scrape, when the Store implements framework.Gauges:
	// effectively_dead_letters_pending{consumer,code} and
	// effectively_parked_events{consumer}. Stop unregisters them.
	Registerer prometheus.Registerer
}

// WithDefaults returns a copy of c with zero fields set to their defaults,
// the consumers' included.
func (c Config) WithDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	consumers := make([]ConsumerConfig, len(c.Consumers))
	for i, cc := range c.Consumers {
		consumers[i] = cc.WithDefaults()
	}
	c.Consumers = consumers
	c.PurgeInterval = cmp.Or(c.PurgeInterval, DefaultPurgeInterval)
	c.OutboxRetention = cmp.Or(c.OutboxRetention, DefaultOutboxRetention)
	c.ReplayRetention = cmp.Or(c.ReplayRetention, DefaultReplayRetention)
	c.DeadLetterRetention = cmp.Or(c.DeadLetterRetention, DefaultDeadLetterRetention)
	return c
}

// Validate reports the first invalid field of c.
func (c Config) Validate() error {
	switch {
	case c.Transport == nil:
		return errors.New("Config.Transport: required")
	case c.DB == nil:
		return errors.New("Config.DB: required")
	case c.Store == nil:
		return errors.New("Config.Store: required")
	case c.ProcessedRetention < 0 || c.ProcessedRetention > 0 && c.ProcessedRetention < MinProcessedRetention:
		return fmt.Errorf("Config.ProcessedRetention: must be zero (kept for ever) or at least %s, got %s", MinProcessedRetention, c.ProcessedRetention)
	case c.OutboxRetention < 0:
		return fmt.Errorf("Config.OutboxRetention: must not be negative, got %s", c.OutboxRetention)
	case c.ReplayRetention < 0:
		return fmt.Errorf("Config.ReplayRetention: must not be negative, got %s", c.ReplayRetention)
	case c.DeadLetterRetention < 0:
		return fmt.Errorf("Config.DeadLetterRetention: must not be negative, got %s", c.DeadLetterRetention)
	}
	seen := make(map[string]bool, len(c.Consumers))
	for i, cc := range c.Consumers {
		if err := cc.Validate(); err != nil {
			return fmt.Errorf("Config.Consumers[%d]: %w", i, err)
		}
		if seen[cc.Consumer.Name()] {
			return fmt.Errorf("Config.Consumers[%d]: consumer %s appears twice", i, cc.Consumer.Name())
		}
		seen[cc.Consumer.Name()] = true
	}
	return nil
}

// Runner runs a service: it builds each consumer's chain and
// subscription, and between Start and Stop handles their messages and
// runs the service's loops: the outbox relay, the replay relay, the
// purge. Build it with New.
type Runner struct {
	cfg    Config
	logger *slog.Logger
	router *message.Router
	subs   []subscription
	// settlers are the subscribers told each message's outcome (see
	// intake), by the name of their router handlers; read-only once New
	// returns.
	settlers map[string]framework.Settler
	// sweeps are the consumers' chains' work that no message drives
	// (middleware.Handler), run beside the router.
	sweeps []func(context.Context)

	relay   *outbox.Relay     // the outbox relay; nil without an outbox
	replays *replayRelay      // publishes what operators replay or release
	purger  *purge.Purger     // nil when the runner does not purge
	gauges  *figuresCollector // registered on cfg.Registerer; nil if not

	// The service's loops (see startLoops), canceled under mu: the
	// outbox relay apart, as it stops last.
	stopRelay, stopLoops context.CancelFunc
	relayDone            chan struct{}
	loops                sync.WaitGroup
	loopsStopped         bool // stopBackground ran: no loop starts

	started  atomic.Bool
	launched atomic.Bool // the router's Run was called
	runDone  chan struct{}
	runErr   error // set before runDone closes

	mu       sync.Mutex
	stopping bool          // intake closed
	stop     chan struct{} // closed with the intake: the chains start no further attempt
	inFlight int           // messages past the intake
	idle     chan struct{} // closed when stopping and inFlight is 0
	closing  chan struct{} // closed when Stop gives up waiting

	workers workers.Pool // handle the messages past the intake
}

// subscription is a consumer's subscription, bound at Start.
type subscription struct {
	consumer string
	sub      framework.Subscription
}

// New builds the chain and the subscription of each consumer of cfg. It
// handles nothing until Start.
func New(cfg Config) (*Runner, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermilllog.New(cfg.Logger.With("component", "router")))
	if err != nil {
		return nil, fmt.Errorf("runner: router: %w", err)
	}
	r := &Runner{
		cfg:     cfg,
		logger:  cfg.Logger,
		router:  router,
		runDone: make(chan struct{}),
		idle:    make(chan struct{}),
		closing: make(chan struct{}),
		stop:    make(chan struct{}),

		settlers: make(map[string]framework.Settler),
	}
	router.AddMiddleware(r.intake, untilRunning(router))
	for _, cc := range cfg.Consumers {
		if err := r.add(cc); err != nil {
			return nil, fmt.Errorf("runner: consumer %s: %w", cc.Consumer.Name(), err)
		}
	}
	if err := r.addLoops(); err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	return r, nil
}

// addLoops builds the service's loops: the outbox relay, the replay
// relay, the purge, and registers the gauges (last: nothing fails after
// it).
func (r *Runner) addLoops() error {
	cfg := r.cfg
	pu := purge.New(cfg.Store, purge.Retentions{
		Processed:   cfg.ProcessedRetention,
		Outbox:      cfg.OutboxRetention,
		Replays:     cfg.ReplayRetention,
		DeadLetters: cfg.DeadLetterRetention,
	}, r.logger.With("component", "purger"))
	if cfg.PurgeInterval > 0 && pu.Can() {
		r.purger = pu
	}
	relay, err := newOutboxRelay(cfg, r.purger != nil)
	if err != nil {
		return err
	}
	r.relay = relay
	r.replays = newReplayRelay(cfg.Store, cfg.Transport, r.logger)
	if g, ok := cfg.Store.(framework.Gauges); ok && cfg.Registerer != nil {
		r.gauges = newFiguresCollector(g, r.logger)
		if err := cfg.Registerer.Register(r.gauges); err != nil {
			return fmt.Errorf("Config.Registerer: the database gauges: %w", err)
		}
	}
	return nil
}

// add builds cc's unit of work (its batches are the consumer's own),
// subscription and chain, and adds a router handler for each of the
// subscription's topics. The runner settles every message itself (see
// intake): the subscription is told so (SubscribeConfig.Settles), and
// its subscriber, when a framework.Settler, is told each outcome.
func (r *Runner) add(cc ConsumerConfig) error {
	c := cc.Consumer
	uow, err := framework.NewUnitOfWork(cc.unitOfWork(r.cfg.DB, r.cfg.Store))
	if err != nil {
		return err
	}
	sub, err := r.cfg.Transport.Subscribe(framework.SubscribeConfig{
		Consumer:       c.Name(),
		Types:          c.Types(),
		Concurrency:    cc.Concurrency,
		AttemptTimeout: cc.Timeout,
		HandlingTime:   cc.handlingTime(),
		Settles:        true,
	})
	if err != nil {
		return err
	}
	acker, _ := sub.Subscriber.(framework.TxAcker)
	h, sweep, err := middleware.Handler(r.chainConfig(cc, uow, acker))
	if err != nil {
		return err
	}
	r.sweeps = append(r.sweeps, sweep)
	r.subs = append(r.subs, subscription{consumer: c.Name(), sub: sub})
	settler, _ := sub.Subscriber.(framework.Settler)
	for i, topic := range sub.Topics {
		name := handlerName(c.Name(), sub.Topics, i)
		r.router.AddConsumerHandler(name, topic, sub.Subscriber, h)
		if settler != nil {
			r.settlers[name] = settler
		}
	}
	return nil
}

// handlingTime is the longest a healthy message of c stays with the
// runner: its attempts and the pauses between them, after the longest
// wait at an open breaker.
func (c ConsumerConfig) handlingTime() time.Duration {
	d := time.Duration(c.Attempts) * (c.Timeout + c.RetryDelay)
	if c.Breaker.Failures > 0 {
		d += c.Breaker.MaxHold
	}
	return d
}

// chainConfig is the middleware chain of cc.
func (r *Runner) chainConfig(cc ConsumerConfig, uow *framework.UnitOfWork, acker framework.TxAcker) middleware.Config {
	return middleware.Config{
		Consumer:   cc.Consumer,
		UnitOfWork: uow,
		Acker:      acker,
		Store:      r.cfg.Store,
		Settings:   cc.Settings,
		Logger:     r.logger,
		Metrics:    r.cfg.Metrics,
		Tracer:     r.cfg.Tracer,
		Outer:      r.cfg.Outer,
		Inner:      r.cfg.Inner,
		Stopping:   r.stop,
	}
}

// handlerName names the router handler of topics[i] of consumer: the
// consumer and the topic, numbered when the topic appears more than once.
func handlerName(consumer string, topics []string, i int) string {
	name := consumer + "@" + topics[i]
	n, nth := 0, 0
	for j, t := range topics {
		if t == topics[i] {
			n++
			if j <= i {
				nth++
			}
		}
	}
	if n > 1 {
		name = fmt.Sprintf("%s#%d", name, nth)
	}
	return name
}

// AddMiddleware adds middleware around every consumer's whole chain: it
// sees the error the chain returns. Call it before Start.
func (r *Runner) AddMiddleware(m ...message.HandlerMiddleware) {
	r.router.AddMiddleware(m...)
}

// Start adopts the history of renamed consumers, binds the subscriptions
// and runs the consumers; once every subscription is ready it starts the
// outbox relay, the replay relay (the consumers' queues and replay topics
// exist by then) and the purge, and returns. If ctx ends first, it stops
// what it started and returns ctx's cause. The loops run on a context
// with ctx's values, not its end: Stop ends them. A Runner starts once.
func (r *Runner) Start(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("runner: start: already started")
	}
	if err := r.adopt(ctx); err != nil {
		return fmt.Errorf("runner: start: %w", err)
	}
	// Bind before anything publishes, so nothing is dropped (AMQP's
	// fanout drops what reaches an exchange with no queue bound).
	for _, s := range r.subs {
		if err := s.sub.Initialize(); err != nil {
			return fmt.Errorf("runner: start: consumer %s: %w", s.consumer, err)
		}
	}
	runCtx, cancelRun := context.WithCancel(context.Background())
	r.launched.Store(true)
	go func() {
		defer close(r.runDone)
		var sweeps sync.WaitGroup
		for _, sweep := range r.sweeps {
			sweeps.Go(func() { sweep(runCtx) })
		}
		err := r.router.Run(runCtx)
		cancelRun()
		sweeps.Wait()
		r.workers.Close()
		if err != nil {
			r.runErr = err
			r.logger.Error("router stopped", "error", err)
		}
	}()
	select {
	case <-r.router.Running():
		r.startLoops(ctx)
		return nil
	case <-r.runDone:
		return fmt.Errorf("runner: start: router: %w", r.runErr)
	case <-ctx.Done():
		// Not running in time, or asked to stop. Ending Run's context
		// ends the subscriptions made so far, and the messages they
		// received, which wait in untilRunning: Run returns. (Not
		// router.Close: it would wait its CloseTimeout for the handlers
		// that never subscribed.)
		cancelRun()
		<-r.runDone
		return fmt.Errorf("runner: start: %w", context.Cause(ctx))
	}
}

// adopt hands each renamed consumer the processed marks of its old names,
// before it consumes anything.
func (r *Runner) adopt(ctx context.Context) error {
	for _, cc := range r.cfg.Consumers {
		for _, old := range cc.RenamedFrom {
			n, err := r.cfg.Store.Adopt(ctx, cc.Consumer.Name(), old)
			if err != nil {
				return fmt.Errorf("consumer %s renamed from %s: %w", cc.Consumer.Name(), old, err)
			}
			r.logger.InfoContext(ctx, "renamed consumer adopted the history of its old name (processed marks, checkpoints, dead letters, delivery counts, parked events)", "consumer", cc.Consumer.Name(), "renamed_from", old, "adopted_marks", n)
		}
	}
	return nil
}

// Running is closed once every subscription is ready, and stays closed.
func (r *Runner) Running() <-chan struct{} { return r.router.Running() }

// Stopped is closed once the consumers stopped: after Stop, or when the
// router failed. The service's loops run until Stop.
func (r *Runner) Stopped() <-chan struct{} { return r.runDone }

// Stop stops the service, in this order:
//
//  1. the purge and the replay relay: neither is needed to drain (the
//     purge would compete with the attempts for the database), and a
//     replay not yet published stays in the database for the next start;
//  2. the consumers: Stop closes the intake (messages delivered from now
//     on are nacked without being handled) and starts no further attempt
//     (a message whose attempt in flight fails, or that waits for its next
//     attempt, is nacked at once, neither retried nor dead-lettered nor
//     charged: see middleware.Config.Stopping; a message that passed the
//     intake before Stop still has its first attempt), waits until the
//     attempts in flight finish or ctx ends, then closes the router, which cancels the
//     attempts still running: they roll back and their messages are
//     delivered again later;
//  3. the outbox relay, which kept publishing what the draining attempts
//     committed, then publishes once more what is left, while ctx lasts
//     (the rest waits in the outbox for the next start);
//  4. the gauges, unregistered.
//
// It returns an error wrapping ctx's error if ctx ended before the
// attempts in flight finished. Stop does not close the transport.
func (r *Runner) Stop(ctx context.Context) error {
	r.stopBackground()
	defer func() {
		r.stopOutbox(ctx)
		if r.gauges != nil {
			r.cfg.Registerer.Unregister(r.gauges)
		}
	}()
	r.mu.Lock()
	if !r.stopping {
		r.stopping = true
		close(r.stop)
		if r.inFlight == 0 {
			close(r.idle)
		}
	}
	r.mu.Unlock()
	var waitErr error
	select {
	case <-r.idle:
	case <-ctx.Done():
		waitErr = fmt.Errorf("runner: stop: attempts in flight canceled: %w", context.Cause(ctx))
	}
	r.mu.Lock()
	select {
	case <-r.closing:
	default:
		close(r.closing)
	}
	r.mu.Unlock()
	if !r.launched.Load() {
		return waitErr
	}
	if err := r.router.Close(); err != nil {
		return errors.Join(waitErr, fmt.Errorf("runner: stop: close the router: %w", err))
	}
	<-r.runDone
	return waitErr
}

// startLoops starts the outbox relay, the replay relay and the purge, on
// a context with ctx's values (a crash hook of the tests: crash.With) but
// not its end, unless Stop began.
func (r *Runner) startLoops(ctx context.Context) {
	base := context.WithoutCancel(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping || r.loopsStopped {
		return
	}
	if r.relay != nil {
		relayCtx, cancel := context.WithCancel(base)
		r.stopRelay, r.relayDone = cancel, make(chan struct{})
		go func() {
			defer close(r.relayDone)
			_ = r.relay.Run(relayCtx) // nil when relayCtx ends; ErrRunning cannot happen here
		}()
	}
	loopsCtx, cancel := context.WithCancel(base)
	r.stopLoops = cancel
	r.loops.Go(func() { r.replays.run(loopsCtx) })
	if r.purger != nil {
		r.loops.Go(func() { runPurge(loopsCtx, r.purger, r.cfg.PurgeInterval, r.logger.With("component", "purger")) })
	}
}

// stopBackground stops the replay relay and the purge, and waits for them.
func (r *Runner) stopBackground() {
	r.mu.Lock()
	stop := r.stopLoops
	r.stopLoops, r.loopsStopped = nil, true
	r.mu.Unlock()
	if stop != nil {
		stop()
		r.loops.Wait()
	}
}

// stopOutbox stops the outbox relay, waits for it, and publishes once
// more what the consumers committed (lastOutboxPass).
func (r *Runner) stopOutbox(ctx context.Context) {
	r.mu.Lock()
	stop := r.stopRelay
	r.stopRelay = nil
	r.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	<-r.relayDone
	r.lastOutboxPass(ctx)
}
