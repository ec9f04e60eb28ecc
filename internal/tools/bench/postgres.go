package bench

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jmoiron/sqlx"
)

// postgresScenario: the example service on the PostgreSQL transport
// against a hand-written watermill-sql consumer.
func postgresScenario() Scenario {
	return Scenario{
		Name:  "postgres",
		Title: "PostgreSQL transport",
		About: fmt.Sprintf("The example service (`EFFECTIVELY_TRANSPORT=postgres`, default configuration) on a schema of its "+
			"own, whose topic table already holds the messages, inserted by the documented `INSERT` (500 to a "+
			"transaction; in the latency phase one to a transaction). The baseline is the best of a hand-written "+
			"consumer's pre-sweep, measured in full rounds beside the others: a process of its own, watermill-sql's "+
			"subscriber with its default PostgreSQL schema and offsets adapter (a poll a second when idle), N router "+
			"handlers of one consumer group, batches of B rows (`SubscribeBatchSize`), and per message the dedup "+
			"insert and the business insert either in the handler's own transaction on the same pool (commit, then "+
			"the ack) or in the subscriber's transaction (`sql.TxFromContext`), committed with the group's offset "+
			"at the end of its batch. The pre-sweep drains each of B = 10, 100, 1,000 with the handler's own "+
			"transaction and N = 1 and 4 (one group's subscriptions take turns on its offset row's lock), and with the "+
			"subscriber's transaction and N = 1, once, at a quarter of the run's messages, and keeps the fastest; the "+
			"earlier baseline (N = 1, B = 100, the handler's own transaction) runs in full rounds too. In the "+
			"subscriber's transaction an effect's handled_at is its insert, before its batch commits: its figures "+
			"favour it by up to a batch's time. Gates: the default configuration at least %.0f× the best "+
			"hand-written consumer (the better of the pre-sweep's best and the earlier baseline, both in full rounds), "+
			"its start-up to first effect below %s.", PostgresGainGate, seconds(StartUpGate)),
		Needs: []Need{NeedPostgres},
		Runs: []Run{
			{Name: postgresDefault, Measure: measurePostgresService},
			{Name: postgresEarlier, NoSmoke: true, Measure: measurePostgresBaseline},
			{Name: postgresBest, Baseline: true, Measure: measurePostgresBest},
		},
		Children: []Child{{Name: "watermill-sql", Main: postgresBaselineMain}},
		Gate: &Gate{
			Run: postgresDefault, Among: []string{postgresBest, postgresEarlier}, Min: PostgresGainGate,
			And: &Gate{Run: postgresDefault, MaxStartUp: StartUpGate},
		},
	}
}

// The PostgreSQL scenario's runs that its gates name.
const (
	postgresDefault = "example service, default configuration"
	postgresEarlier = "hand-written watermill-sql, handler's own transaction, batches of 100 (the earlier baseline)"
	postgresBest    = "hand-written watermill-sql, the best of its pre-sweep"
)

// postgresInsert is the INSERT docs/transports.md documents.
// Its arguments are the event's id and the payload; the message's uuid is
// the id's last 36 characters, the most the column holds (the events of
// the larger runs have longer ids).
const postgresInsert = `INSERT INTO "watermill_` + EventType + `" (uuid, payload, metadata, transaction_id) VALUES (right($1, 36), $2, '{}', pg_current_xact_id())`

// postgresFeed is a foreign producer of the PostgreSQL transport: the
// documented INSERT into the topic's table, which it creates as
// watermill-sql does.
type postgresFeed struct {
	db *sqlx.DB
}

func newPostgresFeed(db *sqlx.DB) (*postgresFeed, error) {
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db.DB), wsql.SubscriberConfig{
		SchemaAdapter:  wsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
	}, quietLogger())
	if err != nil {
		return nil, fmt.Errorf("topic table: %w", err)
	}
	defer sub.Close()
	if err := sub.SubscribeInitialize(EventType); err != nil {
		return nil, fmt.Errorf("topic table: %w", err)
	}
	return &postgresFeed{db: db}, nil
}

func (f *postgresFeed) Feed(ctx context.Context, msgs []Message) error {
	return insertBatches(ctx, f.db, postgresInsert, msgs)
}

func (f *postgresFeed) Send(ctx context.Context, m Message) error {
	_, err := f.db.ExecContext(ctx, postgresInsert, m.ID, string(m.Body))
	return err
}

