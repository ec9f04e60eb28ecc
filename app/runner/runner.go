package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/app/internal/purge"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/internal/watermilllog"
	"github.com/effectively-once/effectively/internal/workers"
	"github.com/effectively-once/effectively/middleware"
)

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
	settlers map[string]driver.Settler
	// sequencers are the ordered consumers' sequencers, by the name of
	// their router handlers; read-only once New returns.
	sequencers map[string]*sequencer
	// handBacks record the first deliveries that the runner hands back
	// unhandled, by the name of their router handlers; read-only once
	// New returns.
	handBacks map[string]*handBack
	// sweeps are the consumers' chains' work that no message drives
	// (middleware.Handler), run beside the router.
	sweeps []func(context.Context)
	// partitioners hold the partitioned consumers' shares of their
	// partitions, beside the router.
	partitioners []*partitioner
	member       string // this process's name in its consumers' groups

	relay   *outbox.Relay     // the outbox relay; nil without an outbox
	replays *replayRelay      // publishes what operators replay or release
	purger  *purge.Purger     // nil when the runner does not purge
	gauges  *figuresCollector // registered on cfg.Registerer; nil if not
	// partGauges are the partitioned consumers' gauges, registered on
	// cfg.Registerer; nil without a partitioned consumer.
	partGauges *partitionsCollector
	lag        *LagGauges // registered on cfg.Registerer; nil if not
	// ordered are the ordered consumers' sequencers, by consumer;
	// waiting exports what waits in them, registered on cfg.Registerer
	// (nil if not, or without an ordered consumer).
	ordered  map[string]*sequencer
	waiting  *waitingCollector
	lagNames map[string]string // router handler name → consumer

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
	sub      driver.Subscription
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

		settlers:   make(map[string]driver.Settler),
		sequencers: make(map[string]*sequencer),
		member:     cfg.Member,
		handBacks:  make(map[string]*handBack),
		ordered:    make(map[string]*sequencer),
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
		Transport:   cfg.TransportRetention,
	}, r.logger.With("component", "purger"))
	if cfg.TopicPurger != nil {
		pu.WithTopics(cfg.TopicPurger, r.topics())
	}
	if cfg.PurgeInterval > 0 && pu.Can() {
		r.purger = pu
	}
	relay, err := newOutboxRelay(cfg, r.purger != nil)
	if err != nil {
		return err
	}
	r.relay = relay
	r.replays = newReplayRelay(cfg.Store, cfg.Transport, r.logger)
	if g, ok := cfg.Store.(driver.Gauges); ok && cfg.Registerer != nil {
		r.gauges = newFiguresCollector(g, r.logger)
		if err := cfg.Registerer.Register(r.gauges); err != nil {
			return fmt.Errorf("Config.Registerer: the database gauges: %w", err)
		}
	}
	if err := r.addPartitionGauges(); err != nil {
		return err
	}
	if err := r.addWaitingGauge(); err != nil {
		return err
	}
	return r.addLagGauges()
}

// addPartitionGauges registers the gauges of the partitioned consumers
// (see partitionsCollector), if any, on cfg.Registerer.
func (r *Runner) addPartitionGauges() error {
	leases, ok := r.cfg.Store.(driver.Leases)
	if !ok || r.cfg.Registerer == nil {
		return nil
	}
	var consumers []partitionedConsumer
	for _, cc := range r.cfg.Consumers {
		if cc.Partitions > 1 {
			consumers = append(consumers, partitionedConsumer{name: cc.Consumer.Name(), types: cc.Consumer.Types(), partitions: cc.Partitions})
		}
	}
	if len(consumers) == 0 {
		return nil
	}
	pc := newPartitionsCollector(consumers, leases, r.cfg.Backlogs, r.logger)
	if err := r.cfg.Registerer.Register(pc); err != nil {
		r.unregisterGauges()
		return fmt.Errorf("Config.Registerer: the partitions' gauges: %w", err)
	}
	r.partGauges = pc
	return nil
}

