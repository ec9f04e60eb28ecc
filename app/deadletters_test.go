package app_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/testenv"
)

// transportConfigs are a test configuration on each transport, the
// broker's with a database of its own kind.
var transportConfigs = []struct {
	name   string
	config func(t *testing.T) app.Config
}{
	{"SQLite", testConfig},
	{"Postgres", postgresConfig},
	{"AMQP", amqpConfig},
}

// postgresConfig is testConfig on the postgres transport, with its stores
// in the same database.
func postgresConfig(t *testing.T) app.Config {
	cfg := testConfig(t)
	cfg.Transport = app.TransportPostgres
	cfg.DatabaseURL = testenv.PostgresURL(t)
	cfg.TransportURL = cfg.DatabaseURL
	return cfg
}

// amqpConfig is testConfig on the test's RabbitMQ.
func amqpConfig(t *testing.T) app.Config {
	cfg := testConfig(t)
	cfg.Transport = app.TransportAMQP
	cfg.AMQPURL = testenv.Require(t, testenv.AMQPURLVar)
	return cfg
}

// TestDeadLettersCommand drives the operator's commands against a running
// service, on each transport: list and show what a consumer gave up on,
// replay one to that consumer alone once the cause is fixed, discard
// another. It sets the environment, so it does not run in parallel.
func TestDeadLettersCommand(t *testing.T) {
	for _, tc := range transportConfigs {
		t.Run(tc.name, func(t *testing.T) { testDeadLettersCommand(t, tc.config(t)) })
	}
}

