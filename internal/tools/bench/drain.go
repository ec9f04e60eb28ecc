package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// A System is a consumer fed by a foreign producer, as a drain run
// measures it (see Drain). A System that is also a Sender has its latency
// measured.
type System interface {
	// Feed publishes the backlog before the consumer starts.
	Feed(ctx context.Context, msgs []Message) error
	// Start starts the consumer and returns once it is ready.
	Start(ctx context.Context) (*Process, error)
	// Effects is where the consumer's effects land.
	Effects() *EffectTable
}

// A Sender publishes one message while the consumer runs, for the paced
// producer of the latency phase.
type Sender interface {
	Send(ctx context.Context, m Message) error
}

// Drain measures sys: it feeds the run's backlog (Env.Backlog), starts the
// consumer, waits until every distinct event took effect and times the
// drain from the first effect to the last. Then, when sys is a Sender and
// the run is no smoke run, it feeds fresh events one at a time at half
// that rate for Options.LatencyDuration (at most Options.Events of them)
// and times each from its send to its effect. The consumer's allocations
// per message and the CPU use are counted over the drain, its peak RSS
// and CPU profile over its life. The result holds the effects counted
// once the consumer stopped.
func Drain(ctx context.Context, env *Env, sys System) (Result, error) {
	msgs, distinct := env.Backlog()
	return drainBacklog(ctx, env, sys, msgs, distinct)
}

// drainBacklog is Drain with a backlog of the caller's: msgs, of distinct
// events.
func drainBacklog(ctx context.Context, env *Env, sys System, msgs []Message, distinct int) (Result, error) {
	env.Logf("feeding %d messages (%d distinct events)", len(msgs), distinct)
	if err := sys.Feed(ctx, msgs); err != nil {
		return Result{}, fmt.Errorf("feed: %w", err)
	}
	p, err := sys.Start(ctx)
	if err != nil {
		return Result{}, err
	}
	res, err := drainPhase(ctx, env, p, sys.Effects(), len(msgs), distinct)
	if err != nil {
		return Result{}, fmt.Errorf("drain: %w", err)
	}
	env.Logf("drained %d effects at %.0f/s", res.Drained, res.EffectsPerSecond())

	if sender, ok := sys.(Sender); ok && !env.Smoke && res.EffectsPerSecond() > 0 {
		lat, err := latencyPhase(ctx, env, sys, sender, p, res.EffectsPerSecond()/2, distinct)
		if err != nil {
			return Result{}, fmt.Errorf("latency: %w", err)
		}
		res.Latency = lat
		res.Events += lat.Events
		res.Messages += lat.Events
	}

	if res.PeakRSS, err = p.PeakRSS(); err != nil {
		return Result{}, err
	}
	if err := p.Stop(stopTimeout); err != nil {
		return Result{}, err
	}
	if res.Effects, res.DistinctEffects, err = sys.Effects().Count(ctx); err != nil {
		return Result{}, err
	}
	if res.Profile, err = ProfileTop(ctx, p.ProfilePath(), 10); err != nil {
		return Result{}, err
	}
	return res, nil
}

// drainPhase lets the started consumer p drain messages (of distinct
// events) and returns the drain's figures: its effects and their span,
// the allocations per message and the CPU use.
func drainPhase(ctx context.Context, env *Env, p *Process, effects *EffectTable, messages, distinct int) (Result, error) {
	mallocs, cpu, err := beginDrain(ctx, p, messages, func(ctx context.Context) error {
		return waitEffects(ctx, env, p, effects, distinct)
	})
	if err != nil {
		return Result{}, err
	}
	drained, err := effects.Read(ctx)
	if err != nil {
		return Result{}, err
	}
	startUp, steady := startUpSteady(drained, p.Started())
	return Result{
		Messages:         messages,
		Events:           distinct,
		Drained:          len(drained),
		Elapsed:          span(drained),
		StartUp:          startUp,
		Steady:           steady,
		AllocsPerMessage: mallocs / float64(messages),
		CPU:              cpu,
	}, nil
}

// startUpSteady returns the time from started (zero: not known) to the
// first of effects, and the steady-state rate: effects per second from
// the one that follows the first SteadyAfter of them to the last (zero
// with fewer than 10 effects, or no time between them).
func startUpSteady(effects []Effect, started time.Time) (time.Duration, float64) {
	if len(effects) == 0 {
		return 0, 0
	}
	at := make([]time.Time, len(effects))
	for i, e := range effects {
		at[i] = e.At
	}
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	var startUp time.Duration
	if !started.IsZero() {
		startUp = max(0, at[0].Sub(started))
	}
	k := int(float64(len(at)) * SteadyAfter)
	if len(at) < 10 || !at[len(at)-1].After(at[k]) {
		return startUp, 0
	}
	return startUp, float64(len(at)-1-k) / at[len(at)-1].Sub(at[k]).Seconds()
}