// add builds cc's unit of work (its batches are the consumer's own),
// subscription and chain, and adds a router handler for each of the
// subscription's topics. The runner settles every message itself (see
// intake): the subscription is told so (SubscribeConfig.Settles), and
// its subscriber, when a driver.Settler, is told each outcome.
func (r *Runner) add(cc ConsumerConfig) error {
	c := cc.Consumer
	uow, err := driver.NewUnitOfWork(cc.unitOfWork(r.cfg.DB, r.cfg.Store))
	if err != nil {
		return err
	}
	sub, err := r.cfg.Transport.Subscribe(driver.SubscribeConfig{
		Consumer:       c.Name(),
		Types:          c.Types(),
		Concurrency:    cc.Concurrency,
		AttemptTimeout: cc.Timeout,
		HandlingTime:   cc.handlingTime(),
		Partitions:     cc.Partitions,
		Settles:        true,
		Hold:           cc.hold(),
		FormerNames:    cc.RenamedFrom,
	})
	if err != nil {
		return err
	}
	acker, _ := sub.Subscriber.(driver.TxAcker)
	chain := r.chainConfig(cc, uow, acker)
	if cc.Partitions > 1 {
		p, err := r.partitioner(cc, sub)
		if err != nil {
			return err
		}
		r.partitioners = append(r.partitioners, p)
		chain.Fencer = p
	}
	h, sweep, err := middleware.Handler(chain)
	if err != nil {
		return err
	}
	r.sweeps = append(r.sweeps, sweep)
	r.subs = append(r.subs, subscription{consumer: c.Name(), sub: sub})
	settler, _ := sub.Subscriber.(driver.Settler)
	subscriber := sub.Subscriber
	back := &handBack{consumer: c.Name(), store: r.cfg.Store, maxBody: cc.MaxBodyBytes, logger: r.logger}
	var seq *sequencer
	if cc.StrictOrder || cc.SkipStale {
		seq = newSequencer(cc.MaxBodyBytes, settler)
		if holder, ok := sub.Subscriber.(driver.Holder); ok {
			seq.holdBeyond(cc.Concurrency, holder)
		}
		seq.handBack, seq.stopping, seq.closing = back, r.stop, r.closing
		r.ordered[c.Name()] = seq
		subscriber = seq.subscriber(subscriber)
		h = inTurn(h)
	}
	for i, topic := range sub.Topics {
		name := handlerName(c.Name(), sub.Topics, i)
		r.router.AddConsumerHandler(name, topic, subscriber, h)
		r.handBacks[name] = back
		r.lagHandler(name, c.Name())
		if settler != nil {
			r.settlers[name] = settler
		}
		if seq != nil {
			r.sequencers[name] = seq
		}
	}
	return nil
}

// partitioner returns the partitioner of cc, a partitioned consumer, and
// its subscription sub.
func (r *Runner) partitioner(cc ConsumerConfig, sub driver.Subscription) (*partitioner, error) {
	leases, ok := r.cfg.Store.(driver.Leases)
	if !ok {
		return nil, fmt.Errorf("partitions: %d: the store %T keeps no partition leases (driver.Leases)", cc.Partitions, r.cfg.Store)
	}
	assigner, ok := sub.Subscriber.(driver.Assigner)
	if !ok {
		return nil, fmt.Errorf("partitions: %d: the transport's subscriber %T cannot consume partitions (driver.Assigner)", cc.Partitions, sub.Subscriber)
	}
	ender, _ := leases.(driver.SessionEnder)
	return &partitioner{
		consumer:   cc.Consumer.Name(),
		partitions: cc.Partitions,
		member:     r.member,
		leases:     leases,
		ender:      ender,
		assigner:   assigner,
		lease:      r.cfg.PartitionLease,
		logger:     r.logger.With("component", "partitions", "consumer", cc.Consumer.Name()),
		stop:       r.stop,
		held:       make(map[int]int64),
	}, nil
}

