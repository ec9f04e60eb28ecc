package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
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
	"github.com/effectively-once/effectively/framework/driver"
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

// matrixConfig is the consumer's configuration in the matrix: one
// attempt per delivery, so that a poison message is dead-lettered at its
// first delivery; a short timeout, so that a killed process's SQLite
// leases (twice the timeout) end soon; a short outbox batch timeout, for
// the same reason (a killed SQLite relay's rows stay leased twice as
// long); and room for the deliveries that the kills cost (up to two per
// cell).
const matrixConfig = `outbox_batch_timeout: 2s
defaults:
  max_deliveries: 5
  attempts: 1
  timeout: %s
  retry_delay: 10ms
  strict_order: %t
`

// cellSetup is a set-up of the group-commit crash tests that publishes
// messages as they are.
type cellSetup struct {
	*batchSetup
	// publishMsgs publishes msgs, as another process would.
	publishMsgs func(t *testing.T, msgs []*message.Message)
}

// cellKind is how a cell's events reach the point it dies at.
type cellKind int

const (
	// deliveryCell publishes the events to the transport; the cell's
	// event is a good booking.
	deliveryCell cellKind = iota
	// poisonCell is a deliveryCell whose event is the poison message:
	// its points are those of its dead letter.
	poisonCell
	// outboxCell adds the events to the outbox, which the service's
	// relay publishes.
	outboxCell
	// replayCell dead-letters a good booking (the handler rejects it
	// while a file exists), then replays it with the command line: the
	// service's replay relay publishes it.
	replayCell
	// releaseCell puts the good bookings, under strict_order, behind a
	// booking of their subject that the handler rejects (sequence 1),
	// then discards its dead letter with --release-parked: the replay
	// relay publishes the parked bookings.
	releaseCell
)

// matrixCell is one crash point of the matrix.
type matrixCell struct {
	name string
	// at are the points the service dies at, one per run, in order.
	at   []crash.Point
	kind cellKind
	// catches is what the cell fails on: the bug a crash at its point
	// would reveal.
	catches string
}

// matrixCells are the cells of every set-up.
var matrixCells = []matrixCell{
	{
		name: "AfterDecode", at: []crash.Point{crash.AfterDecode},
		catches: "a message acknowledged on receipt, before its effect",
	},
	{
		name: "AfterCount", at: []crash.Point{crash.AfterDecode, crash.AfterCount},
		catches: "a delivery count that survives the kill and refuses the event, or counts a lost ack as a failure",
	},
	{
		name: "AfterMark", at: []crash.Point{crash.AfterMark},
		catches: "a processed mark committed apart from the handler's writes: the redelivery is taken for a duplicate and the effect lost",
	},
	{
		name: "AfterHandlerBeforeCommit", at: []crash.Point{crash.BeforeCommit},
		catches: "the handler's writes committed apart from the mark (two effects), or the message acknowledged before the commit (none)",
	},
	{
		name: "AfterCommitBeforeAck", at: []crash.Point{crash.AfterCommit},
		catches: "a redelivery of a committed event run again: two effects",
	},
	{
		name: "BeforeAck", at: []crash.Point{crash.BeforeAck},
		catches: "a redelivery of a committed event run again: two effects",
	},
	{
		name: "InDeadLetterWrite", at: []crash.Point{crash.BeforeDeadLetter}, kind: poisonCell,
		catches: "a poison message acknowledged before its dead letter is stored: the dead letter lost",
	},
	{
		name: "DeadLetterStoredBeforeAck", at: []crash.Point{crash.BeforeAck}, kind: poisonCell,
		catches: "a dead letter stored twice when its message comes again",
	},
	{
		name: "OutboxRelayBeforeMarkSent", at: []crash.Point{crash.BeforeOutboxSent}, kind: outboxCell,
		catches: "rows lost, or left unsent, by a relay that dies with them published and not marked; a republished event run twice",
	},
	{
		name: "ReplayBeforePublish", at: []crash.Point{crash.BeforeReplayPublish}, kind: replayCell,
		catches: "a replay claimed and never published: the dead letter replayed, its event without effect",
	},
	{
		name: "ReplayBeforeSent", at: []crash.Point{crash.BeforeReplaySent}, kind: replayCell,
		catches: "a replay published again after the kill and run twice",
	},
	{
		name: "ReleaseParkedBeforeSent", at: []crash.Point{crash.BeforeReplaySent}, kind: releaseCell,
		catches: "parked events released and lost, run twice, or left parked",
	},
}