func testDeadLettersCommand(t *testing.T, cfg app.Config) {
	// Fresh names: queues on the shared broker outlive the test.
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	pickyConsumer, otherConsumer := "widgets.picky-"+suffix, "widgets.other-"+suffix
	var rejecting atomic.Bool
	rejecting.Store(true)
	insert := func(ctx context.Context, db *sqlx.DB, name, eventID string) error {
		_, err := framework.Conn(ctx, db).ExecContext(ctx, db.Rebind(`INSERT INTO widgets (name, event_id) VALUES (?, ?)`), name, eventID)
		return err
	}
	picky := handlers.Register(pickyConsumer, handlers.On(widgetAdded, func(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
		return func(ctx context.Context, ev framework.Event[widgetAddedV1]) error {
			if rejecting.Load() {
				return framework.Permanent("widget_rejected", errors.New("not today"))
			}
			return insert(ctx, db, "picky:"+ev.Data.Name, ev.ID)
		}
	}))
	other := handlers.Register(otherConsumer, handlers.On(widgetAdded, func(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
		return func(ctx context.Context, ev framework.Event[widgetAddedV1]) error {
			return insert(ctx, db, "other:"+ev.Data.Name, ev.ID)
		}
	}))
	b := setup(t, cfg, picky, other)
	setEnv(t, cfg)
	run := func(args ...string) (string, error) {
		return runCommand(t, fx.Options(
			handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
			picky,
			other,
			fx.Supply(widgetMigrations),
		), args...)
	}
	count := func(query string, args ...any) int { return b.count(t, b.db.Rebind(query), args...) }
	deadLetters := func() int {
		return count(`SELECT count(*) FROM dead_letters WHERE consumer = ?`, pickyConsumer)
	}

	b.publish(t, "w-1", "one")
	b.publish(t, "w-2", "two")
	waitFor(t, "two dead letters", func() bool { return deadLetters() == 2 })
	var ids []int64
	require.NoError(t, b.db.Select(&ids, b.db.Rebind(`SELECT id FROM dead_letters WHERE consumer = ? ORDER BY event_id`), pickyConsumer))

	out, err := run("dead-letters", "list", "--consumer", pickyConsumer)
	require.NoError(t, err)
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s+%s\s+widget_rejected\s+widgets\.widget\.added\s+1\s+widgets\s+w-1\s+1\s+0\s+\S+\s+pending$`, ids[0], regexp.QuoteMeta(pickyConsumer)), out)
	require.Contains(t, out, "w-2")

	out, err = run("dl", "show", fmt.Sprint(ids[0]))
	require.NoError(t, err)
	require.Regexp(t, `code\s+widget_rejected`, out)
	require.Contains(t, out, `"name": "one"`)
	require.NotContains(t, out, "not today", "a dead letter never holds the error's text")

	// The cause is fixed: replay the first, saying why.
	rejecting.Store(false)
	_, err = run("dead-letters", "replay", fmt.Sprint(ids[0]))
	require.ErrorContains(t, err, "--reason")
	_, err = run("dead-letters", "replay", fmt.Sprint(ids[0]), "--reason", "fixed", "--by", "")
	require.ErrorContains(t, err, "--by: say who you are")
	out, err = run("dead-letters", "show", fmt.Sprint(ids[0]))
	require.NoError(t, err)
	require.Regexp(t, `status\s+pending`, out, "not replayed without a reason")
	out, err = run("dead-letters", "replay", fmt.Sprint(ids[0]), "--by", "tester", "--reason", "rejection fixed")
	require.NoError(t, err)
	require.Contains(t, out, fmt.Sprintf("dead letter %d replayed", ids[0]))
	waitFor(t, "the replay handled", func() bool {
		return count(`SELECT count(*) FROM widgets WHERE name = 'picky:one'`) == 1
	})
	require.Equal(t, 1, count(`SELECT count(*) FROM widgets WHERE name = 'other:one'`), "the other consumer of the type does not see the replay")
	out, err = run("dead-letters", "show", fmt.Sprint(ids[0]))
	require.NoError(t, err)
	require.Regexp(t, `status\s+replayed`, out)
	require.Contains(t, out, "replayed by tester")
	require.Regexp(t, `(?m)^history:\n\s+\S+\s+failed\s+code widget_rejected, attempts \d+, deliveries \d+\n\s+\S+\s+replayed\s+by tester: rejection fixed$`, out)

	_, err = run("dead-letters", "discard", fmt.Sprint(ids[1]))
	require.ErrorContains(t, err, "--reason")
	out, err = run("dead-letters", "discard", fmt.Sprint(ids[1]), "--by", "tester", "--reason", "a test widget")
	require.NoError(t, err)
	require.Contains(t, out, "discarded")
	out, err = run("dead-letters", "show", fmt.Sprint(ids[1]))
	require.NoError(t, err)
	require.Regexp(t, `(?m)^\s+\S+\s+discarded\s+by tester: a test widget$`, out, "the discard is in the history")
	out, err = run("dead-letters", "replay", fmt.Sprint(ids[1]), "--by", "tester", "--reason", "try again")
	require.ErrorIs(t, err, driver.ErrNotPending)
	require.ErrorContains(t, err, "1 of 1 dead letters refused")
	require.Regexp(t, fmt.Sprintf(`dead letter %d refused: not pending: discarded by tester at \S+ \(a test widget\)`, ids[1]), out)

	// A discard is final: a copy of the event that comes later, which
	// the handler would now apply, is a duplicate, and the dead letter
	// stays discarded.
	duplicates := func() int { return outcomes(t, b, pickyConsumer, framework.Duplicate) }
	before := duplicates()
	b.publish(t, "w-2", "two")
	waitFor(t, "the copy of the discarded event acknowledged as a duplicate", func() bool { return duplicates() == before+1 })
	require.Zero(t, count(`SELECT count(*) FROM widgets WHERE name = 'picky:two'`), "the discarded event never takes effect")
	out, err = run("dead-letters", "show", fmt.Sprint(ids[1]))
	require.NoError(t, err)
	require.Regexp(t, `status\s+discarded`, out)
	require.Regexp(t, `repeats\s+0`, out)

	out, err = run("dead-letters", "list", "--consumer", pickyConsumer)
	require.NoError(t, err)
	require.NotContains(t, out, "w-1", "only pending ones by default")
	out, err = run("dead-letters", "list", "--status", "all", "--code", "widget_rejected")
	require.NoError(t, err)
	require.Contains(t, out, "replayed")
	require.Contains(t, out, "discarded")

	_, err = run("dead-letters", "show", "x")
	require.ErrorContains(t, err, "want a positive integer")
	_, err = run("dead-letters", "show", "999999")
	require.ErrorIs(t, err, driver.ErrNotFound)
	require.EqualError(t, err, "dead letter 999999: not found", "said once")
}

// setEnv configures the commands of a test through the environment, as
// in production: the transport and databases of cfg, everything else by
// default.
func setEnv(t *testing.T, cfg app.Config) {
	t.Helper()
	for k, v := range map[string]string{
		app.EnvTransport: cfg.Transport, app.EnvDatabaseURL: cfg.DatabaseURL, app.EnvTransportURL: cfg.TransportURL,
		app.EnvAMQPURL: cfg.AMQPURL, app.EnvTablePrefix: "", app.EnvConfig: "", app.EnvAutoMigrate: "", app.EnvHTTPAddr: "",
	} {
		t.Setenv(k, v)
	}
}

// runCommand runs the service command of opts with args and returns what
// it printed. A command that waits for something that never comes fails
// the test after waitLimit instead of hanging it.
func runCommand(t *testing.T, opts fx.Option, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := app.Command("widgets", opts)
	cmd.SetOut(&out)
	cmd.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

// closedAMQPURL returns the URL of a broker that is not there: a loopback
// port that nothing listens on, with a password that must never be shown.
func closedAMQPURL(t *testing.T, password string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "amqp://guest:" + password + "@" + addr + "/"
}

// TestDeadLettersBuildNoHandler shows that the operator's commands build no
// handler: a handler that needs the outbox, which only a serving
// application provides, and one whose constructor would dial a provider
// and fail, do not keep an operator from listing dead letters, nor does a
// broker that is down.
func TestDeadLettersBuildNoHandler(t *testing.T) {
	var dialled atomic.Bool
	service := fx.Options(
		handlers.Register("widgets.boxed", handlers.On(widgetAdded, func(db *sqlx.DB, box *outbox.Outbox) framework.HandlerFunc[widgetAddedV1] {
			return func(context.Context, framework.Event[widgetAddedV1]) error { return nil }
		})),
		handlers.Register("widgets.dialling", handlers.On(widgetAdded, func() (framework.HandlerFunc[widgetAddedV1], error) {
			dialled.Store(true)
			return nil, errors.New("dial the payment provider: connection refused")
		})),
		fx.Supply(widgetMigrations),
	)
	setEnv(t, testConfig(t))
	out, err := runCommand(t, service, "migrate")
	require.NoError(t, err)
	require.Equal(t, "migrations applied\n", out)

	for _, transport := range []string{"sqlite", "amqp"} {
		t.Run(transport, func(t *testing.T) {
			t.Setenv(app.EnvTransport, transport)
			t.Setenv(app.EnvAMQPURL, closedAMQPURL(t, "s3cret"))
			out, err := runCommand(t, service, "dead-letters", "list", "--status", "all")
			require.NoError(t, err)
			require.Regexp(t, `^ID\s+CONSUMER\s+CODE`, out)
			_, err = runCommand(t, service, "dead-letters", "show", "1")
			require.ErrorIs(t, err, driver.ErrNotFound)
			out, err = runCommand(t, service, "dead-letters", "discard", "1", "--by", "tester", "--reason", "test data")
			require.ErrorIs(t, err, driver.ErrNotFound)
			require.Equal(t, "dead letter 1 refused: not found\n", out)
			require.False(t, dialled.Load(), "no handler was built")
		})
	}
}

// TestDeadLettersReplayNeedsOnlyTheDatabase shows that a replay needs
// only the database: with the broker down, the command records the
// replay, which waits in the database for a running service to publish
// it, and never shows the broker's password.
func TestDeadLettersReplayNeedsOnlyTheDatabase(t *testing.T) {
	service := fx.Options(
		handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
		fx.Supply(widgetMigrations),
	)
	cfg := testConfig(t)
	setEnv(t, cfg)
	_, err := runCommand(t, service, "migrate")
	require.NoError(t, err)
	db, err := sqlite.Open(t.Context(), cfg.DatabaseURL, sqlite.OpenConfig{})
	require.NoError(t, err)
	defer db.Close()
	id := storeDeadLetter(t, db, consumerName, "w-1", "", 0)

	t.Setenv(app.EnvTransport, "amqp")
	t.Setenv(app.EnvAMQPURL, closedAMQPURL(t, "s3cret"))
	out, err := runCommand(t, service, "dead-letters", "replay", fmt.Sprint(id), "--by", "tester", "--reason", "fixed")
	require.NoError(t, err)
	require.Contains(t, out, fmt.Sprintf("dead letter %d replayed\n", id))
	require.Contains(t, out, "1 replayed, 0 refused: the running service publishes the replays to their consumers")
	require.NotContains(t, out, "s3cret")
	var replays []struct {
		Consumer     string `db:"consumer"`
		DeadLetterID int64  `db:"dead_letter_id"`
		Unsent       bool   `db:"unsent"`
	}
	require.NoError(t, db.Select(&replays, `SELECT consumer, dead_letter_id, sent_at IS NULL AS unsent FROM replays`))
	require.Len(t, replays, 1)
	require.Equal(t, consumerName, replays[0].Consumer)
	require.Equal(t, id, replays[0].DeadLetterID)
	require.True(t, replays[0].Unsent, "published by a running service only")
}

// storeDeadLetter stores, through the store of db (SQLite or
// PostgreSQL), a dead letter of consumer for a widget event id, of
// subject at seq when subject is set, and returns its id.
func storeDeadLetter(t *testing.T, db *sqlx.DB, consumer, id, subject string, seq int64) int64 {
	t.Helper()
	store := testStore(t, db)
	env, err := widgetAdded.Envelope(widgetAddedV1{Name: id}, framework.Attributes{ID: id, Source: "widgets", Subject: subject, SubjectSeq: seq})
	require.NoError(t, err)
	msg, err := framework.NewMessage(env)
	require.NoError(t, err)
	require.NoError(t, store.PublishDeadLetter(t.Context(), driver.DeadLetter{
		Consumer: consumer, Topic: widgetAdded.Type(), Source: "widgets", EventID: id,
		Type: widgetAdded.Type(), Version: 1, Subject: subject, SubjectSeq: seq,
		Code: "widget_rejected", Attempts: 1, Body: msg.Payload, Metadata: msg.Metadata,
	}))
	dls, err := store.DeadLetters(t.Context(), driver.DeadLetterFilter{Consumer: consumer, EventID: id, Source: "widgets"})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	return dls[0].ID
}

// TestDeadLetterShowUnknownDeliveries: a dead letter whose delivery count
// the store never knew (0) shows it as unknown, not as 0 deliveries.
func TestDeadLetterShowUnknownDeliveries(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	b := setup(t, cfg)
	id := storeDeadLetter(t, b.db, consumerName, "w-unknown", "", 0)
	out, err := runCommand(t, commandOptions(cfg), "dead-letters", "show", fmt.Sprint(id))
	require.NoError(t, err)
	require.Regexp(t, `(?m)^deliveries\s+unknown$`, out)
	require.Regexp(t, `(?m)^\s+\S+\s+failed\s+code widget_rejected, attempts 1, deliveries unknown$`, out)
}

// TestResolveReasonNotText: a --reason or --by that no store can record
// (bytes that are not UTF-8) is refused before anything is recorded,
// naming the flag, on every database: PostgreSQL failed with its own
// error, SQLite stored the bytes.
func TestResolveReasonNotText(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	b := setup(t, cfg)
	id := fmt.Sprint(storeDeadLetter(t, b.db, consumerName, "w-text", "", 0))
	for _, args := range [][]string{
		{"dead-letters", "discard", id, "--by", "tester", "--reason", "junk \xff"},
		{"dead-letters", "replay", id, "--by", "tester", "--reason", "fixed \xff"},
		{"dead-letters", "replay", id, "--by", "tester\xff", "--reason", "fixed"},
	} {
		_, err := runCommand(t, commandOptions(cfg), args...)
		require.Error(t, err)
		require.Regexp(t, `^--(reason|by): is not valid UTF-8 text, or holds NUL$`, err.Error())
	}
	// Text past its length is refused too, naming the flag and the limit.
	for _, args := range [][]string{
		{"dead-letters", "discard", id, "--by", "tester", "--reason", strings.Repeat("x", driver.MaxResolutionReason+1)},
		{"dead-letters", "replay", id, "--by", strings.Repeat("é", driver.MaxResolutionBy), "--reason", "fixed"},
	} {
		_, err := runCommand(t, commandOptions(cfg), args...)
		require.Error(t, err)
		require.Regexp(t, `^--(reason|by): is longer than (4096|256) bytes$`, err.Error())
	}
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM dead_letters WHERE status = 'pending'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM dead_letter_history`), "no resolution recorded")
}

