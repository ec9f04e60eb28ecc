package soak

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/handlers"
)

// Names of the soak's service.
const (
	// Source is the CloudEvents source of the soak's events.
	Source = "soak"
	// EffectsConsumer applies every event once, failing first attempts.
	EffectsConsumer = "soak.effects"
	// ProjectionConsumer applies each subject's events in sequence
	// (strict_order) and checks that it does.
	ProjectionConsumer = "soak.projection"
)

// Environment of the soak's service.
const (
	// EnvRole is consumer (the default) or producer.
	EnvRole = "EFFECTIVELY_SOAK_ROLE"
	// EnvOutsideWait, a duration, makes a consumer's handlers wait that
	// long before their statements, as a call outside the database
	// would: the process's attempts then overlap, each one's transaction
	// begun at its handler's first statement, instead of gathering into
	// batches (see consumerEnv).
	EnvOutsideWait = "EFFECTIVELY_SOAK_OUTSIDE_WAIT"
	// EnvEvents, EnvSeed and EnvRate are the producer's plan (NewPlan)
	// and how many events per second it writes.
	EnvEvents = "EFFECTIVELY_SOAK_EVENTS"
	EnvSeed   = "EFFECTIVELY_SOAK_SEED"
	EnvRate   = "EFFECTIVELY_SOAK_RATE"
)

// RecordedV1 is the data of the soak's event.
type RecordedV1 struct {
	Seq       int64 `json:"seq"`
	Prev      int64 `json:"prev"`
	FailFirst bool  `json:"failFirst,omitempty"`
	Poison    bool  `json:"poison,omitempty"`
}

// RecordedV2 is a version no consumer of the soak handles: poison at
// decode.
type RecordedV2 struct {
	Seq int64 `json:"seq"`
}

// Recorded and RecordedPoison are the soak's event, versions 1 and 2.
var (
	Recorded       = framework.Define[RecordedV1]("soak.item.recorded", 1)
	RecordedPoison = framework.Define[RecordedV2]("soak.item.recorded", 2)
)

//go:embed migrations/*.sql
var migrations embed.FS

// ServiceModule is the soak's service, for app.Main: with role producer
// (EnvRole) it writes the plan through the outbox, which its relay
// publishes; otherwise it runs the two consumers.
func ServiceModule() fx.Option {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fx.Error(fmt.Errorf("soak migrations: %w", err))
	}
	opts := []fx.Option{fx.Supply(app.Migrations{FS: sub})}
	if os.Getenv(EnvRole) == "producer" {
		return fx.Options(append(opts, fx.Invoke(startProducer))...)
	}
	return fx.Options(append(opts,
		handlers.Register(EffectsConsumer, handlers.On(Recorded, newApplyEffect)),
		handlers.Register(ProjectionConsumer, handlers.On(Recorded, newProject)),
	)...)
}