// postgresService is the example service on the PostgreSQL transport.
type postgresService struct {
	*postgresFeed
	env *Env
	url string
	// config is the service's configuration file; none when empty.
	config string
	// vars are the service's variables beside those of serviceVars.
	vars map[string]string
	// processes is how many processes of the service Start starts, all
	// consuming at once; one when zero.
	processes int
}

func measurePostgresService(ctx context.Context, env *Env) (Result, error) {
	sys, err := newPostgresService(ctx, env)
	if err != nil {
		return Result{}, err
	}
	return Drain(ctx, env, sys)
}

// newPostgresService prepares the example service on the PostgreSQL
// transport, in a schema of the run's own.
func newPostgresService(ctx context.Context, env *Env) (*postgresService, error) {
	url, db, err := serviceDB(ctx, env, "postgres")
	if err != nil {
		return nil, err
	}
	feed, err := newPostgresFeed(db)
	if err != nil {
		return nil, err
	}
	return &postgresService{postgresFeed: feed, env: env, url: url}, nil
}

func (s *postgresService) Start(ctx context.Context) (*Process, error) {
	vars := serviceVars("postgres", s.url, s.config)
	maps.Copy(vars, s.vars)
	return s.env.startServices(ctx, vars, s.processes)
}

func (s *postgresService) Effects() *EffectTable {
	return &EffectTable{DB: s.db, Table: "reminders", EventColumn: "event_id", Prefix: s.env.ID}
}

// envBaselineDB is the database of a baseline child.
const envBaselineDB = "EFFECTIVELY_BENCH_DATABASE_URL"

// postgresBaseline is the hand-written watermill-sql consumer.
type postgresBaseline struct {
	*postgresFeed
	env   *Env
	url   string
	knobs sqlKnobs
	// wait is how long the handler waits for an outside call; none when
	// zero.
	wait time.Duration
}

func measurePostgresBaseline(ctx context.Context, env *Env) (Result, error) {
	sys, err := newPostgresBaseline(ctx, env)
	if err != nil {
		return Result{}, err
	}
	return Drain(ctx, env, sys)
}

// newPostgresBaseline prepares the hand-written watermill-sql consumer,
// in a schema of the run's own.
func newPostgresBaseline(ctx context.Context, env *Env) (*postgresBaseline, error) {
	url, db, err := baselineDB(ctx, env)
	if err != nil {
		return nil, err
	}
	feed, err := newPostgresFeed(db)
	if err != nil {
		return nil, err
	}
	return &postgresBaseline{postgresFeed: feed, env: env, url: url, knobs: sqlKnobs{subs: 1, batch: sqlDefaultBatch}}, nil
}

func (b *postgresBaseline) Start(ctx context.Context) (*Process, error) {
	return b.env.StartChild(ctx, "watermill-sql", map[string]string{
		envBaselineDB:    b.url,
		envBaselineWait:  b.wait.String(),
		envBaselineSubs:  strconv.Itoa(b.knobs.subs),
		envBaselineBatch: strconv.Itoa(b.knobs.batch),
		envBaselineInTx:  strconv.FormatBool(b.knobs.inTx),
	})
}

func (b *postgresBaseline) Effects() *EffectTable {
	return &EffectTable{DB: b.db, Table: "bench_reminders", EventColumn: "event_id", Prefix: b.env.ID}
}

// postgresBaselineMain runs the hand-written watermill-sql consumer until
// ctx ends, with the knobs its variables set (sqlKnobs).
func postgresBaselineMain(ctx context.Context, c *ChildEnv) error {
	k, err := sqlKnobsOf(c)
	if err != nil {
		return err
	}
	// A connection for each subscription's transaction, and one for each
	// handler's own.
	conns := k.subs
	if !k.inTx {
		conns *= 2
	}
	db, err := openBaselineDB(c, conns)
	if err != nil {
		return err
	}
	defer db.Close()
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db.DB), wsql.SubscriberConfig{
		ConsumerGroup:    baselineConsumer,
		SchemaAdapter:    wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: k.batch},
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
	}, quietLogger())
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
	if k.inTx {
		handler = subscriberTxHandler(wait)
	}
	for i := range k.subs {
		router.AddConsumerHandler(fmt.Sprintf("reminders-%d", i+1), EventType, sub, handler)
	}
	return runRouter(ctx, router, c.Ready)
}
