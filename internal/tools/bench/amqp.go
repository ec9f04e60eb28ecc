package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/jmoiron/sqlx"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/effectively-once/effectively/app"
	feamqp "github.com/effectively-once/effectively/framework/amqp"
)

// amqpScenario: the example service on RabbitMQ and PostgreSQL against a
// hand-written watermill-amqp consumer.
func amqpScenario() Scenario {
	return Scenario{
		Name:  "amqp",
		Title: "AMQP + PostgreSQL",
		About: fmt.Sprintf("The example service (`EFFECTIVELY_TRANSPORT=amqp`, its stores in a PostgreSQL schema of its own) "+
			"drains its queue, filled beforehand by a foreign producer: plain amqp091-go publishing CloudEvents "+
			"JSON to the type's fanout exchange, persistent, with publisher confirms. It runs with its default "+
			"configuration (%d messages in flight), with a transaction per message (`batch_size: 1`) and with "+
			"`defaults: {concurrency: 16}`. The baseline is the best of a hand-written consumer's pre-sweep, measured in full rounds "+
			"beside the others: a process of its own, watermill-amqp's durable pub/sub configuration on a queue of "+
			"its own bound to the same exchange, N `AddConsumerHandler` subscriptions of that queue (a channel "+
			"each) with prefetch P and a pool of N connections, and per message the handler's own sqlx transaction "+
			"with the dedup insert and the business insert, commit, then the ack. The pre-sweep drains each of "+
			"N = 4, 16, 64 by P = 1, 16, 256 once, at a quarter of the run's messages, and keeps the fastest; the "+
			"earlier baseline (16 subscriptions, prefetch 1, watermill-amqp's default) runs in full rounds too. "+
			"The limit is a hand-optimized consumer in one process: amqp091-go on one channel (prefetch %d), the "+
			"deliveries gathered into batches of up to %d that grow while the writers are busy, %d written at once "+
			"with pgx, each batch's marks and business rows in one statement (so one transaction and one round "+
			"trip), each batch acked with one multiple ack once it and those before it committed. Gates: the "+
			"default configuration at least %.1f× the best hand-written consumer (the better of the pre-sweep's best and the "+
			"earlier baseline, both in full rounds) and %.1f of the limit, its start-up "+
			"to first effect below %s.", app.DefaultConcurrency, limitPrefetch, limitBatch, limitWriters,
			AMQPGainGate, AMQPLimitGate, seconds(StartUpGate)),
		Needs: []Need{NeedPostgres, NeedAMQP},
		Runs: []Run{
			{Name: amqpDefault, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureAMQPService(ctx, env, "")
			}},
			// The configurations but the default's are left out of smoke
			// runs: their code is the default's, and TestSmoke must stay
			// short.
			{Name: "example service, a transaction per message (batch_size 1)", NoSmoke: true, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureAMQPService(ctx, env, "defaults:\n  batch_size: 1\n")
			}},
			{Name: "example service, concurrency 16", NoSmoke: true, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureAMQPService(ctx, env, "defaults:\n  concurrency: 16\n")
			}},
			{Name: amqpEarlier, NoSmoke: true, Measure: measureAMQPBaseline},
			{Name: amqpBest, Baseline: true, Measure: measureAMQPBest},
			{Name: amqpLimit, Measure: measureAMQPLimit},
		},
		Children: []Child{{Name: "watermill-amqp", Main: amqpBaselineMain}, {Name: "limit", Main: amqpLimitMain}},
		Gate: &Gate{
			Run: amqpDefault, Among: []string{amqpBest, amqpEarlier}, Min: AMQPGainGate,
			And: &Gate{
				Run: amqpDefault, Of: amqpLimit, Min: AMQPLimitGate,
				And: &Gate{Run: amqpDefault, MaxStartUp: StartUpGate},
			},
		},
	}
}

// The AMQP scenario's runs that its gates name.
var (
	amqpDefault = fmt.Sprintf("example service, default configuration (concurrency %d)", app.DefaultConcurrency)
	amqpEarlier = fmt.Sprintf("hand-written watermill-amqp, %d subscriptions, prefetch %d (the earlier baseline)", baselineSubs, baselinePrefetch)
	amqpBest    = "hand-written watermill-amqp, the best of its pre-sweep"
	amqpLimit   = fmt.Sprintf("limit: amqp091-go, batches of up to %d, %d written at once, one statement each (pgx)", limitBatch, limitWriters)
)

