package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// The hand-written watermill-sql consumer's variables, beside the AMQP
// baseline's envBaselineSubs.
const (
	envBaselineBatch = "EFFECTIVELY_BENCH_BATCH"
	envBaselineInTx  = "EFFECTIVELY_BENCH_SUBSCRIBER_TX"
	// sqlDefaultBatch is watermill-sql's SubscribeBatchSize by default.
	sqlDefaultBatch = 100
)

// sqlKnobs are the settings of the hand-written watermill-sql consumer
// that its pre-sweep tries: the router's subscriptions of the topic (all
// in one consumer group), watermill-sql's SubscribeBatchSize, and where
// the handler writes: its own transaction, or the subscriber's
// (sql.TxFromContext), which commits the batch's effects with the group's
// offset. Its pool holds a connection per subscription, and one more per
// subscription for handlers in their own transaction.
type sqlKnobs struct {
	subs, batch int
	inTx        bool
}

func (k sqlKnobs) String() string {
	where := "handler's own transaction"
	if k.inTx {
		where = "the subscriber's transaction"
	}
	conns := k.subs
	if !k.inTx {
		conns *= 2
	}
	return fmt.Sprintf("%s, %d subscriptions, batches of %d, pool %d", where, k.subs, k.batch, conns)
}

// sqlSweep is the grid of the hand-written watermill-sql consumer's
// pre-sweep: batches of 10, 100 and 1,000 rows, the handler in its own
// transaction with 1 and 4 subscriptions, and in the subscriber's with
// one. More subscriptions of one consumer group take turns: each read
// locks the group's offset row (FOR UPDATE) until its batch is acked, so
// 4 say whether they gain anything at all, and more would not. Its other
// settings (poll, resend and retry intervals, the ack deadline) count
// only when it idles or fails; watermill-sql's queue adapters need a
// table of another shape than the transport's documented one, and lock
// their rows FOR UPDATE too.
func sqlSweep() []sweepConfig[sqlKnobs] {
	var cs []sweepConfig[sqlKnobs]
	add := func(k sqlKnobs) { cs = append(cs, sweepConfig[sqlKnobs]{name: k.String(), config: k}) }
	for _, batch := range []int{10, 100, 1000} {
		add(sqlKnobs{subs: 1, batch: batch})
		add(sqlKnobs{subs: 4, batch: batch})
	}
	for _, batch := range []int{10, 100, 1000} {
		add(sqlKnobs{subs: 1, batch: batch, inTx: true})
	}
	return cs
}

// measurePostgresKnobs drains the hand-written watermill-sql consumer
// with knobs k.
func measurePostgresKnobs(ctx context.Context, env *Env, k sqlKnobs) (Result, error) {
	sys, err := newPostgresBaseline(ctx, env)
	if err != nil {
		return Result{}, err
	}
	sys.knobs = k
	return Drain(ctx, env, sys)
}

// measurePostgresBest sweeps the hand-written watermill-sql consumer's
// knobs once (sqlSweep) and drains the best configuration.
func measurePostgresBest(ctx context.Context, env *Env) (Result, error) {
	return measureBest(ctx, env, "watermill-sql", sqlSweep(), measurePostgresKnobs)
}

// sqlKnobsOf reads the knobs from the child's variables; unset, those of
// the earlier baseline (one subscription, batches of 100, the handler's
// own transaction).
func sqlKnobsOf(c *ChildEnv) (sqlKnobs, error) {
	k := sqlKnobs{subs: 1, batch: sqlDefaultBatch}
	var err error
	if c.Getenv(envBaselineSubs) != "" {
		if k.subs, err = positiveVar(c, envBaselineSubs); err != nil {
			return k, err
		}
	}
	if c.Getenv(envBaselineBatch) != "" {
		if k.batch, err = positiveVar(c, envBaselineBatch); err != nil {
			return k, err
		}
	}
	if v := c.Getenv(envBaselineInTx); v != "" {
		if k.inTx, err = strconv.ParseBool(v); err != nil {
			return k, fmt.Errorf("%s: %w", envBaselineInTx, err)
		}
	}
	return k, nil
}

// subscriberTxHandler is the hand-written handler that writes in the
// subscriber's transaction (sql.TxFromContext): the same dedup insert
// and business insert, committed with the consumer group's offset at the
// end of the subscriber's batch. A failed statement aborts that
// transaction, so the batch's offset is not stored and its messages come
// again, their effects with them.
func subscriberTxHandler(wait time.Duration) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		ev, err := decodeBaseline(msg)
		if err != nil {
			return err
		}
		ctx := msg.Context()
		tx, ok := wsql.TxFromContext(ctx)
		if !ok {
			return errors.New("no subscriber's transaction in the message's context")
		}
		if wait > 0 {
			if err := sleep(ctx, wait); err != nil {
				return fmt.Errorf("outside call: %w", err)
			}
		}
		return writeBaselineEffect[wsql.Result](ctx, tx, ev)
	}
}
