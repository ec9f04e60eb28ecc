package app_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// resumeLimit is how soon after the promotion the consumer must take
// effect again.
const resumeLimit = 10 * time.Second

// failoverBundle is a service on a primary with a standby, given both in
// one URL (testserver.Pair.URL), on RabbitMQ or on the PostgreSQL
// transport.
type failoverBundle struct {
	*bundle
	pair *testserver.Pair
	def  framework.Definition[widgetAddedV1]
	// onAMQP says the transport is RabbitMQ's.
	onAMQP bool
	// queue is the consumer's name, and its queue on RabbitMQ.
	queue string
}

// setupFailover starts a pair (synchronous or not) and a service on it.
// Its event type and consumer have names of their own: the broker is
// shared, and its exchanges fan every event of a type out to every
// queue bound to it.
func setupFailover(t *testing.T, onAMQP, sync bool) *failoverBundle {
	t.Helper()
	pair := testserver.StartPair(t, sync)
	var cfg app.Config
	if onAMQP {
		cfg = amqpConfig(t)
	} else {
		cfg = testConfig(t)
		cfg.Transport = app.TransportPostgres
	}
	cfg.DatabaseURL = pair.URL("postgres")
	cfg.TransportURL = cfg.DatabaseURL
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	f := &failoverBundle{
		bundle: &bundle{cfg: cfg},
		pair:   pair,
		def:    framework.Define[widgetAddedV1]("failover.widget.added-"+suffix, 1),
		onAMQP: onAMQP,
		queue:  "widgets.failover-" + suffix,
	}
	f.service = app.New(
		handlers.Register(f.queue, handlers.On(f.def, newAddWidgetPostgres)),
		fx.Supply(widgetMigrations),
		fx.Replace(cfg),
		fx.Populate(&f.db, &f.transport, &f.http),
	)
	f.start(t)
	return f
}

// newAddWidgetPostgres is newAddWidget on PostgreSQL: one row per event,
// in the attempt's transaction.
func newAddWidgetPostgres(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
	return func(ctx context.Context, ev framework.Event[widgetAddedV1]) error {
		_, err := framework.Conn(ctx, db).ExecContext(ctx, `INSERT INTO widgets (name, event_id) VALUES ($1, $2)`, ev.Data.Name, ev.ID)
		return err
	}
}

