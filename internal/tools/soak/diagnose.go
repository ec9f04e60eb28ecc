package soak

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/rabbitmq/amqp091-go"
)

// diagnose logs the state of up to ten subjects that the projection did
// not complete, or that keep a parked event: what it holds, the
// checkpoint, the parked events, the dead letters and the replays of
// their events, and how they changed.
func (r *run) diagnose(ctx context.Context) {
	want := r.plan.Expected()
	var rows []struct {
		Subject string
		LastSeq int64 `db:"last_seq"`
		Applied int64
	}
	if err := r.db.SelectContext(ctx, &rows, `SELECT subject, last_seq, applied FROM soak_projection`); err != nil {
		r.logf("diagnose: %v", err)
		return
	}
	have := map[string][2]int64{}
	for _, row := range rows {
		have[row.Subject] = [2]int64{row.LastSeq, row.Applied}
	}
	var bad []string
	for s, w := range want {
		if have[s] != w {
			bad = append(bad, s)
		}
	}
	var parked []string
	_ = r.db.SelectContext(ctx, &parked, `SELECT DISTINCT subject FROM parked_events WHERE consumer = $1 AND reason = 'parked'`, ProjectionConsumer)
	for _, s := range parked {
		if have[s] == want[s] {
			bad = append(bad, s) // complete, a parked event left over
		}
	}
	sort.Strings(bad)
	r.logf("diagnose: %d subjects incomplete or with a parked event left", len(bad))
	bad = r.unheldFirst(ctx, bad)
	for _, s := range bad[:min(len(bad), 10)] {
		var b strings.Builder
		fmt.Fprintf(&b, "subject %s: want (last, applied) %v, have %v", s, want[s], have[s])
		var cp []int64
		_ = r.db.SelectContext(ctx, &cp, `SELECT seq FROM subject_checkpoints WHERE consumer = $1 AND subject = $2`, ProjectionConsumer, s)
		fmt.Fprintf(&b, "; checkpoint %v", cp)
		var parked []string
		_ = r.db.SelectContext(ctx, &parked, `SELECT seq || ' ' || event_id || ' ' || reason FROM parked_events WHERE consumer = $1 AND subject = $2 ORDER BY seq`, ProjectionConsumer, s)
		fmt.Fprintf(&b, "; parked %v", parked)
		var dls []string
		_ = r.db.SelectContext(ctx, &dls, `SELECT id || ' ' || event_id || ' ' || code || ' ' || status FROM dead_letters WHERE consumer = $1 AND subject = $2 ORDER BY id`, ProjectionConsumer, s)
		fmt.Fprintf(&b, "; dead letters %v", dls)
		var applied []string
		_ = r.db.SelectContext(ctx, &applied, `SELECT e.event_id FROM soak_effects e WHERE e.consumer = $1 AND e.event_id LIKE $2 ORDER BY 1`, ProjectionConsumer, "e"+s[1:]+"%")
		fmt.Fprintf(&b, "; applied %v", applied)
		var replays []string
		_ = r.db.SelectContext(ctx, &replays, `SELECT id || ' dl ' || dead_letter_id || ' ' || (metadata->>'subjectseq') || ' sent ' || coalesce(sent_at::text, 'no') FROM replays WHERE consumer = $1 AND convert_from(body, 'UTF8') LIKE $2 ORDER BY id`, ProjectionConsumer, `%"subject":"`+s+`"%`)
		fmt.Fprintf(&b, "; replays %v", replays)
		fmt.Fprintf(&b, "; its marks, parked events and checkpoint, as they changed:\n%s", r.auditTrail(ctx, s))
		r.logf("%s", b.String())
	}
}

// qUnheld finds the holds of the projection (parked_events, reason
// dead_letter) that no dead letter of its event backs: an event that
// neither took effect nor is a dead letter, which the consumers should
// still be handling.
const qUnheld = `SELECT p.subject, p.seq, p.event_id FROM parked_events p
WHERE p.consumer = $1 AND p.reason = 'dead_letter' AND NOT EXISTS (SELECT 1 FROM dead_letters d
    WHERE d.consumer = p.consumer AND d.source = p.source AND d.event_id = p.event_id)
ORDER BY 1, 2`

// unheldFirst logs the holds that no dead letter backs (qUnheld), the
// delivery counts left, and the lines of the consumers' logs that name
// their events, and returns bad with those holds' subjects first.
func (r *run) unheldFirst(ctx context.Context, bad []string) []string {
	var unheld []struct {
		Subject string
		Seq     int64
		EventID string `db:"event_id"`
	}
	if err := r.db.SelectContext(ctx, &unheld, qUnheld, ProjectionConsumer); err != nil {
		r.logf("diagnose: holds: %v", err)
	}
	var counts []string
	if err := r.db.SelectContext(ctx, &counts, `SELECT consumer || ' ' || source || ' ' || event_id || ' ' || count || ' since ' || first_at FROM deliveries ORDER BY 1`); err != nil {
		r.logf("diagnose: delivery counts: %v", err)
	}
	r.logf("diagnose: %d holds without a dead letter; delivery counts %v", len(unheld), counts)
	var first []string
	for _, u := range unheld {
		r.logf("diagnose: %s #%d (%s) held without a dead letter; its log lines:\n%s", u.Subject, u.Seq, u.EventID, r.logLines(u.EventID, 40))
		if !slices.Contains(first, u.Subject) {
			first = append(first, u.Subject)
		}
	}
	for _, s := range bad {
		if !slices.Contains(first, s) {
			first = append(first, s)
		}
	}
	return first
}