// serviceQueue is the example consumer's queue: its name.
const serviceQueue = "notifications.remind-on-appointment-booked"

// amqpFeed is a foreign producer of the AMQP transport: amqp091-go,
// publishing to the type's exchange, with a queue bound to it.
type amqpFeed struct {
	conn *amqp091.Connection
	ch   *amqp091.Channel
	// partitionKey sets each message's subject in the header that a
	// partitioned consumer's consistent-hash exchange hashes
	// (amqp.PartitionHeader), as the framework's publishers do.
	partitionKey bool
}

// newAMQPFeed declares the type's exchange and the queue, bound to it and
// emptied (a queue the example's tests left behind holds their messages),
// and deletes the queue after the run unless another process consumes it.
// The example's own tests run the service on the same broker, with the
// same queue: while a process of theirs consumes it, the run waits, up to
// a minute.
func newAMQPFeed(ctx context.Context, env *Env, queue string) (*amqpFeed, error) {
	conn, err := amqp091.Dial(env.AMQPURL)
	if err != nil {
		return nil, fmt.Errorf("dial RabbitMQ: %w", err)
	}
	f := &amqpFeed{conn: conn}
	env.Cleanup(func(context.Context) error { return conn.Close() })
	if f.ch, err = conn.Channel(); err != nil {
		return nil, fmt.Errorf("channel: %w", err)
	}
	if err := f.ch.ExchangeDeclare(EventType, "fanout", true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("declare exchange: %w", err)
	}
	if err := f.declareUnused(ctx, queue); err != nil {
		return nil, err
	}
	env.Cleanup(func(context.Context) error {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("channel: %w", err)
		}
		defer ch.Close()
		_, err = ch.QueueDelete(queue, true, false, false)
		if e := (*amqp091.Error)(nil); errors.As(err, &e) && e.Code == amqp091.PreconditionFailed {
			return nil // another process consumes it now
		}
		if err != nil {
			return fmt.Errorf("delete queue %s: %w", queue, err)
		}
		return nil
	})
	if err := f.ch.QueueBind(queue, "", EventType, false, nil); err != nil {
		return nil, fmt.Errorf("bind queue %s: %w", queue, err)
	}
	if _, err := f.ch.QueuePurge(queue, false); err != nil {
		return nil, fmt.Errorf("purge queue %s: %w", queue, err)
	}
	if err := f.ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	return f, nil
}