// TestShowEscapesHiddenText: dead-letters show and events show print the
// text that a producer (a message's metadata) or another operator (a
// reason) wrote with its newlines, tabs and escape sequences escaped: it
// printed them as they were, so that a metadata value could add a line
// "status pending" to the command's own, or clear the terminal.
func TestShowEscapesHiddenText(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	b := setup(t, cfg)
	store := testStore(t, b.db)
	const evil = "a\nstatus\tpending\x1b[2J\u202e"
	env, err := widgetAdded.Envelope(widgetAddedV1{Name: "w"}, framework.Attributes{ID: "w-evil", Source: "widgets"})
	require.NoError(t, err)
	msg, err := framework.NewMessage(env)
	require.NoError(t, err)
	msg.Metadata.Set("x-note", evil)
	require.NoError(t, store.PublishDeadLetter(t.Context(), driver.DeadLetter{
		Consumer: consumerName, Topic: widgetAdded.Type(), Source: "widgets", EventID: "w-evil",
		Type: widgetAdded.Type(), Version: 1, Code: "widget_rejected", Attempts: 1, Body: msg.Payload, Metadata: msg.Metadata,
	}))
	dls, err := store.DeadLetters(t.Context(), driver.DeadLetterFilter{EventID: "w-evil", Source: "widgets"})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	id := fmt.Sprint(dls[0].ID)
	_, err = runCommand(t, commandOptions(cfg), "dead-letters", "discard", id, "--by", "tester", "--reason", "done\ncode\tfake")
	require.NoError(t, err)

	escaped := `a\nstatus\tpending\x1b[2J\u202e`
	for _, args := range [][]string{{"dead-letters", "show", id}, {"events", "show", "widgets", "w-evil"}} {
		out, err := runCommand(t, commandOptions(cfg), args...)
		require.NoError(t, err)
		require.NotContains(t, out, "\x1b", args)
		require.NotContains(t, out, "\u202e", args)
		require.NotRegexp(t, `(?m)^(status\s+pending|code\s+fake)`, out, "no line of the command's own is forged: %v", args)
		require.Contains(t, out, `done\ncode\tfake`, args)
		if args[0] == "dead-letters" {
			require.Regexp(t, `(?m)^metadata x-note\s+`+regexp.QuoteMeta(escaped)+`$`, out)
			require.Regexp(t, `(?m)^resolved\s+discarded by tester at \S+: done\\ncode\\tfake$`, out)
		}
	}
}

