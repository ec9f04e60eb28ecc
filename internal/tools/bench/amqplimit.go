package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// The hand-optimized limit consumer's size: what a team tuning one
// process for this queue and these two tables alone would write.
const (
	// limitBatch is the most deliveries one of its transactions writes.
	limitBatch = 500
	// limitWriters is how many batches it writes at once, each on a
	// connection of its own, while the next one gathers.
	limitWriters = 3
	// limitPrefetch is its channel's prefetch: the batches being written
	// and the one gathering, full.
	limitPrefetch = limitBatch * (limitWriters + 1)
)

// limitInsert writes a batch in one statement, so in one transaction
// and one round trip: the dedup marks of its events ($2 sources, $3
// ids), and the business rows ($4 appointments, $5 starts) of those
// whose mark was new. The batch holds each event once.
const limitInsert = `WITH new AS (
    INSERT INTO bench_processed (consumer, source, event_id)
    SELECT $1, s, e FROM unnest($2::text[], $3::text[]) AS t(s, e)
    ON CONFLICT DO NOTHING
    RETURNING source, event_id
)
INSERT INTO bench_reminders (appointment_id, starts_at, event_id)
SELECT t.a, t.st, t.e FROM unnest($2::text[], $3::text[], $4::text[], $5::text[]) AS t(s, e, a, st)
JOIN new ON new.source = t.s AND new.event_id = t.e`

// measureAMQPLimit drains the hand-optimized consumer (amqpLimitMain):
// the machine's limit for the AMQP scenario's work in one process.
func measureAMQPLimit(ctx context.Context, env *Env) (Result, error) {
	sys, err := newAMQPBaseline(ctx, env)
	if err != nil {
		return Result{}, err
	}
	sys.child = "limit"
	return Drain(ctx, env, sys)
}

// limitBatchOf is a batch the limit consumer gathered: its deliveries'
// last tag (the channel's tags grow in delivery order) and the rows to
// write.
type limitBatchOf struct {
	seq                                int
	lastTag                            uint64
	sources, ids, appointments, starts []string
}

// limitDone is a batch written, or the error that stopped it.
type limitDone struct {
	seq     int
	lastTag uint64
	err     error
}

// amqpLimitMain is the hand-optimized consumer: plain amqp091-go on one
// channel with a prefetch of limitPrefetch, and pgx's pool. It gathers
// the deliveries into batches of up to limitBatch, each growing until a
// writer is free (gatherBatches), writes up to limitWriters of them at
// once with limitInsert, and acks each batch with one multiple ack of its last
// tag once it and every batch before it committed. A failure ends the
// process (the drain then fails): it is a limit, not a consumer to run.
func amqpLimitMain(ctx context.Context, c *ChildEnv) error {
	cfg, err := pgxpool.ParseConfig(c.Getenv(envBaselineDB))
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	cfg.MaxConns = limitWriters
	cfg.MinConns = limitWriters
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer pool.Close()
	conn, err := amqp091.Dial(c.Getenv(envBaselineAMQP))
	if err != nil {
		return fmt.Errorf("dial RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("channel: %w", err)
	}
	if err := ch.Qos(limitPrefetch, 0, false); err != nil {
		return fmt.Errorf("qos: %w", err)
	}
	deliveries, err := ch.ConsumeWithContext(ctx, c.Getenv(envBaselineQueue), "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	c.Ready()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := make(chan limitBatchOf)
	done := make(chan limitDone, limitWriters)
	for range limitWriters {
		go func() {
			for b := range batches {
				err := writeLimitBatch(ctx, pool, b)
				select {
				case done <- limitDone{seq: b.seq, lastTag: b.lastTag, err: err}:
				case <-ctx.Done():
				}
			}
		}()
	}
	acked := make(chan error, 1)
	go func() {
		err := ackInOrder(ctx, ch, done)
		cancel() // a failure stops the gathering too
		acked <- err
	}()
	err = gatherBatches(ctx, deliveries, batches)
	close(batches)
	cancel()
	return errors.Join(ignoreCanceled(err), ignoreCanceled(<-acked))
}

// writeLimitBatch writes b with limitInsert, its rows sorted by key so
// that two batches writing the same marks (a duplicate in each) lock
// them in the same order, and tries again, up to 5 times, when
// PostgreSQL ends it as a deadlock or a serialization failure anyway.
func writeLimitBatch(ctx context.Context, pool *pgxpool.Pool, b limitBatchOf) error {
	order := make([]int, len(b.ids))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(i, j int) int {
		return cmp.Or(cmp.Compare(b.sources[i], b.sources[j]), cmp.Compare(b.ids[i], b.ids[j]))
	})
	sorted := func(v []string) []string {
		out := make([]string, len(order))
		for k, i := range order {
			out[k] = v[i]
		}
		return out
	}
	sources, ids, appointments, starts := sorted(b.sources), sorted(b.ids), sorted(b.appointments), sorted(b.starts)
	var err error
	for range 5 {
		_, err = pool.Exec(ctx, limitInsert, baselineConsumer, sources, ids, appointments, starts)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "40P01" && pgErr.Code != "40001" {
			return err
		}
	}
	return err
}

// gatherBatches reads deliveries into batches until ctx ends or the
// deliveries do. A batch goes to batches as soon as a writer takes it,
// and grows meanwhile, up to limitBatch: group commit, so that the
// batches are as big as the writers' pace makes them.
func gatherBatches(ctx context.Context, deliveries <-chan amqp091.Delivery, batches chan<- limitBatchOf) error {
	b := limitBatchOf{}
	seen := make(map[[2]string]bool)
	for {
		var out chan<- limitBatchOf // nil, so never ready, while the batch is empty
		in := deliveries
		if len(b.ids) > 0 || b.lastTag != 0 {
			out = batches
		}
		if len(b.ids) >= limitBatch {
			in = nil // full: only hand it out
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case out <- b:
			b = limitBatchOf{seq: b.seq + 1}
			clear(seen)
		case d, ok := <-in:
			if !ok {
				return errors.New("deliveries closed")
			}
			b.lastTag = d.DeliveryTag
			var ev cloudEvent
			if err := json.Unmarshal(d.Body, &ev); err != nil {
				return fmt.Errorf("decode: %w", err)
			}
			key := [2]string{ev.Source, ev.ID}
			if seen[key] {
				continue // a duplicate within the batch: its ack is the batch's
			}
			seen[key] = true
			b.sources = append(b.sources, ev.Source)
			b.ids = append(b.ids, ev.ID)
			b.appointments = append(b.appointments, ev.Data.AppointmentID)
			b.starts = append(b.starts, ev.Data.StartsAt.UTC().Format(time.RFC3339))
		}
	}
}

// ackInOrder acks the batches written, in the order they were gathered:
// a batch's multiple ack also acks every delivery before it, so it waits
// until those batches committed too.
func ackInOrder(ctx context.Context, ch *amqp091.Channel, done <-chan limitDone) error {
	next := 0
	waiting := make(map[int]uint64)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case d := <-done:
			if d.err != nil {
				return fmt.Errorf("write batch: %w", d.err)
			}
			waiting[d.seq] = d.lastTag
			for {
				tag, ok := waiting[next]
				if !ok {
					break
				}
				delete(waiting, next)
				next++
				if err := ch.Ack(tag, true); err != nil {
					return fmt.Errorf("ack: %w", err)
				}
			}
		}
	}
}

// ignoreCanceled returns err but for the end of the context, which is
// how the child stops.
func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
