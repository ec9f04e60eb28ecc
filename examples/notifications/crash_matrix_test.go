package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/examples/notifications/appointments"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/internal/testenv"
)

// The crash matrix kills the service subprocess with SIGKILL at one crash
// point per cell, on each set-up (SQLite; PostgreSQL with its SQL
// transport; RabbitMQ with the stores in PostgreSQL), restarts it until
// every message is handled, and checks what a crash must never do: an
// event without its effect or with two, a dead letter lost or doubled, a
// message left waiting. The points of a group-commit batch are
// TestCrashInBatch's (crash_batch_test.go), the replay relay's
// TestReplayCrash's (package app): see docs/reliability.md.

// envCrashSlow, set to 1, runs the slow cells too (make soak sets it):
// a relay killed on SQLite leaves its rows leased for twice the relay's
// batch timeout, a minute.
const envCrashSlow = "EFFECTIVELY_CRASH_SLOW"

// matrixConfig is the consumer's configuration in the matrix: one
// attempt per delivery, so that a poison message is dead-lettered at its
// first delivery; a short timeout, so that a killed process's SQLite
// leases (twice the timeout) end soon; and room for the deliveries that
// the kills cost (up to two per cell).
const matrixConfig = `defaults:
  max_deliveries: 5
  attempts: 1
  timeout: %s
  retry_delay: 10ms
`

// cellSetup is a set-up of the group-commit crash tests that publishes
// messages as they are.
type cellSetup struct {
	*batchSetup
	// publishMsgs publishes msgs, as another process would.
	publishMsgs func(t *testing.T, msgs []*message.Message)
}

// matrixCell is one crash point of the matrix.
type matrixCell struct {
	name string
	// at are the points the service dies at, one per run, in order.
	at []crash.Point
	// poison makes the cell's event the poison message: the points are
	// those of its dead letter.
	poison bool
	// outbox publishes the events through the outbox, which the
	// service's relay publishes, instead of straight to the transport.
	outbox bool
	// slowOn names the set-ups where the cell runs only with
	// envCrashSlow.
	slowOn string
	// catches is what the cell fails on: the bug a crash at its point
	// would reveal.
	catches string
}

// matrixCells are the cells of every set-up.
var matrixCells = []matrixCell{
	{name: "AfterDecode", at: []crash.Point{crash.AfterDecode},
		catches: "a message acknowledged on receipt, before its effect"},
	{name: "AfterCount", at: []crash.Point{crash.AfterDecode, crash.AfterCount},
		catches: "a delivery count that survives the kill and refuses the event, or counts a lost ack as a failure"},
	{name: "AfterMark", at: []crash.Point{crash.AfterMark},
		catches: "a processed mark committed apart from the handler's writes: the redelivery is taken for a duplicate and the effect lost"},
	{name: "AfterHandlerBeforeCommit", at: []crash.Point{crash.BeforeCommit},
		catches: "the handler's writes committed apart from the mark (two effects), or the message acknowledged before the commit (none)"},
	{name: "AfterCommitBeforeAck", at: []crash.Point{crash.AfterCommit},
		catches: "a redelivery of a committed event run again: two effects"},
	{name: "BeforeAck", at: []crash.Point{crash.BeforeAck},
		catches: "a redelivery of a committed event run again: two effects"},
	{name: "InDeadLetterWrite", at: []crash.Point{crash.BeforeDeadLetter}, poison: true,
		catches: "a poison message acknowledged before its dead letter is stored: the dead letter lost"},
	{name: "DeadLetterStoredBeforeAck", at: []crash.Point{crash.BeforeAck}, poison: true,
		catches: "a dead letter stored twice when its message comes again"},
	{name: "OutboxRelayBeforeMarkSent", at: []crash.Point{crash.BeforeOutboxSent}, outbox: true, slowOn: "SQLite",
		catches: "rows marked sent before they are published (lost), or a republished event run twice"},
}

// matrixSetups are the set-ups of the matrix.
var matrixSetups = []struct {
	name  string
	setup func(t *testing.T, cell string) *cellSetup
}{
	{"SQLite", sqliteMatrixSetup},
	{"Postgres", postgresMatrixSetup},
	{"AMQP", amqpMatrixSetup},
}

// TestCrashMatrix kills the service at each crash point on each set-up,
// every cell in parallel, each with a database (a SQLite file, a
// PostgreSQL schema) and a consumer (a queue) of its own. Three good
// bookings and a poison message per cell: after the restarts each
// booking has its effect once, the poison message one dead letter, and
// no message, outbox row or parked event waits.
func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	for _, s := range matrixSetups {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range matrixCells {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					if c.slowOn == s.name && os.Getenv(envCrashSlow) != "1" {
						t.Skipf("slow on %s: runs with %s=1 (make soak)", s.name, envCrashSlow)
					}
					testCrashCell(t, s.setup(t, c.name), c)
				})
			}
		})
	}
}