// matrixSetups are the set-ups of the matrix.
var matrixSetups = []struct {
	name  string
	setup func(t *testing.T, cell string, strictOrder bool) *cellSetup
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
// no message, outbox row, replay or parked event waits.
func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	for _, s := range matrixSetups {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range matrixCells {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					testCrashCell(t, s.setup(t, c.name, c.kind == releaseCell), c)
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
	held := prefix + "-held" // the releaseCell's first of its subject
	switch c.kind {
	case poisonCell:
		target = poison
	case releaseCell:
		target = held
	}
	marker := filepath.Join(s.dir, "crashed")
	reject := filepath.Join(s.dir, "reject")
	points := make([]string, len(c.at))
	for i, p := range c.at {
		points[i] = string(p)
	}
	env := []string{envCrashAt + "=" + strings.Join(points, ","), envCrashEvent + "=" + target, envCrashReject + "=" + reject}

	msgs := append(bookings(t, good), poisonMessage(t, poison))
	switch c.kind {
	case deliveryCell, poisonCell:
		s.publishMsgs(t, msgs)
	case outboxCell:
		// The service creates the outbox (and, on RabbitMQ, binds its
		// queue) in a first run; the test then adds the events to the
		// outbox, as a service's handler would.
		s.start(t, modeNone, marker).stop(t)
		addToOutbox(t, s, msgs)
	case replayCell:
		require.NoError(t, os.WriteFile(reject, nil, 0o600))
		s.publishMsgs(t, msgs)
		s.runUntil(t, env, "the rejected booking and the poison message dead-lettered", func() bool {
			return s.deadLetters(target) == 1 && s.deadLetters(poison) == 1
		})
		require.NoError(t, os.Remove(reject))
		s.command(t, "dead-letters", "replay", s.deadLetterID(t, target), "--reason", "crash matrix", "--by", "test")
	case releaseCell:
		// The held booking first, alone (the first event of a subject
		// starts its sequence), rejected: its dead letter holds the
		// subject, and the bookings after it are parked behind it.
		require.NoError(t, os.WriteFile(reject, nil, 0o600))
		seq := sequence(t, prefix, append([]string{held}, good...))
		// seq[:1:1]: an append to seq[:1] would write the poison
		// message over seq[1], the first booking behind the held one.
		s.publishMsgs(t, append(seq[:1:1], poisonMessage(t, poison)))
		s.runUntil(t, env, "the held booking and the poison message dead-lettered", func() bool {
			return s.deadLetters(held) == 1 && s.deadLetters(poison) == 1
		})
		s.publishMsgs(t, seq[1:])
		s.runUntil(t, env, "the bookings parked behind the held one", func() bool { return s.parkedBehind() == len(good) })
		s.command(t, "dead-letters", "discard", s.deadLetterID(t, held), "--release-parked", "--reason", "crash matrix", "--by", "test")
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
	s.drainUntil(t, modePoints, marker, env, func() bool {
		return done() && s.unsentReplays() == 0 && count(s.db, `SELECT count(*) FROM outbox WHERE sent_at IS NULL`) <= 0
	})
	for _, id := range good {
		require.Equal(t, 1, s.reminders(id), "reminders of %s", id)
		require.Equal(t, 1, s.marks(id), "processed marks of %s", id)
	}
	switch c.kind {
	case replayCell:
		require.Equal(t, 1, s.deadLetters(target), "the replayed booking keeps its dead letter")
		require.Equal(t, 1, s.deadLettersWith(target, driver.DeadLetterReplayed), "its dead letter is replayed")
		require.Equal(t, 0, s.deadLetters(good[0])+s.deadLetters(good[2]), "the other bookings are no dead letters")
	case releaseCell:
		require.Equal(t, 0, s.reminders(held), "the discarded booking has no effect")
		require.Equal(t, 1, s.deadLettersWith(held, driver.DeadLetterDiscarded), "its dead letter is discarded")
		fallthrough
	default:
		for _, id := range good {
			require.Equal(t, 0, s.deadLetters(id), "dead letters of %s", id)
		}
	}
	require.Equal(t, 0, s.reminders(poison), "the poison message has no effect")
	require.Equal(t, 0, s.marks(poison), "the poison message is not marked processed")
	require.Equal(t, 1, s.deadLetters(poison), "the poison message has one dead letter")
	require.Equal(t, 1, s.deadLettersWith(poison, driver.DeadLetterPending), "the poison message's dead letter waits for an operator")
	require.Equal(t, 0, s.parked(), "nothing parked")
	require.Equal(t, 0, count(s.db, `SELECT count(*) FROM outbox WHERE sent_at IS NULL`), "nothing unsent in the outbox")
	require.Equal(t, 0, s.unsentReplays(), "no replay waits")
	require.Zero(t, s.pending(t), "no message waits")
}

// runUntil runs the service normally (no crash point armed yet) until
// cond holds, and stops it.
func (s *cellSetup) runUntil(t *testing.T, env []string, what string, cond func() bool) {
	t.Helper()
	svc := startService(t, s.dir, modeNone, append(env, s.env...)...)
	svc.waitFor(t, what, cond)
	svc.stop(t)
}

// command runs the service's command line with args, as an operator
// would, and fails the test when it fails.
func (s *cellSetup) command(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), envCrashMode+"="+modeNone), s.env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, testenv.RunChild(cmd), "%v:\n%s", args, &out)
}

