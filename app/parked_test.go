package app_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/middleware"
)

// TestDeadLettersParked drives a strict-order consumer of a running
// service, with group commit, on each transport: the events behind a
// dead letter of their subject are parked (acknowledged, not processed,
// no sequence_gap), the parked command lists them per subject, replaying
// the dead letter applies it and then them in order while another subject
// moves on, and a discard keeps them parked unless --release-parked. It
// sets the environment, so it does not run in parallel.
func TestDeadLettersParked(t *testing.T) {
	for _, tc := range transportConfigs {
		t.Run(tc.name, func(t *testing.T) { testDeadLettersParked(t, tc.config(t)) })
	}
}

func testDeadLettersParked(t *testing.T, cfg app.Config) {
	name := "widgets.ordered-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var refuse sync.Map // event ids refused while listed
	ordered := handlers.Register(name, handlers.On(widgetAdded, func(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
		return func(ctx context.Context, ev framework.Event[widgetAddedV1]) error {
			if _, ok := refuse.Load(ev.ID); ok {
				return framework.Permanent("widget_rejected", errors.New("not today"))
			}
			// The oracle: an event takes effect after its subject's
			// predecessor (unless that one is refused for good) and
			// before its later events. It reads the effects, not the
			// framework's checkpoints: those move at a batch's end.
			conn := framework.Conn(ctx, db)
			var later, before int
			if err := sqlx.GetContext(ctx, conn, &later, db.Rebind(`SELECT count(*) FROM widgets WHERE name = ? AND event_id >= ?`), "ordered:"+ev.Subject, ev.ID); err != nil {
				return err
			}
			pred := fmt.Sprintf("%s%d", ev.Subject, ev.SubjectSeq-1)
			if err := sqlx.GetContext(ctx, conn, &before, db.Rebind(`SELECT count(*) FROM widgets WHERE name = ? AND event_id = ?`), "ordered:"+ev.Subject, pred); err != nil {
				return err
			}
			if _, refused := refuse.Load(pred); later != 0 || (ev.SubjectSeq > 1 && before == 0 && !refused) {
				return framework.Permanent("out_of_order", fmt.Errorf("#%d: %d effects at or after it, its predecessor's %d", ev.SubjectSeq, later, before))
			}
			_, err := conn.ExecContext(ctx, db.Rebind(`INSERT INTO widgets (name, event_id) VALUES (?, ?)`), "ordered:"+ev.Subject, ev.ID)
			return err
		}
	}))
	cfg.Consumers = map[string]middleware.Settings{name: {StrictOrder: true}}
	b := setup(t, cfg, ordered)
	setEnv(t, cfg)
	run := func(args ...string) string {
		t.Helper()
		out, err := runCommand(t, fx.Options(
			handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
			ordered,
			fx.Supply(widgetMigrations),
		), args...)
		require.NoError(t, err)
		return out
	}
	count := func(query string, args ...any) int { return b.count(t, b.db.Rebind(query), args...) }
	publish := func(id, subject string, n int64) {
		t.Helper()
		env, err := widgetAdded.Envelope(widgetAddedV1{Name: id}, framework.Attributes{ID: id, Source: "widgets", Subject: subject, SubjectSeq: n})
		require.NoError(t, err)
		msg, err := framework.NewMessage(env)
		require.NoError(t, err)
		require.NoError(t, b.transport.Publisher().Publish(widgetAdded.Type(), msg))
	}
	applied := func(subject string) []string {
		var ids []string
		require.NoError(t, b.db.Select(&ids, b.db.Rebind(`SELECT event_id FROM widgets WHERE name = ? ORDER BY event_id`), "ordered:"+subject))
		return ids
	}
	parked := func() int {
		return count(`SELECT count(*) FROM parked_events WHERE consumer = ? AND reason = 'parked'`, name)
	}
	deadLetter := func(id string) int64 {
		var dl int64
		waitFor(t, "the dead letter of "+id, func() bool {
			return b.db.Get(&dl, b.db.Rebind(`SELECT id FROM dead_letters WHERE consumer = ? AND event_id = ?`), name, id) == nil
		})
		return dl
	}
	// parkBehind publishes the first event of subject, which takes
	// effect, the second, which is dead-lettered, then the third and
	// fourth, which are parked behind it; it returns the dead letter.
	parkBehind := func(subject string) int64 {
		id := func(n int64) string { return fmt.Sprintf("%s%d", subject, n) }
		publish(id(1), subject, 1)
		waitFor(t, "the first event of "+subject, func() bool { return len(applied(subject)) == 1 })
		refuse.Store(id(2), true)
		publish(id(2), subject, 2)
		dl := deadLetter(id(2))
		before := parked()
		publish(id(4), subject, 4)
		publish(id(3), subject, 3)
		waitFor(t, "two more parked events", func() bool { return parked() == before+2 })
		require.Zero(t, count(`SELECT count(*) FROM processed_events WHERE consumer = ? AND event_id IN (?, ?)`, name, id(3), id(4)),
			"a parked event is not marked processed")
		require.Equal(t, []string{id(1)}, applied(subject))
		return dl
	}

	dl := parkBehind("s")
	require.Regexp(t, `(?m)^CONSUMER\s+SUBJECT\s+HELD\s+PARKED\s+COUNT\s+READY$`, run("dead-letters", "parked", "--consumer", name))
	require.Regexp(t, `(?m)^`+name+`\s+s\s+#2 widgets/s2\s+3 4\s+2\s+0$`, run("dead-letters", "parked", "--consumer", name))
	require.Contains(t, run("dead-letters", "show", fmt.Sprint(dl)), "2 events of subject s are parked behind it: listed by dead-letters parked --subject s")
	require.Zero(t, count(`SELECT count(*) FROM dead_letters WHERE consumer = ? AND code = ?`, name, framework.CodeSequenceGap))
	// The outcome is counted after its transaction commits: the parked
	// rows can be seen a moment before the counter moves.
	parkedOutcomes := regexp.MustCompile(`effectively_messages_total\{[^}]*consumer="` + name + `"[^}]*outcome="parked"[^}]*\} 2`)
	waitFor(t, "two parked outcomes counted", func() bool { return parkedOutcomes.MatchString(metrics(t, b)) })

	// Replay the dead letter once its cause is fixed, while subject t
	// moves on.
	refuse.Delete("s2")
	publish("t1", "t", 1)
	out := run("dead-letters", "replay", fmt.Sprint(dl), "--by", "tester", "--reason", "fixed")
	require.Contains(t, out, "2 events of subject s are parked behind it: they are applied after it, in order, once it takes effect")
	publish("t2", "t", 2)
	publish("t3", "t", 3)
	waitFor(t, "s2, s3 and s4, then t1 to t3", func() bool { return len(applied("s")) == 4 && len(applied("t")) == 3 })
	require.Equal(t, []string{"s1", "s2", "s3", "s4"}, applied("s"), "each once, in order (else out_of_order)")
	require.Zero(t, parked())
	require.Equal(t, 1, count(`SELECT count(*) FROM dead_letters WHERE consumer = ?`, name), "the replayed one only")

	// A discard keeps the parked events parked, unless asked.
	dl = parkBehind("u")
	out = run("dead-letters", "discard", fmt.Sprint(dl), "--by", "tester", "--reason", "never to be")
	require.Contains(t, out, "2 events of subject u are parked behind it: they stay parked: discard it again with --release-parked to apply them")
	require.Equal(t, 2, parked())
	require.Regexp(t, `(?m)^`+name+`\s+u\s+#2 widgets/u2\s+3 4\s+2\s+0$`, run("dead-letters", "parked", "--consumer", name, "--subject", "u"))
	out = run("dead-letters", "discard", fmt.Sprint(dl), "--release-parked", "--by", "tester", "--reason", "never to be")
	require.Contains(t, out, "2 events of subject u parked behind it are released")
	waitFor(t, "u3 and u4", func() bool { return len(applied("u")) == 3 })
	require.Equal(t, []string{"u1", "u3", "u4"}, applied("u"), "in order, without u2")
	require.Zero(t, parked())
	require.Equal(t, 4, count(`SELECT seq FROM subject_checkpoints WHERE consumer = ? AND subject = 'u'`, name))
}

// metrics returns what b's service serves at /metrics.
func metrics(t *testing.T, b *bundle) string {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: waitLimit}
	resp, err := client.Get("http://" + b.http.Addr() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "/metrics: %s", body)
	return string(body)
}

// outcomes returns how many messages of consumer b's service counted with
// outcome (effectively_messages_total), 0 before the first.
func outcomes(t *testing.T, b *bundle, consumer string, outcome framework.Outcome) int {
	t.Helper()
	m := regexp.MustCompile(`effectively_messages_total\{[^}]*consumer="` + regexp.QuoteMeta(consumer) + `"[^}]*outcome="` + string(outcome) + `"[^}]*\} (\d+)`).FindStringSubmatch(metrics(t, b))
	if m == nil {
		return 0
	}
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return n
}
