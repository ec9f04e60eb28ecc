package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// The idle scenario's size: how many events a run sends in each of its
// rounds (whose p50s' median its gates judge), one at a time, and the
// mean pause before each (drawn evenly from half to one and a half
// times it, so that the sends fall at every phase of a poller's period).
// The shortest pause, 150 ms, is many times what any transport takes to
// notice a message (the SQLite transport looks every 10 ms). Pauses of
// 500 ms on average, until 2026-12-06, measured about the same p50s
// (1.2, 1.3 and 4.9 ms on RabbitMQ, the PostgreSQL transport and SQLite,
// against 1.5, 1.8 and 5.3 an hour later with these) and cost the whole
// run 20 seconds more, of the 25 minutes it may take.
const (
	idleEvents = 10
	idlePause  = 300 * time.Millisecond
	// idleSettle is how long a consumer runs before the first send, so
	// that its start-up work is over.
	idleSettle = time.Second
)

// idleScenario: the latency of a single event that reaches a consumer at
// rest, on each transport.
func idleScenario() Scenario {
	return Scenario{
		Name:  "idle",
		Title: "Idle to handled",
		About: fmt.Sprintf("A consumer at rest gets a single event from a foreign producer, waits for it to take "+
			"effect, rests again: %d events a round, one at a time, each after a pause of %s on average (%s to %s, "+
			"evenly drawn), in as many rounds as the other scenarios. p50 and p99 run from the send to the effect's "+
			"write, each the median of its rounds'; **at rate** is the events per "+
			"second this makes, and the CPU columns are the consumer's and the machine's use over the whole "+
			"run: what the consumer costs at rest. The producers are those of the other scenarios: on SQLite "+
			"the documented `INSERT` into `pubsub_messages` from another process, on PostgreSQL the documented "+
			"`INSERT` into the topic's table, on RabbitMQ amqp091-go publishing to the type's exchange. The "+
			"example service runs with its default configuration; the hand-written consumers are those of the "+
			"other scenarios (watermill-sql polls once a second when idle). effects/s and the ratio have no "+
			"meaning here; the baseline is the hand-written RabbitMQ consumer, for reference. Gates: the example "+
			"service's p50 below %s on every transport.",
			idleEvents, idlePause, idlePause/2, idlePause*3/2, ms(IdleP50Gate)),
		Needs: []Need{NeedPostgres, NeedAMQP},
		Runs: []Run{
			{Name: idleSQLite, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureIdle(ctx, env, func() (idleSystem, error) { return newSQLiteService(ctx, env, "") })
			}},
			{Name: idlePostgres, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureIdle(ctx, env, func() (idleSystem, error) { return newPostgresService(ctx, env) })
			}},
			// The hand-written consumers' smoke is their scenarios'.
			{Name: "hand-written watermill-sql", NoSmoke: true, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureIdle(ctx, env, func() (idleSystem, error) { return newPostgresBaseline(ctx, env) })
			}},
			{Name: idleAMQP, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureIdle(ctx, env, func() (idleSystem, error) { return newAMQPService(ctx, env, "") })
			}},
			{Name: "hand-written watermill-amqp, 16 subscriptions", Baseline: true, NoSmoke: true, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureIdle(ctx, env, func() (idleSystem, error) { return newAMQPBaseline(ctx, env) })
			}},
		},
		Gate: &Gate{
			Run: idleSQLite, MaxP50: IdleP50Gate,
			And: &Gate{
				Run: idlePostgres, MaxP50: IdleP50Gate,
				And: &Gate{Run: idleAMQP, MaxP50: IdleP50Gate},
			},
		},
		// The hand-written consumers of the PostgreSQL and AMQP scenarios.
		Children: []Child{
			{Name: "watermill-sql", Main: postgresBaselineMain},
			{Name: "watermill-amqp", Main: amqpBaselineMain},
		},
	}
}

// The idle scenario's runs of the example service, which its gates name.
const (
	idleSQLite   = "example service, SQLite transport"
	idlePostgres = "example service, PostgreSQL transport"
	idleAMQP     = "example service, AMQP + PostgreSQL"
)

// idleSystem is a consumer and its foreign producer, sending one event
// at a time.
type idleSystem interface {
	System
	Sender
}

// measureIdle builds the system with build, starts its consumer, lets it
// settle, then sends the events one at a time, each after a pause and
// once the one before took effect, and times each from its send to its
// effect. A smoke run sends three events after short pauses.
func measureIdle(ctx context.Context, env *Env, build func() (idleSystem, error)) (Result, error) {
	sys, err := build()
	if err != nil {
		return Result{}, err
	}
	n, pause, settle := idleEvents, idlePause, idleSettle
	if env.Smoke {
		n, pause, settle = 3, 20*time.Millisecond, 0
	}
	p, err := sys.Start(ctx)
	if err != nil {
		return Result{}, err
	}
	if err := sleep(ctx, settle); err != nil {
		return Result{}, err
	}
	c0, err := sampleCPU(p.Pid())
	if err != nil {
		return Result{}, err
	}
	msgs := Events(env.ID+"-i", n)
	sent := make([]time.Time, n)
	rng := rand.New(rand.NewPCG(uint64(n), 2))
	effects := sys.Effects()
	start := time.Now()
	env.Logf("%d events, one at a time, after pauses of %s on average", n, pause)
	for i, m := range msgs {
		if err := sleep(ctx, pause/2+time.Duration(rng.Int64N(int64(pause)))); err != nil {
			return Result{}, err
		}
		sent[i] = time.Now()
		if err := sys.Send(ctx, m); err != nil {
			return Result{}, fmt.Errorf("send %s: %w", m.ID, err)
		}
		if err := waitEffects(ctx, env, p, effects, i+1); err != nil {
			return Result{}, err
		}
	}
	elapsed := time.Since(start)
	c1, err := sampleCPU(p.Pid())
	if err != nil {
		return Result{}, err
	}
	ds, err := latencies(ctx, effects, msgs, sent)
	if err != nil {
		return Result{}, err
	}
	res := Result{Events: n, Messages: n, CPU: cpuBetween(c0, c1, elapsed.Seconds(), nil)}
	res.Latency = &Latency{Rate: float64(n) / elapsed.Seconds(), Events: n, P50: Percentile(ds, 50), P99: Percentile(ds, 99)}
	env.Logf("p50 %s, p99 %s", ms(res.Latency.P50), ms(res.Latency.P99))
	if res.PeakRSS, err = p.PeakRSS(); err != nil {
		return Result{}, err
	}
	if err := p.Stop(stopTimeout); err != nil {
		return Result{}, err
	}
	if res.Effects, res.DistinctEffects, err = effects.Count(ctx); err != nil {
		return Result{}, err
	}
	if res.Profile, err = ProfileTop(ctx, p.ProfilePath(), 10); err != nil {
		return Result{}, err
	}
	return res, nil
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