// deadLetterID returns the id of the event's dead letter, as the command
// line takes it.
func (s *cellSetup) deadLetterID(t *testing.T, eventID string) string {
	t.Helper()
	var id int64
	require.NoError(t, s.db.Get(&id, s.db.Rebind(`SELECT id FROM dead_letters WHERE consumer = ? AND event_id = ?`), s.consumer, eventID))
	return strconv.FormatInt(id, 10)
}

// deadLettersWith counts the event's dead letters of status.
func (s *cellSetup) deadLettersWith(eventID string, status driver.DeadLetterStatus) int {
	return count(s.db, s.db.Rebind(`SELECT count(*) FROM dead_letters WHERE consumer = ? AND event_id = ? AND status = ?`),
		s.consumer, eventID, string(status))
}

// parked counts the consumer's rows of parked_events: events waiting
// for their turn or parked, and the dead letters holding their subject.
func (s *cellSetup) parked() int {
	return count(s.db, s.db.Rebind(`SELECT count(*) FROM parked_events WHERE consumer = ?`), s.consumer)
}

// parkedBehind counts the consumer's events parked behind a dead letter.
func (s *cellSetup) parkedBehind() int {
	return count(s.db, s.db.Rebind(`SELECT count(*) FROM parked_events WHERE consumer = ? AND reason = 'parked'`), s.consumer)
}

// unsentReplays counts the consumer's replays not published yet.
func (s *cellSetup) unsentReplays() int {
	return count(s.db, s.db.Rebind(`SELECT count(*) FROM replays WHERE consumer = ? AND sent_at IS NULL`), s.consumer)
}