// TestResolveEscapesHiddenText: a replay refused because another operator
// discarded the dead letter prints who and why escaped, and a dry run the
// event's id and subject escaped (CloudEvents allows format characters
// such as a bidirectional override in both): the refusal printed the
// discarding operator's --by and --reason as they were, so that they could
// clear the terminal and forge a line "dead letter 2 replayed".
func TestResolveEscapesHiddenText(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	b := setup(t, cfg)
	store := testStore(t, b.db)
	publish := func(eventID, subject string) string {
		t.Helper()
		env, err := widgetAdded.Envelope(widgetAddedV1{Name: "w"}, framework.Attributes{ID: eventID, Source: "widgets", Subject: subject, SubjectSeq: 1})
		require.NoError(t, err)
		msg, err := framework.NewMessage(env)
		require.NoError(t, err)
		require.NoError(t, store.PublishDeadLetter(t.Context(), driver.DeadLetter{
			Consumer: consumerName, Topic: widgetAdded.Type(), Source: "widgets", EventID: eventID,
			Type: widgetAdded.Type(), Version: 1, Subject: subject, SubjectSeq: 1,
			Code: "widget_rejected", Attempts: 1, Body: msg.Payload, Metadata: msg.Metadata,
		}))
		dls, err := store.DeadLetters(t.Context(), driver.DeadLetterFilter{EventID: eventID, Source: "widgets"})
		require.NoError(t, err)
		require.Len(t, dls, 1)
		return fmt.Sprint(dls[0].ID)
	}
	discarded := publish("w-discarded", "")
	_, err := runCommand(t, commandOptions(cfg), "dead-letters", "discard", discarded,
		"--by", "mallory\x1b[2J\x1b]0;owned\a", "--reason", "ok\r\n\x1b[1A\x1b[2Kdead letter "+discarded+" replayed")
	require.NoError(t, err)
	pending := publish("w-\u202elive", "s\u2066x")

	out, err := runCommand(t, commandOptions(cfg), "dead-letters", "replay", discarded, "--by", "tester", "--reason", "fixed")
	require.Error(t, err)
	require.Contains(t, out, `refused: not pending: discarded by mallory\x1b[2J\x1b]0;owned\a at `)
	require.Contains(t, out, `(ok\r\n\x1b[1A\x1b[2Kdead letter `+discarded+` replayed)`)
	dry, err := runCommand(t, commandOptions(cfg), "dead-letters", "replay", pending, "--dry-run")
	require.NoError(t, err)
	require.Contains(t, dry, `event widgets/w-\u202elive, subject s\u2066x #1`)
	for _, o := range []string{out, dry} {
		require.NotContains(t, o, "\x1b")
		require.NotContains(t, o, "\r")
		require.NotContains(t, o, "\u202e")
		require.NotContains(t, o, "\u2066")
		require.NotRegexp(t, `(?m)^dead letter \d+ replayed`, o, "no line of the command's own is forged")
	}
}