// publish publishes event id, trying again while the transport fails (the
// PostgreSQL transport's publisher writes to the database that fails
// over): an event whose first try committed unseen comes twice, which is
// the consumer's to take once.
func (f *failoverBundle) publish(t *testing.T, id string) {
	t.Helper()
	env, err := f.def.Envelope(widgetAddedV1{Name: "sprocket"}, framework.Attributes{ID: id, Source: "widgets"})
	require.NoError(t, err)
	deadline := time.Now().Add(waitLimit)
	for {
		msg, err := framework.NewMessage(env)
		require.NoError(t, err)
		err = f.transport.Publisher().Publish(f.def.Type(), msg)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("publish %s: %v", id, err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// publishAll publishes prefix-0 .. prefix-(n-1), one every gap.
func (f *failoverBundle) publishAll(t *testing.T, prefix string, n int, gap time.Duration) {
	t.Helper()
	for i := range n {
		f.publish(t, fmt.Sprintf("%s-%03d", prefix, i))
		time.Sleep(gap)
	}
}

// effects counts the widgets of events whose id starts with prefix, on
// db (the service's pool, which follows the failover).
func effects(t *testing.T, db *sqlx.DB, prefix string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM widgets WHERE event_id LIKE $1`, prefix+"-%"))
	return n
}

// waitEffects waits until the events of prefix took effect n times,
// tolerating the errors of a database that is failing over.
func waitEffects(t *testing.T, db *sqlx.DB, prefix string, n int) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		var got int
		err := db.Get(&got, `SELECT count(DISTINCT event_id) FROM widgets WHERE event_id LIKE $1`, prefix+"-%")
		if err == nil && got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the %s events: %d of %d took effect within %s (last error: %v)", prefix, got, n, waitLimit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// requireOnceEach checks that every event of prefix-0 .. prefix-(n-1)
// took effect exactly once, and that nothing was dead-lettered.
func requireOnceEach(t *testing.T, db *sqlx.DB, prefix string, n int) {
	t.Helper()
	var rows []struct {
		ID string `db:"event_id"`
		N  int    `db:"n"`
	}
	require.NoError(t, db.Select(&rows, `SELECT event_id, count(*) AS n FROM widgets WHERE event_id LIKE $1 GROUP BY event_id ORDER BY event_id`, prefix+"-%"))
	got := make(map[string]int, len(rows))
	for _, r := range rows {
		got[r.ID] = r.N
	}
	for i := range n {
		id := fmt.Sprintf("%s-%03d", prefix, i)
		require.Equal(t, 1, got[id], "effects of %s", id)
	}
	require.Len(t, got, n, "no effect of an event not published")
	var dead int
	require.NoError(t, db.Get(&dead, `SELECT count(*) FROM dead_letters`))
	require.Zero(t, dead, "no valid event dead-lettered")
}

// waitResumed waits until the events of prefix took effect more than
// before times, and returns how long after since it was.
func waitResumed(t *testing.T, db *sqlx.DB, prefix string, before int, since time.Time) time.Duration {
	t.Helper()
	for {
		var n int
		if err := db.Get(&n, `SELECT count(*) FROM widgets WHERE event_id LIKE $1`, prefix+"-%"); err == nil && n > before {
			return time.Since(since)
		}
		if time.Since(since) > resumeLimit {
			t.Fatalf("no effect within %s of the promotion", resumeLimit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFailoverSync kills the primary under load, a few hundred events
// published in a stream, and promotes its synchronous standby: the
// service, given both in one URL, carries on against the new primary
// within resumeLimit, and every event takes effect exactly once, none
// dead-lettered: a commit the service saw reached the standby, and one
// it did not see is retried, or found done by the processed mark.
func TestFailoverSync(t *testing.T) {
	t.Parallel()
	onEachTransport(t, testFailoverSync)
}

// onEachTransport runs test in parallel subtests on RabbitMQ (onAMQP)
// and on the PostgreSQL transport.
func onEachTransport(t *testing.T, test func(t *testing.T, onAMQP bool)) {
	for _, tc := range []struct {
		name   string
		onAMQP bool
	}{{"AMQP", true}, {"Postgres", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			test(t, tc.onAMQP)
		})
	}
}

func testFailoverSync(t *testing.T, onAMQP bool) {
	f := setupFailover(t, onAMQP, true)
	const n = 300
	var published sync.WaitGroup
	published.Add(1)
	go func() {
		defer published.Done()
		f.publishAll(t, "s", n, 10*time.Millisecond)
	}()
	waitEffectsAtLeast(t, f.db, "s", 60)

	killedAt := time.Now()
	f.pair.Primary.Kill(t)
	newPrimary := openStandby(t, f.pair)
	done := effects(t, newPrimary, "s") // a hot standby reads
	time.Sleep(time.Second)             // the outage: the standby is not promoted yet
	f.pair.Standby.Promote(t)
	promotedAt := time.Now()
	before := effects(t, newPrimary, "s")
	resumed := waitResumed(t, newPrimary, "s", before, promotedAt)

	published.Wait()
	waitEffects(t, newPrimary, "s", n)
	requireOnceEach(t, newPrimary, "s", n)
	var named int
	require.NoError(t, newPrimary.Get(&named, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND application_name <> ''`))
	require.Positive(t, named, "the service's connections to the new primary carry its name (application_name)")
	t.Logf("%d events, the primary killed after %d had taken effect, promoted %s later; effects again %s after the promotion; all %d once each, none dead-lettered, %s after the kill",
		n, done, promotedAt.Sub(killedAt).Round(time.Millisecond), resumed.Round(time.Millisecond), n, time.Since(killedAt).Round(time.Millisecond))
}

// waitEffectsAtLeast waits until at least n events of prefix took effect.
func waitEffectsAtLeast(t *testing.T, db *sqlx.DB, prefix string, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d %s events", n, prefix), func() bool { return effects(t, db, prefix) >= n })
}

// TestFailoverAsyncLoses shows what asynchronous replication loses, on
// each transport: the standby is stopped (as a standby that lags does,
// only surely) while events take effect on the primary; the primary is
// killed and the standby promoted without them. Their effects are gone,
// and their messages too, for good: on RabbitMQ they were acknowledged
// after the commits the failover lost; on the PostgreSQL transport the
// messages' rows were on the primary alone. The events before and after
// take effect exactly once, the service consuming again within
// resumeLimit of the promotion.
func TestFailoverAsyncLoses(t *testing.T) {
	t.Parallel()
	onEachTransport(t, testFailoverAsyncLoses)
}

func testFailoverAsyncLoses(t *testing.T, onAMQP bool) {
	f := setupFailover(t, onAMQP, false)
	const n = 50
	f.publishAll(t, "a", n, 0)
	waitEffects(t, f.db, "a", n)
	f.pair.WaitReplayed(t)

	f.pair.Standby.Stop(t) // the standby receives nothing more
	f.publishAll(t, "l", n, 0)
	waitEffects(t, f.db, "l", n)
	if !onAMQP {
		require.Equal(t, n, f.messageRows(t, f.db, "l"), "the messages' rows are on the primary")
	}
	time.Sleep(500 * time.Millisecond) // the acks that follow the last commits

	killedAt := time.Now()
	f.pair.Primary.Kill(t)
	f.pair.Standby.Start(t)
	f.pair.Standby.Promote(t)
	promotedAt := time.Now()
	newPrimary := openStandby(t, f.pair)
	var published sync.WaitGroup
	published.Add(1)
	go func() {
		defer published.Done()
		f.publishAll(t, "b", n, 0)
	}()
	resumed := waitResumed(t, newPrimary, "b", 0, promotedAt)
	published.Wait()
	waitEffects(t, newPrimary, "b", n)
	time.Sleep(2 * time.Second) // time for anything lost to come back, were it to

	requireOnceEach(t, newPrimary, "a", n)
	requireOnceEach(t, newPrimary, "b", n)
	require.Zero(t, effects(t, newPrimary, "l"), "the effects the failover lost")
	if onAMQP {
		require.Zero(t, f.queued(t), "the lost events' messages, acknowledged, are not in the queue")
	} else {
		require.Zero(t, f.messageRows(t, newPrimary, "l"), "the lost events' messages are gone with their rows")
	}
	t.Logf("%d events took effect on the primary alone and were lost with it (effects and messages); %d before and %d after once each; effects again %s after the promotion (%s after the kill)",
		n, n, n, resumed.Round(time.Millisecond), promotedAt.Sub(killedAt).Round(time.Millisecond))
}

// openStandby opens a pool on the pair's standby alone, closed when the
// test ends.
func openStandby(t *testing.T, p *testserver.Pair) *sqlx.DB {
	t.Helper()
	db, err := sqlx.Open("pgx", p.Standby.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// messageRows counts the PostgreSQL transport's rows of the events of
// prefix (a message's uuid is its event's id).
func (f *failoverBundle) messageRows(t *testing.T, db *sqlx.DB, prefix string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM `+postgres.MessagesTable(f.cfg.TablePrefix, f.def.Type())+` WHERE uuid LIKE $1`, prefix+"-%"))
	return n
}

// queued returns how many messages wait in the consumer's queue, ready
// for delivery. (One delivered and not acknowledged would come back to
// the service, and take effect: effects count it.)
func (f *failoverBundle) queued(t *testing.T) int {
	t.Helper()
	conn, err := amqp091.Dial(testenv.Require(t, testenv.AMQPURLVar))
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(f.queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}