// sequence returns the bookings of ids as the events of one subject, in
// this order.
func sequence(t *testing.T, prefix string, ids []string) []*message.Message {
	t.Helper()
	subject := prefix + "-subject"
	msgs := make([]*message.Message, len(ids))
	for i, id := range ids {
		env, err := appointments.Booked.Envelope(
			appointments.BookedV1{AppointmentID: "appt-" + id, StartsAt: time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC)},
			framework.Attributes{ID: id, Source: appointments.Source, Subject: subject, SubjectSeq: int64(i + 1)},
		)
		require.NoError(t, err)
		msgs[i], err = framework.NewMessage(env)
		require.NoError(t, err)
	}
	return msgs
}

// drainUntil runs the service with the hook of mode (every marker
// exists: it runs normally) until done holds and no message waits, then
// stops it; on AMQP, messages taken and not handled go back to the queue
// at the stop: then it runs again.
func (s *batchSetup) drainUntil(t *testing.T, mode, marker string, env []string, done func() bool) {
	t.Helper()
	for range 3 {
		svc := startService(t, s.dir, mode, append(append([]string{envCrashMarker + "=" + marker}, env...), s.env...)...)
		svc.waitFor(t, "every event handled, and nothing waiting", func() bool {
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
		envs[i], err = driver.DecodeMessage(msg, 0)
		require.NoError(t, err)
	}
	tx, err := s.db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	require.NoError(t, ob.AddTx(t.Context(), tx, envs...))
	require.NoError(t, tx.Commit())
}

// matrixSetup returns a set-up whose service runs the consumer consumer
// with the matrix's configuration (strict_order as strictOrder) and env.
func matrixSetup(t *testing.T, consumer string, timeout time.Duration, strictOrder bool, env ...string) *cellSetup {
	t.Helper()
	dir := t.TempDir()
	configPath := filepath.Join(dir, "effectively.yaml")
	require.NoError(t, os.WriteFile(configPath, []byte(fmt.Sprintf(matrixConfig, timeout, strictOrder)), 0o600))
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
func sqliteMatrixSetup(t *testing.T, _ string, strictOrder bool) *cellSetup {
	t.Helper()
	dbPath := filepath.Join(t.TempDir(), "data", "notifications.db")
	// A killed process's leases end after twice the timeout.
	s := matrixSetup(t, ConsumerName, time.Second, strictOrder,
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
func postgresMatrixSetup(t *testing.T, _ string, strictOrder bool) *cellSetup {
	t.Helper()
	url := testenv.PostgresURL(t)
	s := matrixSetup(t, ConsumerName, 5*time.Second, strictOrder,
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
func amqpMatrixSetup(t *testing.T, cell string, strictOrder bool) *cellSetup {
	t.Helper()
	amqpURL := testenv.Require(t, testenv.AMQPURLVar)
	url := testenv.PostgresURL(t)
	consumer := "notifications.crash-matrix-" + strings.ToLower(cell) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	s := matrixSetup(t, consumer, 5*time.Second, strictOrder,
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
	own := strings.ToLower(cell) + "-" // the cell's event ids (see testCrashCell)
	s.pending = func(t *testing.T) int { return queued(t, conn, ch, consumer, own) }
	return s
}

// queued counts the messages that wait in queue (ch reads its count).
// While no service reads the queue, it counts only those whose event id
// starts with own, and drops the others: copies of other tests' events,
// which the outbox cells' relays and the AMQP demo publish to the event
// type's exchange, to which queue is bound too (one came after a cell's
// last run and failed its check that nothing waits). The messages
// counted go back to the queue, redelivered, when the channel that took
// them closes.
func queued(t *testing.T, conn *amqp091.Connection, ch *amqp091.Channel, queue, own string) int {
	t.Helper()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	if q.Messages == 0 || q.Consumers > 0 {
		return q.Messages
	}
	take, err := conn.Channel()
	require.NoError(t, err)
	defer func() { _ = take.Close() }() // the messages counted go back
	n := 0
	for {
		d, ok, err := take.Get(queue, false)
		require.NoError(t, err)
		if !ok {
			return n
		}
		var ev struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(d.Body, &ev) == nil && strings.HasPrefix(ev.ID, own) {
			n++
			continue
		}
		require.NoError(t, d.Ack(false))
	}
}
