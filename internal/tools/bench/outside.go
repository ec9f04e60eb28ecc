package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/effectively-once/effectively/framework/driver"
)

// The outside-call scenarios: the example's handler waits OutsideWait
// before its insert, as a handler that calls an outside service does.
const (
	// OutsideWait is how long each handler of the outside-call scenarios
	// waits.
	OutsideWait = 10 * time.Millisecond
	// OutsideGate is the share of the best run's effects per second that
	// the default configuration must reach in the outside-call scenarios.
	OutsideGate = 0.9
	// OutsidePostgresScale is the share of Options.Events the runs of
	// the outside-call scenario on the PostgreSQL transport drain: its
	// baseline takes one message at a time, under a hundred a second.
	OutsidePostgresScale = 0.25
	// OutsideBaselineScale is the share of their scenario's messages
	// the hand-written consumers of the outside-call scenarios drain
	// (Run.Scale): bounded by their waits (16 at a time on RabbitMQ, one
	// at a time on the PostgreSQL transport), their rate holds from the
	// first hundred messages on, and at full size the PostgreSQL one took
	// a minute a round.
	OutsideBaselineScale = 0.2
	// envOutsideWait is the example service's variable that makes its
	// handler wait (examples/notifications, EnvOutsideWait).
	envOutsideWait = "NOTIFICATIONS_OUTSIDE_WAIT"
)

// The runs of the outside-call scenarios.
const (
	outsideDefault = "example service, default configuration"
	outsideBatch1  = "example service, a transaction per message (batch_size 1)"
)

// outsideAMQPScenario: the amqp scenario with a handler that waits
// OutsideWait, against the hand-written 16-subscription consumer with the
// same wait.
func outsideAMQPScenario() Scenario {
	return Scenario{
		Name:  "outside-amqp",
		Title: "Outside call, AMQP + PostgreSQL",
		About: fmt.Sprintf("The AMQP + PostgreSQL scenario with a handler that calls an outside service: the example "+
			"service's handler waits %s before its insert (`%s=%s`), with its default configuration (group "+
			"commit: the attempts overlap, holding up to %d connections besides the batches') and with `defaults: {batch_size: 1}`. The baseline is the "+
			"hand-written consumer of 16 `AddConsumerHandler` subscriptions, each message waiting the same %s "+
			"before its transaction, draining a fifth of the messages the others do. Gate: the default "+
			"configuration reaches at least %.1f of the best run's "+
			"effects/s.", OutsideWait, envOutsideWait, OutsideWait, driver.DefaultOverlap, OutsideWait, OutsideGate),
		Needs: []Need{NeedPostgres, NeedAMQP},
		Runs: []Run{
			{Name: outsideDefault, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureOutsideAMQP(ctx, env, "")
			}},
			{Name: outsideBatch1, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureOutsideAMQP(ctx, env, "defaults:\n  batch_size: 1\n")
			}},
			{Name: "hand-written watermill-amqp, 16 subscriptions", Baseline: true, Scale: OutsideBaselineScale, Measure: func(ctx context.Context, env *Env) (Result, error) {
				b, err := newAMQPBaseline(ctx, env)
				if err != nil {
					return Result{}, err
				}
				b.wait = OutsideWait
				return Drain(ctx, env, b)
			}},
		},
		Children: []Child{{Name: "watermill-amqp", Main: amqpBaselineMain}},
		Gate:     &Gate{Run: outsideDefault, Min: OutsideGate},
	}
}

// outsidePostgresScenario: the postgres scenario with a handler that
// waits OutsideWait, against the hand-written watermill-sql consumer with
// the same wait.
func outsidePostgresScenario() Scenario {
	return Scenario{
		Name:  "outside-postgres",
		Title: "Outside call, PostgreSQL transport",
		About: fmt.Sprintf("The PostgreSQL transport scenario with a handler that calls an outside service: the "+
			"example service's handler waits %s before its insert, with its default configuration and with "+
			"`defaults: {batch_size: 1}`. The baseline is the hand-written watermill-sql consumer, each message "+
			"waiting the same %s before its transaction: its one router handler takes the messages one at a "+
			"time, and drains a fifth of the messages the others do (its rate holds from the first hundred on). "+
			"Gate: the default configuration reaches at least %.1f of the best run's effects/s.",
			OutsideWait, OutsideWait, OutsideGate),
		Needs: []Need{NeedPostgres},
		Runs: []Run{
			{Name: outsideDefault, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureOutsidePostgres(ctx, env, "")
			}},
			{Name: outsideBatch1, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureOutsidePostgres(ctx, env, "defaults:\n  batch_size: 1\n")
			}},
			{Name: "hand-written watermill-sql, handler's own transaction", Baseline: true, Scale: OutsideBaselineScale, Measure: func(ctx context.Context, env *Env) (Result, error) {
				b, err := newPostgresBaseline(ctx, env)
				if err != nil {
					return Result{}, err
				}
				b.wait = OutsideWait
				return Drain(ctx, env, b)
			}},
		},
		Children: []Child{{Name: "watermill-sql", Main: postgresBaselineMain}},
		Scale:    OutsidePostgresScale,
		Gate:     &Gate{Run: outsideDefault, Min: OutsideGate},
	}
}

// outsideVars are the example service's variables that make its handler
// wait OutsideWait.
func outsideVars() map[string]string {
	return map[string]string{envOutsideWait: OutsideWait.String()}
}

func measureOutsideAMQP(ctx context.Context, env *Env, config string) (Result, error) {
	s, err := newAMQPService(ctx, env, config)
	if err != nil {
		return Result{}, err
	}
	s.vars = outsideVars()
	return Drain(ctx, env, s)
}

func measureOutsidePostgres(ctx context.Context, env *Env, config string) (Result, error) {
	s, err := newPostgresService(ctx, env)
	if err != nil {
		return Result{}, err
	}
	if config != "" {
		s.config = filepath.Join(env.Dir, "config.yaml")
		if err := os.WriteFile(s.config, []byte(config), 0o600); err != nil {
			return Result{}, fmt.Errorf("write config: %w", err)
		}
	}
	s.vars = outsideVars()
	return Drain(ctx, env, s)
}

// baselineWait reads how long a baseline child's handler waits for an
// outside call (envBaselineWait); zero when unset.
func baselineWait(c *ChildEnv) (time.Duration, error) {
	v := c.Getenv(envBaselineWait)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s: want a duration, got %s", envBaselineWait, strconv.Quote(v))
	}
	return d, nil
}