// beginDrain begins the started process p and waits for its drain of
// messages with wait. It returns the allocations p made meanwhile and the
// CPU use.
func beginDrain(ctx context.Context, p *Process, messages int, wait func(context.Context) error) (float64, CPU, error) {
	m0, err := p.Mallocs(ctx)
	if err != nil {
		return 0, CPU{}, err
	}
	watch := watchProcesses(p.Pid())
	start := time.Now()
	var c0, c1 cpuSample
	c0, err = sampleCPU(p.Pid())
	if err == nil {
		err = p.Begin(ctx)
	}
	if err == nil {
		err = wait(ctx)
	}
	if err == nil {
		c1, err = sampleCPU(p.Pid())
	}
	seconds := time.Since(start).Seconds()
	groups := watch.finish()
	if err != nil {
		return 0, CPU{}, err
	}
	m1, err := p.Mallocs(ctx)
	if err != nil {
		return 0, CPU{}, err
	}
	cpu := cpuBetween(c0, c1, seconds, groups)
	cpu.Messages = messages
	return m1 - m0, cpu, nil
}

// latencyPhase feeds fresh events at rate and returns their latencies.
// before is the number of effects already there.
func latencyPhase(ctx context.Context, env *Env, sys System, sender Sender, p *Process, rate float64, before int) (*Latency, error) {
	n := min(env.Events, max(20, int(rate*env.LatencyDuration.Seconds())))
	msgs := Events(env.ID+"-l", n)
	env.Logf("latency: %d events at %.0f/s", n, rate)
	sent, err := Pace(ctx, rate, msgs, sender.Send)
	if err != nil {
		return nil, err
	}
	if err := waitEffects(ctx, env, p, sys.Effects(), before+n); err != nil {
		return nil, err
	}
	ds, err := latencies(ctx, sys.Effects(), msgs, sent)
	if err != nil {
		return nil, err
	}
	return &Latency{Rate: rate, Events: n, P50: Percentile(ds, 50), P99: Percentile(ds, 99)}, nil
}

// latencies reads the effects and returns, for each message, the time
// from its sending (sent, in the order of msgs) to its effect.
func latencies(ctx context.Context, effects *EffectTable, msgs []Message, sent []time.Time) ([]time.Duration, error) {
	all, err := effects.Read(ctx)
	if err != nil {
		return nil, err
	}
	at := make(map[string]time.Time, len(all))
	for _, e := range all {
		at[e.EventID] = e.At
	}
	ds := make([]time.Duration, 0, len(msgs))
	for i, m := range msgs {
		t, ok := at[m.ID]
		if !ok {
			return nil, fmt.Errorf("no effect of %s", m.ID)
		}
		ds = append(ds, t.Sub(sent[i]))
	}
	return ds, nil
}