// TestDiscardAgainSaysSo: discard --release-parked of a dead letter
// discarded before records no discard (its history keeps the first one
// alone), and says so: it printed "dead letter N discarded", as if the
// second --by and --reason had been recorded.
func TestDiscardAgainSaysSo(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	b := setup(t, cfg)
	id := fmt.Sprint(storeDeadLetter(t, b.db, consumerName, "w-again", "", 0))
	out, err := runCommand(t, commandOptions(cfg), "dead-letters", "discard", id, "--by", "alice", "--reason", "test data")
	require.NoError(t, err)
	require.Equal(t, "dead letter "+id+" discarded\n", out)

	out, err = runCommand(t, commandOptions(cfg), "dead-letters", "discard", id, "--release-parked", "--by", "bob", "--reason", "superseded")
	require.NoError(t, err, "--release-parked works on a dead letter discarded before")
	require.NotContains(t, out, "dead letter "+id+" discarded\n")
	require.Regexp(t, `^dead letter `+id+` was discarded before, by alice at \S+ \(test data\): this discard is not recorded\n$`, out)
	show, err := runCommand(t, commandOptions(cfg), "dead-letters", "show", id)
	require.NoError(t, err)
	require.Contains(t, show, "by alice: test data")
	require.NotContains(t, show, "superseded", "nothing of the second discard is recorded")
}

