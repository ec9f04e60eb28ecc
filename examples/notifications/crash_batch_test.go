package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/examples/notifications/appointments"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/internal/testenv"
)

// The group-commit crash tests kill the service at three steps of a batch
// (see crash_batch_hook_test.go), on each set-up: SQLite, PostgreSQL with
// its SQL transport, RabbitMQ with the stores in PostgreSQL. After each
// kill the restarted service must give every published event its effect
// exactly once, with no dead letter.

// batchEvents is how many events each crash point publishes: more than
// the consumer's concurrency (16), so that attempts wait for a batch.
const batchEvents = 20

// batchConfig is the consumer's configuration of the group-commit crash
// tests: batches of batchSize, lingering so that they fill, and a timeout
// that outlasts the wait for a batch (it is the SQLite lease's half).
// Overlap 1 keeps the attempts in batches on PostgreSQL: on a loaded
// machine the handler's time outside its statements passed the
// threshold (driver.OutsideThreshold) where attempts overlap, each in a
// transaction of its own begun at its first statement, and no batch was
// left to crash in.
const batchConfig = `defaults:
  max_deliveries: 5
  attempts: 1
  timeout: %s
  retry_delay: 10ms
  batch_size: %d
  batch_linger: %s
  overlap: 1
`

// batchSetup is one set-up of the group-commit crash tests: the service's
// environment, and how the test publishes and reads what the service did.
type batchSetup struct {
	dir       string
	consumer  string
	batchSize int
	db        *sqlx.DB // the stores' database
	env       []string // the service's, besides the crash mode and marker
	// publish publishes a booking per event id, as another process would.
	publish func(t *testing.T, ids []string)
	// pending counts the consumer's messages not acknowledged (on AMQP,
	// those ready in the queue: all of them once the service stopped); -1
	// when it cannot tell yet.
	pending func(t *testing.T) int
}

func newBatchSetup(t *testing.T, consumer string, batchSize int, timeout, linger time.Duration, env ...string) *batchSetup {
	t.Helper()
	dir := t.TempDir()
	configPath := filepath.Join(dir, "effectively.yaml")
	config := fmt.Sprintf(batchConfig, timeout, batchSize, linger)
	require.NoError(t, os.WriteFile(configPath, []byte(config), 0o600))
	return &batchSetup{
		dir:       dir,
		consumer:  consumer,
		batchSize: batchSize,
		env: append([]string{
			envCrashConsumer + "=" + consumer,
			envCrashBatchSize + "=" + strconv.Itoa(batchSize),
			app.EnvTablePrefix + "=",
			app.EnvAutoMigrate + "=true",
			app.EnvHTTPAddr + "=",
			app.EnvConfig + "=" + configPath,
		}, env...),
	}
}

// bookings returns a booking message per event id.
func bookings(t *testing.T, ids []string) []*message.Message {
	t.Helper()
	msgs := make([]*message.Message, len(ids))
	for i, id := range ids {
		env, err := appointments.Booked.Envelope(
			appointments.BookedV1{AppointmentID: "appt-" + id, StartsAt: time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC)},
			framework.Attributes{ID: id, Source: appointments.Source},
		)
		require.NoError(t, err)
		msgs[i], err = framework.NewMessage(env)
		require.NoError(t, err)
	}
	return msgs
}

// sqliteBatchSetup is the default set-up: the stores and the transport in
// one SQLite file, so that each attempt's ack is part of its batch.
func sqliteBatchSetup(t *testing.T) *batchSetup {
	t.Helper()
	const timeout = 2 * time.Second // a killed process's leases expire after 4 s
	dbPath := filepath.Join(t.TempDir(), "data", "notifications.db")
	s := newBatchSetup(t, ConsumerName, 4, timeout, 100*time.Millisecond,
		app.EnvTransport+"=sqlite",
		app.EnvDatabaseURL+"="+dbPath,
		app.EnvTransportURL+"=",
	)
	var err error
	s.db, err = sqlite.Open(t.Context(), dbPath, sqlite.OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.db.Close() })
	s.publish = func(t *testing.T, ids []string) {
		t.Helper()
		pub, err := sqlite.NewPublisher(s.db, sqlite.PublisherConfig{})
		require.NoError(t, err)
		defer pub.Close()
		require.NoError(t, pub.Publish(appointments.Booked.Type(), bookings(t, ids)...))
	}
	s.pending = func(*testing.T) int {
		return count(s.db, `SELECT count(*) FROM pubsub_messages m WHERE m.topic = ? AND (
			m."offset" > COALESCE((SELECT claimed_offset FROM pubsub_groups g WHERE g.topic = m.topic AND g.consumer_group = ?), 0)
			OR EXISTS (SELECT 1 FROM pubsub_leases l WHERE l.topic = m.topic AND l.consumer_group = ? AND l."offset" = m."offset"))`,
			appointments.Booked.Type(), s.consumer, s.consumer)
	}
	return s
}