// hold is how many of c's messages its sequencer may keep waiting out of
// the transport's window (driver.Holder): four windows for an ordered
// consumer, none for another.
func (c ConsumerConfig) hold() int {
	if c.StrictOrder || c.SkipStale {
		return 4 * c.Concurrency
	}
	return 0
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
func (r *Runner) chainConfig(cc ConsumerConfig, uow *driver.UnitOfWork, acker driver.TxAcker) middleware.Config {
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
	if err := r.checkPartitions(ctx); err != nil {
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
		for _, p := range r.partitioners {
			sweeps.Go(func() {
				select {
				case <-r.router.Running(): // the subscriptions exist
					p.run(runCtx)
				case <-runCtx.Done():
				}
			})
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
// and, on a transport that keeps consumer groups' positions
// (driver.GroupAdopter), their positions, before it consumes anything:
// else its new group would read the retained messages from the start,
// and handle again what the old name dead-lettered.
func (r *Runner) adopt(ctx context.Context) error {
	groups := r.cfg.GroupAdopter
	topics := make(map[string][]string, len(r.subs))
	for _, s := range r.subs {
		topics[s.consumer] = s.sub.Topics
	}
	for _, cc := range r.cfg.Consumers {
		name := cc.Consumer.Name()
		for _, old := range cc.RenamedFrom {
			n, err := r.cfg.Store.Adopt(ctx, name, old)
			if err != nil {
				return fmt.Errorf("consumer %s renamed from %s: %w", name, old, err)
			}
			var positions []driver.GroupPosition
			if groups != nil {
				if positions, err = groups.AdoptGroup(ctx, name, old, topics[name]); err != nil {
					return fmt.Errorf("consumer %s renamed from %s: %w", name, old, err)
				}
			}
			r.logger.InfoContext(ctx, "renamed consumer adopted the history of its old name (processed marks, checkpoints, dead letters, delivery counts, parked events, and the transport's positions)",
				"consumer", name, "renamed_from", old, "adopted_marks", n, "adopted_positions", len(positions))
		}
	}
	return nil
}

// checkPartitions records the partition count of each partitioned
// consumer the first time it runs, and refuses one whose count differs
// from the recorded one, or an unpartitioned consumer that was
// partitioned: its subjects would map to other partitions while their
// events are in flight, and their order would be lost.
func (r *Runner) checkPartitions(ctx context.Context) error {
	leases, ok := r.cfg.Store.(driver.Leases)
	if !ok {
		return nil // New refused partitioned consumers
	}
	for _, cc := range r.cfg.Consumers {
		name := cc.Consumer.Name()
		if cc.Partitions <= 1 {
			continue
		}
		recorded, err := leases.PartitionCount(ctx, name, cc.Partitions)
		if err != nil {
			return fmt.Errorf("consumer %s: %w", name, err)
		}
		if recorded != cc.Partitions {
			return fmt.Errorf("consumer %s: partitions: %d, but the consumer runs with %d: a change would move subjects between partitions while their events are in flight. "+
				"To change it, drain the consumer (its producers stopped, until the consumers command shows no backlog), stop every process of it, "+
				"run the consumers repartition %s %d command, then start them (docs/scaling.md)", name, cc.Partitions, recorded, name, cc.Partitions)
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
//     attempts in flight finish or ctx ends, then closes the router,
//     which cancels the attempts still running: they roll back and their
//     messages are delivered again later;
//  3. the outbox relay, which kept publishing what the draining attempts
//     committed, then publishes once more what is left, while ctx lasts
//     (the rest waits in the outbox for the next start);
//  4. the gauges (those of the database, those of the partitions),
//     unregistered.
//
// It returns an error wrapping ctx's error if ctx ended before the
// attempts in flight finished. Stop does not close the transport.
func (r *Runner) Stop(ctx context.Context) error {
	r.stopBackground()
	defer func() {
		r.stopOutbox(ctx)
		r.unregisterGauges()
		r.removeLagGauges(ctx)
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