// testCrashCell runs one cell.
func testCrashCell(t *testing.T, s *cellSetup, c matrixCell) {
	prefix := strings.ToLower(c.name) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	good := []string{prefix + "-1", prefix + "-2", prefix + "-3"}
	poison := prefix + "-poison"
	target := good[1]
	if c.poison {
		target = poison
	}
	marker := filepath.Join(s.dir, "crashed")
	points := make([]string, len(c.at))
	for i, p := range c.at {
		points[i] = string(p)
	}
	env := []string{envCrashAt + "=" + strings.Join(points, ","), envCrashEvent + "=" + target}

	msgs := append(bookings(t, good), poisonMessage(t, poison))
	if c.outbox {
		// The service creates the outbox (and, on RabbitMQ, binds its
		// queue) in a first run; the test then adds the events to the
		// outbox, as a service's handler would.
		first := s.start(t, modeNone, marker)
		first.stop(t)
		addToOutbox(t, s, msgs)
	} else {
		s.publishMsgs(t, msgs)
	}

	done := func() bool {
		return s.effects(good) == len(good) && s.deadLetters(poison) == 1
	}
	for _, p := range c.at {
		svc := startService(t, s.dir, modePoints, append(append([]string{envCrashMarker + "=" + marker}, env...), s.env...)...)
		svc.waitKilledUnless(t, fmt.Sprintf("every event handled and the service never reached %s", p), func() bool {
			return !fired(pointMarker(marker, p)) && done()
		})
		require.True(t, fired(pointMarker(marker, p)), "killed at %s", p)
	}

	// Every marker exists: the service runs normally from now on.
	s.drainUntil(t, modePoints, marker, env, done)
	for _, id := range good {
		s.requireOnce(t, id)
	}
	require.Equal(t, 0, s.reminders(poison), "the poison message has no effect")
	require.Equal(t, 0, s.marks(poison), "the poison message is not marked processed")
	require.Equal(t, 1, s.deadLetters(poison), "the poison message has one dead letter")
	require.Equal(t, 1, count(s.db, s.db.Rebind(`SELECT count(*) FROM dead_letters WHERE consumer = ? AND event_id = ? AND status = ?`),
		s.consumer, poison, string(framework.DeadLetterPending)), "the dead letter waits for an operator")
	require.Equal(t, 0, count(s.db, s.db.Rebind(`SELECT count(*) FROM parked_events WHERE consumer = ?`), s.consumer), "nothing parked")
	require.Equal(t, 0, count(s.db, `SELECT count(*) FROM outbox WHERE sent_at IS NULL`), "nothing unsent in the outbox")
	require.Zero(t, s.pending(t), "no message waits")
}

// drainUntil runs the service with the hook of mode (every marker
// exists: it runs normally) until done holds and no message waits, then
// stops it; on AMQP, messages taken and not handled go back to the queue
// at the stop: then it runs again.
func (s *batchSetup) drainUntil(t *testing.T, mode, marker string, env []string, done func() bool) {
	t.Helper()
	for range 3 {
		svc := startService(t, s.dir, mode, append(append([]string{envCrashMarker + "=" + marker}, env...), s.env...)...)
		svc.waitFor(t, "every event handled, and no message waiting", func() bool {
			return done() && s.pending(t) == 0
		})
		svc.stop(t)
		if s.pending(t) == 0 {
			return
		}
	}
	t.Fatalf("%d messages still wait after three runs", s.pending(t))
}

// poisonMessage returns a booking whose data breaks the contract: no
// appointment id, a start that is no time.
func poisonMessage(t *testing.T, id string) *message.Message {
	t.Helper()
	msg, err := framework.NewMessage(framework.Envelope{
		Attributes: framework.Attributes{
			ID: id, Source: appointments.Source,
			Type: appointments.Booked.Type(), Version: appointments.Booked.Version(),
		},
		Data: []byte(`{"startsAt":"tomorrow at ten"}`),
	})
	require.NoError(t, err)
	return msg
}

// addToOutbox adds the events of msgs to the outbox of the set-up's
// database, in one transaction.
func addToOutbox(t *testing.T, s *cellSetup, msgs []*message.Message) {
	t.Helper()
	ob, err := outbox.New(s.db, outbox.Config{})
	require.NoError(t, err)
	envs := make([]framework.Envelope, len(msgs))
	for i, msg := range msgs {
		envs[i], err = framework.DecodeMessage(msg, 0)
		require.NoError(t, err)
	}
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	require.NoError(t, ob.AddTx(t.Context(), tx, envs...))
	require.NoError(t, tx.Commit())
}

// matrixSetup returns a set-up whose service runs the consumer consumer
// with the matrix's configuration and env.
func matrixSetup(t *testing.T, consumer string, timeout time.Duration, env ...string) *cellSetup {
	t.Helper()
	dir := t.TempDir()
	configPath := filepath.Join(dir, "effectively.yaml")
	require.NoError(t, os.WriteFile(configPath, []byte(fmt.Sprintf(matrixConfig, timeout)), 0o600))
	return &cellSetup{batchSetup: &batchSetup{
		dir:       dir,
		consumer:  consumer,
		batchSize: 1,
		env: append([]string{
			envCrashConsumer + "=" + consumer,
			app.EnvTablePrefix + "=",
			app.EnvAutoMigrate + "=true",
			app.EnvHTTPAddr + "=",
			app.EnvConfig + "=" + configPath,
		}, env...),
	}}
}