// postgresBatchSetup runs the SQL transport on PostgreSQL, in a schema of
// the test's own. Half of the events go to the consumer's replay topic,
// so that its two subscriptions fill the batches together.
func postgresBatchSetup(t *testing.T) *batchSetup {
	t.Helper()
	url := testenv.PostgresURL(t)
	s := newBatchSetup(t, ConsumerName, 4, 5*time.Second, 100*time.Millisecond,
		app.EnvTransport+"="+app.TransportPostgres,
		app.EnvDatabaseURL+"="+url,
		app.EnvTransportURL+"=",
	)
	s.db = openPostgres(t, url)
	tr, err := postgres.New(t.Context(), s.db, postgres.TransportConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	s.publish = func(t *testing.T, ids []string) {
		t.Helper()
		msgs := bookings(t, ids)
		half := len(msgs) / 2
		require.NoError(t, tr.Publisher().Publish(appointments.Booked.Type(), msgs[:half]...))
		require.NoError(t, tr.Replay(t.Context(), s.consumer, msgs[half:]...))
	}
	s.pending = func(*testing.T) int {
		n := 0
		for _, topic := range []string{appointments.Booked.Type(), pipeline.ReplayTopic(s.consumer)} {
			c := count(s.db, fmt.Sprintf(`SELECT count(*) FROM %s WHERE "offset" > COALESCE((SELECT offset_acked FROM %s WHERE consumer_group = $1), 0)`,
				postgres.MessagesTable("", topic), postgres.OffsetsTable("", topic)), s.consumer)
			if c < 0 {
				return -1
			}
			n += c
		}
		return n
	}
	return s
}

// amqpBatchSetup runs RabbitMQ with the stores in PostgreSQL. The consumer
// has a name, so a queue, of its own on the shared broker, deleted when
// the test ends; the test publishes straight to that queue (as a replay
// does), so no other queue bound to the event type's exchange gets them.
func amqpBatchSetup(t *testing.T) *batchSetup {
	t.Helper()
	amqpURL := testenv.Require(t, testenv.AMQPURLVar)
	url := testenv.PostgresURL(t)
	consumer := "notifications.crash-batch-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	s := newBatchSetup(t, consumer, 4, 5*time.Second, 100*time.Millisecond,
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
	s.publish = func(t *testing.T, ids []string) {
		t.Helper()
		require.NoError(t, tr.Replay(t.Context(), consumer, bookings(t, ids)...))
	}
	s.pending = func(t *testing.T) int {
		return queued(t, conn, ch, consumer, "batch-") // the test's event ids (see testBatchCrashes)
	}
	return s
}

func openPostgres(t *testing.T, url string) *sqlx.DB {
	t.Helper()
	db, err := postgres.Open(t.Context(), url, postgres.OpenConfig{MaxOpenConns: 4})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func (s *batchSetup) start(t *testing.T, mode, marker string) *service {
	t.Helper()
	return startService(t, s.dir, mode, append([]string{envCrashMarker + "=" + marker}, s.env...)...)
}

func (s *batchSetup) reminders(id string) int {
	return count(s.db, s.db.Rebind(`SELECT count(*) FROM reminders WHERE event_id = ?`), id)
}

func (s *batchSetup) marks(id string) int {
	return count(s.db, s.db.Rebind(`SELECT count(*) FROM processed_events WHERE consumer = ? AND event_id = ?`), s.consumer, id)
}

func (s *batchSetup) deadLetters(id string) int {
	return count(s.db, s.db.Rebind(`SELECT count(*) FROM dead_letters WHERE consumer = ? AND event_id = ?`), s.consumer, id)
}

// effects counts the events among ids that have a reminder.
func (s *batchSetup) effects(ids []string) int {
	query, args, err := sqlx.In(`SELECT count(DISTINCT event_id) FROM reminders WHERE event_id IN (?)`, ids)
	if err != nil {
		return -1
	}
	return count(s.db, s.db.Rebind(query), args...)
}

// drain runs the service normally until every event of ids took effect
// and no message waits, then stops it. On AMQP, messages the service had
// taken from the queue and not handled go back to it when it stops: then
// it runs again.
func (s *batchSetup) drain(t *testing.T, mode, marker string, ids []string) {
	t.Helper()
	for range 3 {
		svc := s.start(t, mode, marker) // the marker exists: runs normally
		svc.waitFor(t, "effect of every event, and no message waiting", func() bool {
			return s.effects(ids) == len(ids) && s.pending(t) == 0
		})
		svc.stop(t)
		if s.pending(t) == 0 {
			return
		}
	}
	t.Fatalf("%d messages still wait after three runs", s.pending(t))
}

// requireOnce checks that the event took effect once and is no dead
// letter.
func (s *batchSetup) requireOnce(t *testing.T, id string) {
	t.Helper()
	require.Equal(t, 1, s.reminders(id), "reminders of %s", id)
	require.Equal(t, 1, s.marks(id), "processed marks of %s", id)
	require.Equal(t, 0, s.deadLetters(id), "dead letters of %s", id)
}

// readBatchCrash reads the report of the hook that killed the process.
func readBatchCrash(t *testing.T, marker string) batchCrash {
	t.Helper()
	raw, err := os.ReadFile(batchReportPath(marker))
	require.NoError(t, err, "the hook reports before it kills")
	var c batchCrash
	require.NoError(t, json.Unmarshal(raw, &c))
	return c
}

// testBatchCrashes publishes batchEvents events per crash point, lets the
// point's hook kill the service in a batch, checks what the batch left,
// restarts the service until everything is handled and checks that each
// event took effect once.
func testBatchCrashes(t *testing.T, s *batchSetup) {
	points := []struct {
		mode      string
		committed bool // whether the batch committed before the kill
	}{
		{modeBatchMiddle, false},
		{modeBatchBeforeCommit, false},
		{modeBatchAfterCommit, true},
	}
	for _, p := range points {
		ok := t.Run(p.mode, func(t *testing.T) {
			ids := make([]string, batchEvents)
			for i := range ids {
				ids[i] = fmt.Sprintf("%s-%02d", p.mode, i)
			}
			marker := filepath.Join(s.dir, p.mode)
			s.publish(t, ids)

			s.start(t, p.mode, marker).waitKilledUnless(t, "every event took effect and the hook never fired: no batch formed", func() bool {
				// The marker exists from when the hook decides to kill.
				return !fired(marker) && s.effects(ids) == len(ids)
			})
			crash := readBatchCrash(t, marker)
			t.Logf("killed in attempt %d (%s) with %d batch-mates before it: %v", crash.Attempt, crash.Event, len(crash.Mates), crash.Mates)
			require.NotEmpty(t, crash.Mates, "the attempt shares its transaction with earlier ones")
			require.Empty(t, crash.Returned, "attempts of the batch handed back to the transport before the kill")
			switch {
			case p.mode == modeBatchBeforeCommit:
				require.Len(t, crash.Mates, s.batchSize-1, "the attempt fills its batch")
			case p.mode == modeBatchMiddle && s.batchSize >= 4:
				require.Len(t, crash.Mates, 2, "the third attempt of its batch")
			}
			want := 0 // run, not committed: gone with the process
			if p.committed {
				want = 1
			}
			for _, id := range append([]string{crash.Event}, crash.Mates...) {
				// On RabbitMQ a copy of another test's event, which it
				// published to the type's exchange, may share the batch.
				if strings.HasPrefix(id, "batch-") {
					require.True(t, slices.Contains(ids, id), "%s is an event of this point", id)
				}
				require.Equal(t, want, s.reminders(id), "reminders of %s after the kill", id)
				require.Equal(t, want, s.marks(id), "processed marks of %s after the kill", id)
			}

			s.drain(t, p.mode, marker, ids)
			for _, id := range ids {
				s.requireOnce(t, id)
			}
		})
		if !ok {
			return
		}
	}
}

// TestCrashInBatch kills the service in the middle of a batch, before a
// full batch commits, and after a batch committed before its messages
// are acknowledged, on each set-up; every event takes effect once.
func TestCrashInBatch(t *testing.T) {
	t.Parallel()
	setups := []struct {
		name  string
		setup func(t *testing.T) *batchSetup
	}{
		{"SQLite", sqliteBatchSetup},
		{"Postgres", postgresBatchSetup},
		{"AMQP", amqpBatchSetup},
	}
	for _, tt := range setups {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			testBatchCrashes(t, tt.setup(t))
		})
	}
}