// failFirst refuses a poison event, and returns an error the first time
// consumer handles ev when the event asks for it: the attempt is recorded
// outside the attempt's transaction, so that the retry passes.
func failFirst(ctx context.Context, db *sqlx.DB, consumer string, ev framework.Event[RecordedV1]) error {
	if ev.Data.Poison {
		return framework.Permanent("poison", fmt.Errorf("%s is poison", ev.ID))
	}
	if !ev.Data.FailFirst {
		return nil
	}
	res, err := db.ExecContext(ctx, `INSERT INTO soak_attempts (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, consumer, ev.ID)
	if err != nil {
		return fmt.Errorf("record first attempt: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return errors.New("soak: first attempt fails on purpose")
	}
	return nil
}

// outsideWait is EnvOutsideWait's duration, which a handler sleeps
// before its statements; zero when it is not set.
func outsideWait() time.Duration {
	d, _ := time.ParseDuration(os.Getenv(EnvOutsideWait)) // set by the soak, which sets it right
	return d
}

// consumerEnv returns the environment of the consumer process name: the
// second one's handlers wait outside the database (EnvOutsideWait), so
// that in each run one process gathers its attempts into batches and
// the other overlaps them, each transaction begun at its handler's
// first statement.
func consumerEnv(name string, vars []string) []string {
	if name != "consumer-2" {
		return vars
	}
	return append(slices.Clip(vars), EnvOutsideWait+"=3ms")
}

func newApplyEffect(db *sqlx.DB) framework.HandlerFunc[RecordedV1] {
	wait := outsideWait()
	return func(ctx context.Context, ev framework.Event[RecordedV1]) error {
		time.Sleep(wait) // the call outside the database (EnvOutsideWait): a few ms
		if err := failFirst(ctx, db, EffectsConsumer, ev); err != nil {
			return err
		}
		_, err := framework.Conn(ctx, db).ExecContext(ctx,
			`INSERT INTO soak_effects (consumer, event_id) VALUES ($1, $2)`, EffectsConsumer, ev.ID)
		if err != nil {
			return fmt.Errorf("effect of %s: %w", ev.ID, err)
		}
		return nil
	}
}

func newProject(db *sqlx.DB) framework.HandlerFunc[RecordedV1] {
	wait := outsideWait()
	return func(ctx context.Context, ev framework.Event[RecordedV1]) error {
		time.Sleep(wait) // the call outside the database (EnvOutsideWait): a few ms
		if err := failFirst(ctx, db, ProjectionConsumer, ev); err != nil {
			return err
		}
		conn := framework.Conn(ctx, db)
		var last int64
		err := sqlx.GetContext(ctx, conn, &last, `SELECT last_seq FROM soak_projection WHERE subject = $1`, ev.Subject)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("projection of %s: %w", ev.Subject, err)
		}
		if last != ev.Data.Prev {
			return framework.Permanent("out_of_order", fmt.Errorf("#%d of %s after #%d, not #%d", ev.Data.Seq, ev.Subject, last, ev.Data.Prev))
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO soak_projection (subject, last_seq, applied) VALUES ($1, $2, 1)
ON CONFLICT (subject) DO UPDATE SET last_seq = excluded.last_seq, applied = soak_projection.applied + 1`, ev.Subject, ev.Data.Seq); err != nil {
			return fmt.Errorf("projection of %s: %w", ev.Subject, err)
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO soak_effects (consumer, event_id) VALUES ($1, $2)`, ProjectionConsumer, ev.ID); err != nil {
			return fmt.Errorf("effect of %s: %w", ev.ID, err)
		}
		return nil
	}
}

// producerParams are what startProducer takes from fx.
type producerParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	DB        *sqlx.DB
	Outbox    *outbox.Outbox
	Transport driver.Transport
}

// producer writes a plan's events through the outbox, a batch per
// transaction at a steady rate, and publishes the duplicates itself.
type producer struct {
	producerParams
	plan Plan
	rate float64
}

const producerBatch = 50

func startProducer(p producerParams) error {
	n, err := strconv.Atoi(os.Getenv(EnvEvents))
	if err != nil {
		return fmt.Errorf("soak producer: %s: %w", EnvEvents, err)
	}
	seed, err := strconv.ParseUint(os.Getenv(EnvSeed), 10, 64)
	if err != nil {
		return fmt.Errorf("soak producer: %s: %w", EnvSeed, err)
	}
	rate, err := strconv.ParseFloat(os.Getenv(EnvRate), 64)
	if err != nil || rate <= 0 {
		return fmt.Errorf("soak producer: %s: a positive number: %q", EnvRate, os.Getenv(EnvRate))
	}
	pr := &producer{producerParams: p, plan: NewPlan(n, seed), rate: rate}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(context.Context) error {
			go func() { defer close(done); pr.run(ctx) }()
			return nil
		},
		OnStop: func(stop context.Context) error {
			cancel()
			select {
			case <-done:
				return nil
			case <-stop.Done():
				return stop.Err()
			}
		},
	})
	return nil
}

func (p *producer) run(ctx context.Context) {
	var from int64
	if err := p.DB.GetContext(ctx, &from, `SELECT events FROM soak_produced WHERE id = 1`); err != nil {
		slog.Error("soak producer: read progress", "err", err)
		return
	}
	interval := time.Duration(float64(time.Second) * producerBatch / p.rate)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := int(from); i < len(p.plan.Items); {
		end := min(i+producerBatch, len(p.plan.Items))
		for {
			err := p.write(ctx, p.plan.Items[i:end])
			if err == nil {
				break
			}
			slog.Warn("soak producer: write again", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		i = end
	}
}

// write records batch in one transaction with the progress, then
// publishes its duplicates.
func (p *producer) write(ctx context.Context, batch []Item) error {
	envs := make([]framework.Envelope, 0, len(batch))
	for _, it := range batch {
		env, err := envelope(it)
		if err != nil {
			return err
		}
		envs = append(envs, env)
	}
	tx, err := p.DB.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := p.Outbox.AddTx(ctx, tx, envs...); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE soak_produced SET events = events + $1 WHERE id = 1`, len(batch)); err != nil {
		return fmt.Errorf("progress: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	for k, it := range batch {
		if it.Duplicate {
			p.publishAgain(ctx, envs[k])
		}
	}
	return nil
}

// publishAgain publishes env outside the outbox, until it is confirmed.
func (p *producer) publishAgain(ctx context.Context, env framework.Envelope) {
	for ctx.Err() == nil {
		msg, err := framework.NewMessage(env)
		if err == nil {
			err = p.Transport.Publisher().Publish(env.Type, msg)
		}
		if err == nil {
			_, err = p.DB.ExecContext(ctx, `UPDATE soak_produced SET duplicates = duplicates + 1 WHERE id = 1`)
		}
		if err == nil {
			return
		}
		slog.Warn("soak producer: publish the duplicate again", "err", err)
		time.Sleep(200 * time.Millisecond)
	}
}

// envelope returns the event of it: version 2 when it is undecodable.
func envelope(it Item) (framework.Envelope, error) {
	attrs := framework.Attributes{ID: it.ID, Source: Source, Subject: it.Subject, SubjectSeq: it.Seq}
	if it.Undecodable {
		return RecordedPoison.Envelope(RecordedV2{Seq: it.Seq}, attrs)
	}
	return Recorded.Envelope(RecordedV1{Seq: it.Seq, Prev: it.Prev, FailFirst: it.FailFirst, Poison: it.Poison}, attrs)
}