// TestEventsShowNormalizesSource: events show finds an event whose source
// is typed in another spelling of the same URI reference, as Decode keys
// it: "café" finds the dead letter of source "caf%C3%A9".
func TestEventsShowNormalizesSource(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	b := setup(t, cfg)
	store := testStore(t, b.db)
	env, err := widgetAdded.Envelope(widgetAddedV1{Name: "w"}, framework.Attributes{ID: "w-1", Source: "café"})
	require.NoError(t, err)
	msg, err := framework.NewMessage(env)
	require.NoError(t, err)
	decoded, err := framework.Decode(msg.Payload, 0)
	require.NoError(t, err)
	require.Equal(t, "caf%C3%A9", decoded.Source)
	require.NoError(t, store.PublishDeadLetter(t.Context(), driver.DeadLetter{
		Consumer: consumerName, Topic: widgetAdded.Type(), Source: decoded.Source, EventID: "w-1",
		Type: widgetAdded.Type(), Version: 1, Code: "widget_rejected", Attempts: 1, Body: msg.Payload, Metadata: msg.Metadata,
	}))
	for _, source := range []string{"café", "caf%C3%A9"} {
		out, err := runCommand(t, commandOptions(cfg), "events", "show", source, "w-1")
		require.NoError(t, err)
		require.Regexp(t, `(?m)^dead letter \d+ of `+regexp.QuoteMeta(consumerName)+`: pending, code widget_rejected`, out, source)
	}
}