// waitEffects waits until the table holds want effects, failing when the
// process exits or no effect comes for Options.StallTimeout.
func waitEffects(ctx context.Context, env *Env, p *Process, effects *EffectTable, want int) error {
	last, lastAt := -1, time.Now()
	for {
		n, err := effects.Progress(ctx)
		if err != nil {
			return err
		}
		if n >= want {
			// The table may hold foreign effects (see EffectTable): count
			// the run's own, once, now that there may be enough.
			if n, _, err = effects.Count(ctx); err != nil {
				return err
			}
			if n >= want {
				return nil
			}
		}
		if n != last {
			last, lastAt = n, time.Now()
		}
		if time.Since(lastAt) > env.StallTimeout {
			return fmt.Errorf("stalled at %d of %d effects for %s", n, want, env.StallTimeout)
		}
		if err := p.Exited(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// span is the time from the first effect to the last.
func span(effects []Effect) time.Duration {
	if len(effects) == 0 {
		return 0
	}
	first, last := effects[0].At, effects[0].At
	for _, e := range effects[1:] {
		if e.At.Before(first) {
			first = e.At
		}
		if e.At.After(last) {
			last = e.At
		}
	}
	return last.Sub(first)
}

// Effect is one effect of a consumer: the event it is of and when it was
// written.
type Effect struct {
	EventID string
	At      time.Time
}

// EffectTable is a consumer's table of effects, one row per effect, with
// the event's id in EventColumn and the time of the write in handled_at,
// filled by the column's default (see HandledAtColumn). Only the effects
// of the run's events count (ids starting with Prefix): on a broker that
// others use too, a foreign event may reach the consumer's queue.
type EffectTable struct {
	DB          *sqlx.DB
	Table       string
	EventColumn string
	// Prefix is the run's Env.ID.
	Prefix string
}

// HandledAtColumn is the definition of the handled_at column of an
// effect table on driver ("pgx" or "sqlite"): the time of the insert,
// filled by the database, in microseconds on PostgreSQL and milliseconds
// on SQLite.
func HandledAtColumn(driver string) string {
	if driver == "sqlite" {
		return handledAtSQLite
	}
	return handledAtPostgres
}

const (
	handledAtSQLite   = `handled_at INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))`
	handledAtPostgres = `handled_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()`
)

// Count returns the number of effects and of distinct events they are of.
func (t *EffectTable) Count(ctx context.Context) (total, distinct int, err error) {
	q := fmt.Sprintf(`SELECT count(*), count(DISTINCT %[1]s) FROM %[2]s WHERE %[1]s LIKE %[3]s`, t.EventColumn, t.Table, t.like())
	if err := t.DB.QueryRowxContext(ctx, q, t.Prefix+"-%").Scan(&total, &distinct); err != nil {
		return 0, 0, fmt.Errorf("count effects in %s: %w", t.Table, err)
	}
	return total, distinct, nil
}

// Progress returns how many effects the table holds, cheaply enough for
// a wait that polls it ten times a second: the run's own table, counted
// without Count's check of distinct events; on SQLite its highest rowid,
// which is its number of rows (only inserted, never deleted). Counting
// every row with its distinct events at each poll took the harness up to
// 0.6 of a core by the end of a 100,000-effect drain on SQLite, taken
// from the cores the consumer shares with it.
func (t *EffectTable) Progress(ctx context.Context) (int, error) {
	q := `SELECT count(*) FROM ` + t.Table
	if t.DB.DriverName() == "sqlite" {
		q = `SELECT COALESCE(max(rowid), 0) FROM ` + t.Table
	}
	var n int
	if err := t.DB.QueryRowContext(ctx, q).Scan(&n); err != nil {
		return 0, fmt.Errorf("count effects in %s: %w", t.Table, err)
	}
	return n, nil
}

// like is the placeholder of the prefix pattern.
func (t *EffectTable) like() string {
	if t.DB.DriverName() == "sqlite" {
		return "?"
	}
	return "$1"
}

// Read returns every effect.
func (t *EffectTable) Read(ctx context.Context) ([]Effect, error) {
	q := fmt.Sprintf(`SELECT %[1]s, handled_at FROM %[2]s WHERE %[1]s LIKE %[3]s`, t.EventColumn, t.Table, t.like())
	rows, err := t.DB.QueryContext(ctx, q, t.Prefix+"-%")
	if err != nil {
		return nil, fmt.Errorf("read effects of %s: %w", t.Table, err)
	}
	defer rows.Close()
	var out []Effect
	for rows.Next() {
		var e Effect
		if t.DB.DriverName() == "sqlite" {
			var ms int64
			if err := rows.Scan(&e.EventID, &ms); err != nil {
				return nil, fmt.Errorf("read effects of %s: %w", t.Table, err)
			}
			e.At = time.UnixMilli(ms)
		} else if err := rows.Scan(&e.EventID, &e.At); err != nil {
			return nil, fmt.Errorf("read effects of %s: %w", t.Table, err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read effects of %s: %w", t.Table, err)
	}
	return out, nil
}

// ProfileTop returns the top n functions of the CPU profile at path by
// flat time (go tool pprof -top), one a line; nothing when path is empty
// or holds no profile.
func ProfileTop(ctx context.Context, path string, n int) ([]string, error) {
	if path == "" {
		return nil, nil
	}
	if st, err := os.Stat(path); errors.Is(err, os.ErrNotExist) || (err == nil && st.Size() == 0) {
		return nil, nil
	}
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", fmt.Sprintf("-nodecount=%d", n), path).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("go tool pprof -top %s: %w: %s", path, err, strings.TrimSpace(string(out)))
	}
	var lines []string
	table := false
	for line := range strings.Lines(string(out)) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(strings.TrimSpace(line), "flat") {
			table = true
		}
		if table || strings.HasPrefix(line, "Showing") || strings.HasPrefix(line, "Duration") {
			lines = append(lines, line)
		}
	}
	return lines, nil
}
