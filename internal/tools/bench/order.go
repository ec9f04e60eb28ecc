package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/app"
)

// The ordering scenarios: the example service fed events of a few busy
// subjects (hot keys) or of many quiet ones (cold keys), each subject's
// numbered in sequence, unordered and with strict_order.
const (
	// OrderGate is the share of the best run's effects per second that
	// strict_order must reach in the ordering scenarios: with two runs,
	// at least that share of the unordered run's.
	OrderGate = 0.8
	// OrderHotSubjects is how many subjects the hot-key scenarios'
	// events are spread over, whatever their number.
	OrderHotSubjects = 20
	// OrderHotScale is the share of Options.Events the hot-key scenarios
	// drain: 6,000 events at the default size, 300 a subject.
	OrderHotScale = 0.3
	// OrderHotRounds is how many times the hot-key scenarios measure
	// each run in a full bench: a run drains its 6,000 events in about
	// 0.4 s, and in a full bench at three rounds the PostgreSQL
	// transport's ratio came out at 0.74 once, where single scenario runs
	// of the same code gave 0.86 and 0.89 the same hour (the code before
	// 0.72 and 0.84).
	OrderHotRounds = 7
	// OrderColdPerSubject is how many events each subject has in the
	// cold-key scenarios: 4,000 subjects at the default size.
	OrderColdPerSubject = 10
	// OrderColdScale is how many times Options.Events the cold-key
	// scenarios drain: at the default size a run drained 20,000 in about
	// a second, and six interleaved runs of the PostgreSQL transport's
	// gave ratios from 0.73 to 0.85 with the same code.
	OrderColdScale = 2
)

// The runs of the ordering scenarios.
const (
	orderUnordered = "example service, unordered (default configuration)"
	orderStrict    = "example service, strict_order"
)

// orderStrictConfig is the example's configuration file of the
// strict_order runs: the consumer's own entry.
const orderStrictConfig = "consumers:\n  " + serviceQueue + ":\n    strict_order: true\n"

// orderHeat says how the ordering scenario's events are spread over
// subjects.
type orderHeat struct {
	// name is hot or cold.
	name string
	// subjects returns the number of subjects of n events.
	subjects  func(n int) int
	scale     float64
	minRounds int
}

var (
	hotKeys = orderHeat{name: "hot", scale: OrderHotScale, minRounds: OrderHotRounds, subjects: func(n int) int {
		return max(1, min(n, OrderHotSubjects))
	}}
	coldKeys = orderHeat{name: "cold", scale: OrderColdScale, subjects: func(n int) int {
		return max(1, n/OrderColdPerSubject)
	}}
)