// sqliteMatrixSetup: the stores and the transport in one SQLite file.
func sqliteMatrixSetup(t *testing.T, _ string) *cellSetup {
	t.Helper()
	dbPath := filepath.Join(t.TempDir(), "data", "notifications.db")
	// A killed process's leases end after twice the timeout.
	s := matrixSetup(t, ConsumerName, time.Second,
		app.EnvTransport+"=sqlite",
		app.EnvDatabaseURL+"="+dbPath,
		app.EnvTransportURL+"=",
	)
	var err error
	s.db, err = sqlite.Open(t.Context(), dbPath, sqlite.OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.db.Close() })
	s.publishMsgs = func(t *testing.T, msgs []*message.Message) {
		t.Helper()
		pub, err := sqlite.NewPublisher(s.db, sqlite.PublisherConfig{})
		require.NoError(t, err)
		defer pub.Close()
		require.NoError(t, pub.Publish(appointments.Booked.Type(), msgs...))
	}
	s.pending = func(*testing.T) int {
		return count(s.db, `SELECT count(*) FROM pubsub_messages m WHERE m.topic = ? AND (
			m."offset" > COALESCE((SELECT claimed_offset FROM pubsub_groups g WHERE g.topic = m.topic AND g.consumer_group = ?), 0)
			OR EXISTS (SELECT 1 FROM pubsub_leases l WHERE l.topic = m.topic AND l.consumer_group = ? AND l."offset" = m."offset"))`,
			appointments.Booked.Type(), s.consumer, s.consumer)
	}
	return s
}

// postgresMatrixSetup: the stores and the SQL transport in a PostgreSQL
// schema of the cell's own.
func postgresMatrixSetup(t *testing.T, _ string) *cellSetup {
	t.Helper()
	url := testenv.PostgresURL(t)
	s := matrixSetup(t, ConsumerName, 5*time.Second,
		app.EnvTransport+"="+app.TransportPostgres,
		app.EnvDatabaseURL+"="+url,
		app.EnvTransportURL+"=",
	)
	s.db = openPostgres(t, url)
	tr, err := postgres.New(t.Context(), s.db, postgres.TransportConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	s.publishMsgs = func(t *testing.T, msgs []*message.Message) {
		t.Helper()
		require.NoError(t, tr.Publisher().Publish(appointments.Booked.Type(), msgs...))
	}
	s.pending = func(*testing.T) int {
		return count(s.db, fmt.Sprintf(`SELECT count(*) FROM %s WHERE "offset" > COALESCE((SELECT offset_acked FROM %s WHERE consumer_group = $1), 0)`,
			postgres.MessagesTable("", appointments.Booked.Type()), postgres.OffsetsTable("", appointments.Booked.Type())), s.consumer)
	}
	return s
}

// amqpMatrixSetup: RabbitMQ, with the stores in a PostgreSQL schema of
// the cell's own. The consumer has a name, so a queue, of its own,
// deleted when the cell ends. The test publishes straight to that queue
// (as a replay does), so that no other queue bound to the event type's
// exchange gets the cell's messages; the outbox relay publishes to the
// exchange, as in production.
func amqpMatrixSetup(t *testing.T, cell string) *cellSetup {
	t.Helper()
	amqpURL := testenv.Require(t, testenv.AMQPURLVar)
	url := testenv.PostgresURL(t)
	consumer := "notifications.crash-matrix-" + strings.ToLower(cell) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	s := matrixSetup(t, consumer, 5*time.Second,
		app.EnvTransport+"="+app.TransportAMQP,
		app.EnvAMQPURL+"="+amqpURL,
		app.EnvDatabaseURL+"="+url,
		app.EnvTransportURL+"=",
	)
	s.db = openPostgres(t, url)

	conn, err := amqp091.Dial(amqpURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	// The queue as the service declares it, so that the test can publish
	// before the service first starts.
	_, err = ch.QueueDeclare(consumer, true, false, false, false, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		if _, err := ch.QueueDelete(consumer, false, false, false); err != nil {
			t.Logf("delete queue %s: %v", consumer, err)
		}
	})

	tr, err := amqp.New(amqp.TransportConfig{URL: amqpURL})
	require.NoError(t, err)
	require.NoError(t, tr.Connect(t.Context()))
	t.Cleanup(func() { _ = tr.Close() })
	s.publishMsgs = func(t *testing.T, msgs []*message.Message) {
		t.Helper()
		require.NoError(t, tr.Replay(t.Context(), consumer, msgs...))
	}
	s.pending = func(t *testing.T) int {
		q, err := ch.QueueDeclarePassive(consumer, true, false, false, false, nil)
		require.NoError(t, err)
		return q.Messages
	}
	return s
}