// TestCommandsRefuseDuplicateConsumer: the operator's commands refuse a
// consumer name declared twice, as serve does at start: consumers listed
// it twice and exited 0.
func TestCommandsRefuseDuplicateConsumer(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	setup(t, cfg)
	twice := commandOptions(cfg, handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)))
	for _, args := range [][]string{
		{"consumers"},
		{"dead-letters", "list"},
		{"events", "show", "widgets", "w-1"},
	} {
		out, err := runCommand(t, twice, args...)
		require.ErrorContains(t, err, "consumer name declared more than once: "+consumerName, "%v: %s", args, out)
	}
	_, err := runCommand(t, commandOptions(cfg), "consumers")
	require.NoError(t, err, "declared once")
}

// TestCommandsNoteUndeclaredConsumer: a filter by a consumer name that the
// service does not declare selects nothing; the command says so on its
// error output, and goes on (the database may hold what a removed consumer
// left).
func TestCommandsNoteUndeclaredConsumer(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	setup(t, cfg)
	for _, tt := range []struct {
		args []string
		note bool
	}{
		{[]string{"dead-letters", "list", "--consumer", consumerName + "x"}, true},
		{[]string{"dead-letters", "replay", "--consumer", "nope", "--dry-run"}, true},
		{[]string{"dead-letters", "parked", "--consumer", "nope"}, true},
		{[]string{"dead-letters", "list", "--consumer", consumerName}, false},
		{[]string{"dead-letters", "list"}, false},
	} {
		var out, errOut bytes.Buffer
		cmd := app.Command("widgets", commandOptions(cfg))
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		cmd.SetArgs(tt.args)
		require.NoError(t, cmd.ExecuteContext(t.Context()), "%v", tt.args)
		if tt.note {
			require.Contains(t, errOut.String(), "note: no consumer named "+tt.args[3]+" is declared in this service (declared: "+consumerName+")", "%v", tt.args)
		} else {
			require.Empty(t, errOut.String(), "%v", tt.args)
		}
	}
}

// TestDataExceptionIsPermanent: a handler whose statement PostgreSQL
// refuses for the value it writes (text holding NUL, SQLSTATE 22021) is
// dead-lettered at its first attempt as data_exception: it was retried
// and dead-lettered as retries_exhausted, although it would fail the same
// way every time. A handler's own classification wins.
func TestDataExceptionIsPermanent(t *testing.T) {
	t.Parallel()
	cfg := postgresConfig(t)
	cfg.Defaults.Attempts = 3
	b := setupWith(t, cfg, handlers.On(widgetAdded, func(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
		insert := db.Rebind(`INSERT INTO widgets (name, event_id) VALUES (?, ?)`)
		return func(ctx context.Context, ev framework.Event[widgetAddedV1]) error {
			_, err := framework.Conn(ctx, db).ExecContext(ctx, insert, ev.Data.Name, ev.ID)
			return err
		}
	}))
	b.publish(t, "w-nul", "a\x00b")
	b.publish(t, "w-ok", "ab")
	waitFor(t, "the NUL dead-lettered, the other applied", func() bool {
		return b.count(t, `SELECT count(*) FROM dead_letters WHERE event_id = 'w-nul'`) == 1 &&
			b.count(t, `SELECT count(*) FROM widgets WHERE event_id = 'w-ok'`) == 1
	})
	var dl struct {
		Code     string `db:"code"`
		Attempts int    `db:"attempts"`
	}
	require.NoError(t, b.db.Get(&dl, `SELECT code, attempts FROM dead_letters WHERE event_id = 'w-nul'`))
	require.Equal(t, "data_exception", dl.Code)
	require.Equal(t, 1, dl.Attempts, "not retried")
}