// orderScenario: the example service on transport, fed the events of
// heat's subjects, unordered against strict_order.
func orderScenario(transport string, heat orderHeat) Scenario {
	title, needs := "PostgreSQL transport", []Need{NeedPostgres}
	feed := "inserted into the topic table by the documented `INSERT`, 500 to a transaction"
	if transport == "amqp" {
		title, needs = "AMQP + PostgreSQL", []Need{NeedPostgres, NeedAMQP}
		feed = "published by plain amqp091-go to the type's fanout exchange with publisher confirms"
	}
	spread := fmt.Sprintf("%d subjects (%d events each at the default size)", OrderHotSubjects, int(DefaultEvents*OrderHotScale)/OrderHotSubjects)
	if heat.name == "cold" {
		spread = fmt.Sprintf("%d events a subject (%d subjects at the default size)", OrderColdPerSubject, DefaultEvents*OrderColdScale/OrderColdPerSubject)
	}
	measure := func(strict bool) func(context.Context, *Env) (Result, error) {
		return func(ctx context.Context, env *Env) (Result, error) {
			return measureOrder(ctx, env, transport, heat, strict)
		}
	}
	return Scenario{
		Name:  "order-" + heat.name + "-" + transport,
		Title: fmt.Sprintf("Ordered events, %s keys, %s", heat.name, title),
		About: fmt.Sprintf("The example service (`EFFECTIVELY_TRANSPORT=%s`, default configuration: %d messages in "+
			"flight) drains a backlog of events that carry `subject` and `subjectseq`, %s: %s, each subject's "+
			"numbered from 1 in the order published, the subjects interleaved round robin as a shop's orders "+
			"would be; the run's share of duplicates repeats earlier events (same id and `subjectseq`) later on. "+
			"Unordered (the baseline) against `strict_order: true` in the consumer's entry of the configuration "+
			"file, which sequences each subject's events in the process: one at a time, in arrival order, other "+
			"subjects at once. After each drain the harness reads the order of the inserts from a `bigserial` "+
			"column it adds to `reminders`: under strict_order every subject's effects must have taken effect "+
			"in `subjectseq` order (unordered, the run notes how many subjects came out of order), and in both "+
			"runs no event may be dead-lettered or parked. No latency phase (its events carry no `subjectseq`). "+
			"Gate: strict_order at least %.1f of the best run's effects/s.",
			transport, app.DefaultConcurrency, feed, spread, OrderGate),
		Needs: needs,
		Runs: []Run{
			// The smoke of the strict_order run goes through the same
			// code, with the sequencing besides: TestSmoke skips this one.
			{Name: orderUnordered, Baseline: true, NoSmoke: true, Measure: measure(false)},
			{Name: orderStrict, Measure: measure(true)},
		},
		Scale:     heat.scale,
		MinRounds: heat.minRounds,
		Gate:      &Gate{Run: orderStrict, Min: OrderGate},
	}
}

// measureOrder drains heat's ordered backlog through the example service
// on transport, with strict_order when strict, and checks the order of
// the effects and that nothing was dead-lettered.
func measureOrder(ctx context.Context, env *Env, transport string, heat orderHeat, strict bool) (Result, error) {
	config := ""
	if strict {
		config = orderStrictConfig
	}
	sys, db, err := newOrderService(ctx, env, transport, config)
	if err != nil {
		return Result{}, err
	}
	// The order of the inserts, by the database: the next event of a
	// strict_order subject starts once its predecessor's transaction
	// committed, so its insert draws a later number.
	if _, err := db.ExecContext(ctx, `ALTER TABLE reminders ADD COLUMN `+orderColumn+` bigserial`); err != nil {
		return Result{}, fmt.Errorf("number the reminders: %w", err)
	}
	msgs, distinct, keys := orderBacklog(env.ID+"-b", env.Events, heat.subjects(env.Events), env.Duplicates)
	env.Logf("%d subjects, strict_order %v", heat.subjects(env.Events), strict)
	res, err := drainBacklog(ctx, env, noLatency{sys}, msgs, distinct)
	if err != nil {
		return res, err
	}
	out, subjects, err := checkOrder(ctx, sys.Effects(), keys)
	if err != nil {
		return res, err
	}
	env.Logf("order: %d of %d subjects' effects out of subjectseq order", len(out), subjects)
	stopped, err := orderStopped(ctx, db, env.ID)
	switch {
	case err != nil:
		return res, err
	case stopped != "":
		return res, fmt.Errorf("%s: want none", stopped)
	case strict && len(out) > 0:
		return res, fmt.Errorf("%d of %d subjects' effects out of subjectseq order under strict_order, e.g. %s", len(out), subjects, strings.Join(out[:min(3, len(out))], "; "))
	case len(out) > 0:
		res.Note = fmt.Sprintf("%d of %d subjects' effects out of subjectseq order (no order asked), e.g. %s", len(out), subjects, out[0])
	}
	return res, nil
}

// orderColumn is the column the ordering scenarios add to the example's
// reminders: the order of the inserts.
const orderColumn = "bench_order"