// logLines returns up to n lines of the consumers' logs that contain
// text, the last ones.
func (r *run) logLines(text string, n int) string {
	var lines []string
	for _, name := range []string{"consumer-1", "consumer-2"} {
		b, _ := os.ReadFile(filepath.Join(r.svc.dir, name+".log"))
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, text) {
				lines = append(lines, name+": "+l)
			}
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// pending returns, on one line each, what the consumers have not
// settled yet: the effects missing, the events of the projection waiting
// for an earlier one (in the transport, or parked behind a gap) or
// parked behind a dead letter, the dead letters pending, the delivery
// counts not forgotten, what is unsent of the outbox and the replays, and
// the messages ready in each consumer's queue.
func (r *run) pending(ctx context.Context) string {
	f := r.plan.Figures()
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, "\n  "+format, args...) }
	for _, c := range []string{EffectsConsumer, ProjectionConsumer} {
		n, err := r.count(ctx, `SELECT count(DISTINCT event_id) FROM soak_effects WHERE consumer = $1`, c)
		line("%s: %d of %d effects (%v)", c, n, f.Distinct-f.Poison, err)
	}
	var parked []struct {
		Reason string
		Where  string
		N      int
	}
	// Where an event of parked_events stands: it took effect (a row left
	// behind), its turn came (seq right after the checkpoint), behind a
	// dead letter of its subject, or behind a gap (an earlier event that
	// has not taken effect).
	err := r.db.SelectContext(ctx, &parked, `
SELECT p.reason, CASE
    WHEN p.seq <= COALESCE(c.seq, 0) THEN 'took effect'
    WHEN p.reason = 'dead_letter' THEN 'holding'
    WHEN p.seq = COALESCE(c.seq, 0) + 1 THEN 'turn came'
    WHEN EXISTS (SELECT 1 FROM parked_events h WHERE h.consumer = p.consumer AND h.subject = p.subject
        AND h.reason = 'dead_letter' AND h.seq < p.seq AND h.seq > COALESCE(c.seq, 0)) THEN 'behind a dead letter'
    ELSE 'behind a gap' END AS where, count(*) AS n
FROM parked_events p LEFT JOIN subject_checkpoints c ON c.consumer = p.consumer AND c.subject = p.subject
GROUP BY 1, 2 ORDER BY 1, 2`)
	for _, p := range parked {
		line("parked_events %s, %s: %d", p.Reason, p.Where, p.N)
	}
	if err != nil {
		line("parked_events: %v", err)
	}
	var dls []struct {
		Consumer, Code string
		N              int
	}
	err = r.db.SelectContext(ctx, &dls, `SELECT consumer, code, count(*) AS n FROM dead_letters WHERE status = 'pending' GROUP BY 1, 2 ORDER BY 1, 2`)
	for _, d := range dls {
		line("dead letters pending %s %s: %d", d.Consumer, d.Code, d.N)
	}
	if err != nil {
		line("dead letters: %v", err)
	}
	for _, q := range []struct{ what, query string }{
		{"delivery counts", `SELECT count(*) FROM deliveries`},
		{"outbox rows unsent", `SELECT count(*) FROM outbox WHERE sent_at IS NULL`},
		{"replays unsent", `SELECT count(*) FROM replays WHERE sent_at IS NULL`},
	} {
		n, err := r.count(ctx, q.query)
		line("%s: %d (%v)", q.what, n, err)
	}
	for _, q := range []string{EffectsConsumer, ProjectionConsumer} {
		ready, consumers, err := r.queue(q)
		line("queue %s: %d ready, %d consumers (%v)", q, ready, consumers, err)
	}
	return b.String()
}

// queue returns how many messages are ready in queue and how many
// consumers read it, from the first RabbitMQ node that answers.
func (r *run) queue(name string) (int, int, error) {
	var errs []error
	for _, url := range strings.Split(r.amqpURLs, ",") {
		q, err := inspectQueue(url, name)
		if err == nil {
			return q.Messages, q.Consumers, nil
		}
		errs = append(errs, err)
	}
	return 0, 0, errors.Join(errs...)
}

// inspectQueue declares queue passively on the node at url.
func inspectQueue(url, queue string) (amqp091.Queue, error) {
	conn, err := amqp091.DialConfig(url, amqp091.Config{Dial: amqp091.DefaultDial(2 * time.Second)})
	if err != nil {
		return amqp091.Queue{}, fmt.Errorf("RabbitMQ at %s: %w", url, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return amqp091.Queue{}, fmt.Errorf("RabbitMQ channel: %w", err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return amqp091.Queue{}, fmt.Errorf("queue %s: %w", queue, err)
	}
	return q, nil
}