// TestErrorPastDeadlineIsTimeout: an attempt that fails once its deadline
// passed is dead-lettered as timeout, whatever error its handler returns:
// one that waited on PostgreSQL (pgx's timeout error), and one that
// returns an error of its own that does not wrap the context's, as a
// statement failed by the server's statement_timeout does (SQLSTATE
// 57014): that one said retries_exhausted.
func TestErrorPastDeadlineIsTimeout(t *testing.T) {
	t.Parallel()
	for name, handle := range map[string]func(ctx context.Context, db *sqlx.DB) error{
		"Statement": func(ctx context.Context, db *sqlx.DB) error {
			_, err := framework.Conn(ctx, db).ExecContext(ctx, `SELECT pg_sleep(5)`)
			return err
		},
		"OwnError": func(ctx context.Context, _ *sqlx.DB) error {
			<-ctx.Done()
			return errors.New("canceling statement due to statement timeout")
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := postgresConfig(t)
			cfg.Defaults.Attempts, cfg.Defaults.Timeout, cfg.Defaults.RetryDelay = 2, 300*time.Millisecond, time.Millisecond
			b := setupWith(t, cfg, handlers.On(widgetAdded, func(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
				return func(ctx context.Context, _ framework.Event[widgetAddedV1]) error { return handle(ctx, db) }
			}))
			b.publish(t, "w-slow", "slow")
			waitFor(t, "the slow one dead-lettered", func() bool {
				return b.count(t, `SELECT count(*) FROM dead_letters WHERE event_id = 'w-slow'`) == 1
			})
			var code string
			require.NoError(t, b.db.Get(&code, `SELECT code FROM dead_letters WHERE event_id = 'w-slow'`))
			require.Equal(t, "timeout", code)
		})
	}
}

// TestShowBodyAsItIs: dead-letters show indents a JSON body as it is. It
// decoded and encoded it again, which kept one of two attributes with the
// same name (so the operator could not see why the message was
// malformed_envelope), sorted the members and rounded large numbers.
func TestShowBodyAsItIs(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	b := setup(t, cfg)
	store := testStore(t, b.db)
	body := `{"specversion":"1.0","id":"w-1","id":"w-2","source":"widgets","n":12345678901234567890,"html":"<&>"}`
	require.NoError(t, store.PublishDeadLetter(t.Context(), driver.DeadLetter{
		Consumer: consumerName, Topic: widgetAdded.Type(), Source: "", EventID: framework.BodyKey([]byte(body)).ID,
		Code: framework.CodeMalformedEnvelope, Body: []byte(body),
	}))
	dls, err := store.DeadLetters(t.Context(), driver.DeadLetterFilter{Consumer: consumerName})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	out, err := runCommand(t, commandOptions(cfg), "dead-letters", "show", fmt.Sprint(dls[0].ID))
	require.NoError(t, err)
	require.Contains(t, out, "body:\n  {\n    \"specversion\": \"1.0\",\n    \"id\": \"w-1\",\n    \"id\": \"w-2\",\n"+
		"    \"source\": \"widgets\",\n    \"n\": 12345678901234567890,\n    \"html\": \"<&>\"\n  }\n")
}

// TestCommandsRefuseMissingDatabase: the operator's commands on a SQLite
// file that does not exist (a mistyped path) say so, naming the variable
// and the migrate command, and leave no empty database behind, even with
// AutoMigrate; migrate creates it.
func TestCommandsRefuseMissingDatabase(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	for _, args := range [][]string{
		{"dead-letters", "list"},
		{"dead-letters", "replay", "1", "--dry-run"},
		{"consumers"},
		{"events", "show", "widgets", "w-1"},
		{"purge", "--dry-run"},
	} {
		_, err := runCommand(t, commandOptions(cfg), args...)
		require.ErrorContains(t, err, "no database file at "+cfg.DatabaseURL, "%v", args)
		require.ErrorContains(t, err, "check EFFECTIVELY_DATABASE_URL; this command does not create a database, `widgets migrate` does", "%v", args)
		require.NoDirExists(t, filepath.Dir(cfg.DatabaseURL), "%v", args)
	}
	_, err := runCommand(t, commandOptions(cfg), "migrate")
	require.NoError(t, err)
	out, err := runCommand(t, commandOptions(cfg), "dead-letters", "list")
	require.NoError(t, err)
	require.Equal(t, "ID  CONSUMER  CODE  TYPE  VERSION  SOURCE  EVENT  ATTEMPTS  REPEATS  LAST FAILED  STATUS\n", out, "none yet")
}