// newOrderService prepares the example service on transport with config
// as its configuration file (none when empty), and returns it with its
// database.
func newOrderService(ctx context.Context, env *Env, transport, config string) (System, *sqlx.DB, error) {
	if transport == "amqp" {
		s, err := newAMQPService(ctx, env, config)
		if err != nil {
			return nil, nil, err
		}
		return s, s.db, nil
	}
	s, err := newPostgresService(ctx, env)
	if err != nil {
		return nil, nil, err
	}
	if config != "" {
		s.config = filepath.Join(env.Dir, "config.yaml")
		if err := os.WriteFile(s.config, []byte(config), 0o600); err != nil {
			return nil, nil, fmt.Errorf("write config: %w", err)
		}
	}
	return s, s.db, nil
}

// noLatency is a System without the latency phase: the paced producer
// sends events without subjectseq.
type noLatency struct{ System }

// orderKey is an event's place in its subject's sequence.
type orderKey struct {
	subject string
	seq     int
}

// orderBacklog returns n messages whose ids start with prefix, the events
// of subjects subjects, each subject's numbered from 1 in the order
// published, subjects interleaved round robin; a share dup of them repeat
// an earlier event at a random later place, as Backlog's do. It returns
// the number of distinct events and the place of each by id.
func orderBacklog(prefix string, n, subjects int, dup float64) ([]Message, int, map[string]orderKey) {
	repeats := int(float64(n) * dup)
	distinct := n - repeats
	msgs := make([]Message, 0, n)
	keys := make(map[string]orderKey, distinct)
	for i := range distinct {
		id := fmt.Sprintf("%s-%d", prefix, i)
		k := orderKey{subject: fmt.Sprintf("order-%d", i%subjects), seq: i/subjects + 1}
		keys[id] = k
		msgs = append(msgs, newMessage(id, k.subject, k.seq))
	}
	return withRepeats(msgs, repeats, uint64(n)), distinct, keys
}

// checkOrder reads the effects in the order of their inserts and returns
// the subjects whose effects are out of subjectseq order (see
// outOfOrder) and the number of subjects.
func checkOrder(ctx context.Context, t *EffectTable, keys map[string]orderKey) ([]string, int, error) {
	q := fmt.Sprintf(`SELECT %[1]s FROM %[2]s WHERE %[1]s LIKE $1 ORDER BY %[3]s`, t.EventColumn, t.Table, orderColumn)
	var ids []string
	if err := t.DB.SelectContext(ctx, &ids, q, t.Prefix+"-%"); err != nil {
		return nil, 0, fmt.Errorf("read the order of the effects: %w", err)
	}
	out, subjects := outOfOrder(ids, keys)
	return out, subjects, nil
}

// outOfOrder returns, of the effects of the events ids in the order they
// took effect, the subjects whose effects are out of subjectseq order,
// each with its first effect that came after a later one, and the number
// of subjects. Ids that keys lacks are skipped (Result.Check counts
// them); an event's second effect is out of order too.
func outOfOrder(ids []string, keys map[string]orderKey) ([]string, int) {
	last := make(map[string]int)
	bad := make(map[string]bool)
	var out []string
	for _, id := range ids {
		k, ok := keys[id]
		switch {
		case !ok || bad[k.subject]:
		case k.seq <= last[k.subject]:
			out = append(out, fmt.Sprintf("%s #%d after #%d", k.subject, k.seq, last[k.subject]))
			bad[k.subject] = true
		default:
			last[k.subject] = k.seq
		}
	}
	return out, len(last)
}

// orderStopped says what of the run's events (ids starting with prefix)
// the consumer dead-lettered or parked; empty when none.
func orderStopped(ctx context.Context, db *sqlx.DB, prefix string) (string, error) {
	var dead, parked int
	err := db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM dead_letters WHERE event_id LIKE $1), (SELECT count(*) FROM parked_events WHERE event_id LIKE $1)`, prefix+"-%").Scan(&dead, &parked)
	if err != nil {
		return "", fmt.Errorf("count dead letters and parked events: %w", err)
	}
	if dead == 0 && parked == 0 {
		return "", nil
	}
	return fmt.Sprintf("%d dead letters and %d parked events", dead, parked), nil
}