// declareUnused declares the durable queue and waits, up to a minute,
// until no other process consumes it.
func (f *amqpFeed) declareUnused(ctx context.Context, queue string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		q, err := f.ch.QueueDeclare(queue, true, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("declare queue %s: %w", queue, err)
		}
		if q.Consumers == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("queue %s: %d consumers of another process for a minute (the example's tests?): run again when they are done", queue, q.Consumers)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (f *amqpFeed) publish(ctx context.Context, m Message) (*amqp091.DeferredConfirmation, error) {
	var headers amqp091.Table
	if f.partitionKey && m.Subject != "" {
		headers = amqp091.Table{feamqp.PartitionHeader: m.Subject}
	}
	return f.ch.PublishWithDeferredConfirmWithContext(ctx, EventType, "", false, false, amqp091.Publishing{
		Headers:      headers,
		ContentType:  "application/cloudevents+json",
		DeliveryMode: amqp091.Persistent,
		MessageId:    m.ID,
		Body:         m.Body,
	})
}

// Feed publishes the messages, waiting for the broker's confirms of each
// window of 500.
func (f *amqpFeed) Feed(ctx context.Context, msgs []Message) error {
	for len(msgs) > 0 {
		n := min(500, len(msgs))
		confirms := make([]*amqp091.DeferredConfirmation, 0, n)
		for _, m := range msgs[:n] {
			c, err := f.publish(ctx, m)
			if err != nil {
				return fmt.Errorf("publish %s: %w", m.ID, err)
			}
			confirms = append(confirms, c)
		}
		for _, c := range confirms {
			ok, err := c.WaitContext(ctx)
			if err != nil {
				return fmt.Errorf("confirm: %w", err)
			}
			if !ok {
				return fmt.Errorf("the broker refused message %d", c.DeliveryTag)
			}
		}
		msgs = msgs[n:]
	}
	return nil
}

// Send publishes one message without waiting for its confirm, so that
// the pace holds; a message lost would show as a missing effect.
func (f *amqpFeed) Send(ctx context.Context, m Message) error {
	_, err := f.publish(ctx, m)
	return err
}

// amqpService is the example service on RabbitMQ, its stores on
// PostgreSQL.
type amqpService struct {
	*amqpFeed
	env    *Env
	url    string
	db     *sqlx.DB
	config string
	// vars are the service's variables beside those of serviceVars.
	vars map[string]string
	// processes is how many processes of the service Start starts, all
	// consuming at once; one when zero.
	processes int
}

func measureAMQPService(ctx context.Context, env *Env, config string) (Result, error) {
	sys, err := newAMQPService(ctx, env, config)
	if err != nil {
		return Result{}, err
	}
	return Drain(ctx, env, sys)
}

// newAMQPService prepares the example service on RabbitMQ, its stores in
// a schema of the run's own, with config as its configuration file (none
// when empty).
func newAMQPService(ctx context.Context, env *Env, config string) (*amqpService, error) {
	url, db, err := serviceDB(ctx, env, "amqp")
	if err != nil {
		return nil, err
	}
	s := &amqpService{env: env, url: url, db: db}
	if config != "" {
		s.config = filepath.Join(env.Dir, "config.yaml")
		if err := os.WriteFile(s.config, []byte(config), 0o600); err != nil {
			return nil, fmt.Errorf("write config: %w", err)
		}
	}
	if s.amqpFeed, err = newAMQPFeed(ctx, env, serviceQueue); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *amqpService) Start(ctx context.Context) (*Process, error) {
	vars := serviceVars("amqp", s.url, s.config)
	vars["EFFECTIVELY_AMQP_URL"] = s.env.AMQPURL
	maps.Copy(vars, s.vars)
	return s.env.startServices(ctx, vars, s.processes)
}

func (s *amqpService) Effects() *EffectTable {
	return &EffectTable{DB: s.db, Table: "reminders", EventColumn: "event_id", Prefix: s.env.ID}
}

// The AMQP baseline's variables and size.
const (
	envBaselineAMQP     = "EFFECTIVELY_BENCH_AMQP_URL"
	envBaselineQueue    = "EFFECTIVELY_BENCH_QUEUE"
	envBaselineSubs     = "EFFECTIVELY_BENCH_SUBSCRIPTIONS"
	envBaselinePrefetch = "EFFECTIVELY_BENCH_PREFETCH"
	envBaselineWait     = "EFFECTIVELY_BENCH_OUTSIDE_WAIT"
	baselineSubs        = 16
	// baselinePrefetch is watermill-amqp's own (NewDurablePubSubConfig).
	baselinePrefetch = 1
)

// amqpKnobs are the settings of the hand-written watermill-amqp
// consumer that its pre-sweep tries: its router's subscriptions of the
// queue (a channel each) and each channel's prefetch. Its pool holds a
// connection per subscription.
type amqpKnobs struct {
	subs, prefetch int
}

func (k amqpKnobs) String() string {
	return fmt.Sprintf("%d subscriptions, prefetch %d, pool %d", k.subs, k.prefetch, k.subs)
}

// amqpSweep is the grid of the hand-written watermill-amqp consumer's
// pre-sweep: 4, 16 and 64 subscriptions, each with prefetch 1 (the
// earlier baseline's, watermill-amqp's default), 16 and 256.
func amqpSweep() []sweepConfig[amqpKnobs] {
	var cs []sweepConfig[amqpKnobs]
	for _, subs := range []int{4, 16, 64} {
		for _, prefetch := range []int{1, 16, 256} {
			k := amqpKnobs{subs: subs, prefetch: prefetch}
			cs = append(cs, sweepConfig[amqpKnobs]{name: k.String(), config: k})
		}
	}
	return cs
}

// amqpBaseline is the hand-written watermill-amqp consumer, or (with
// child "limit") the hand-optimized one of amqplimit.go.
type amqpBaseline struct {
	*amqpFeed
	env   *Env
	url   string
	queue string
	db    *sqlx.DB
	// child is the child that consumes: "watermill-amqp" when empty.
	child string
	knobs amqpKnobs
	// wait is how long the handler waits for an outside call; none when
	// zero.
	wait time.Duration
}

func measureAMQPBaseline(ctx context.Context, env *Env) (Result, error) {
	return measureAMQPKnobs(ctx, env, amqpKnobs{subs: baselineSubs, prefetch: baselinePrefetch})
}

// measureAMQPKnobs drains the hand-written watermill-amqp consumer with
// knobs k.
func measureAMQPKnobs(ctx context.Context, env *Env, k amqpKnobs) (Result, error) {
	sys, err := newAMQPBaseline(ctx, env)
	if err != nil {
		return Result{}, err
	}
	sys.knobs = k
	return Drain(ctx, env, sys)
}

// measureAMQPBest sweeps the hand-written watermill-amqp consumer's
// knobs once (amqpSweep) and drains the best configuration.
func measureAMQPBest(ctx context.Context, env *Env) (Result, error) {
	return measureBest(ctx, env, "watermill-amqp", amqpSweep(), measureAMQPKnobs)
}

// newAMQPBaseline prepares the hand-written watermill-amqp consumer, its
// tables in a schema of the run's own.
func newAMQPBaseline(ctx context.Context, env *Env) (*amqpBaseline, error) {
	url, db, err := baselineDB(ctx, env)
	if err != nil {
		return nil, err
	}
	b := &amqpBaseline{
		env: env, url: url, db: db, queue: "bench.baseline-" + randomHex(6),
		knobs: amqpKnobs{subs: baselineSubs, prefetch: baselinePrefetch},
	}
	if b.amqpFeed, err = newAMQPFeed(ctx, env, b.queue); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *amqpBaseline) Start(ctx context.Context) (*Process, error) {
	child := cmp.Or(b.child, "watermill-amqp")
	return b.env.StartChild(ctx, child, map[string]string{
		envBaselineDB:       b.url,
		envBaselineAMQP:     b.env.AMQPURL,
		envBaselineQueue:    b.queue,
		envBaselineSubs:     strconv.Itoa(b.knobs.subs),
		envBaselinePrefetch: strconv.Itoa(b.knobs.prefetch),
		envBaselineWait:     b.wait.String(),
	})
}

func (b *amqpBaseline) Effects() *EffectTable {
	return &EffectTable{DB: b.db, Table: "bench_reminders", EventColumn: "event_id", Prefix: b.env.ID}
}

// amqpBaselineMain runs the hand-written watermill-amqp consumer until ctx
// ends: one subscriber, that many router handlers of its queue, each with
// a channel of its own.
func amqpBaselineMain(ctx context.Context, c *ChildEnv) error {
	subs, err := positiveVar(c, envBaselineSubs)
	if err != nil {
		return err
	}
	prefetch, err := positiveVar(c, envBaselinePrefetch)
	if err != nil {
		return err
	}
	db, err := openBaselineDB(c, subs)
	if err != nil {
		return err
	}
	defer db.Close()
	cfg := wamqp.NewDurablePubSubConfig(c.Getenv(envBaselineAMQP), wamqp.GenerateQueueNameConstant(c.Getenv(envBaselineQueue)))
	cfg.Consume.Qos.PrefetchCount = prefetch
	sub, err := wamqp.NewSubscriber(cfg, quietLogger())
	if err != nil {
		return fmt.Errorf("subscriber: %w", err)
	}
	router, err := newRouter()
	if err != nil {
		return err
	}
	wait, err := baselineWait(c)
	if err != nil {
		return err
	}
	handler := baselineHandler(db, wait)
	for i := range subs {
		router.AddConsumerHandler(fmt.Sprintf("reminders-%d", i+1), EventType, sub, handler)
	}
	return runRouter(ctx, router, c.Ready)
}

// positiveVar returns the child's variable key as a positive number.
func positiveVar(c *ChildEnv, key string) (int, error) {
	n, err := strconv.Atoi(c.Getenv(key))
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s: want a positive number, got %q", key, c.Getenv(key))
	}
	return n, nil
}
