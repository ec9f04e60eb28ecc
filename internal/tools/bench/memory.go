package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/app"
)

// The memory scenario's size and bound.
const (
	// MemoryScale is how many times Options.Events distinct events the
	// memory scenario drains: 1,000,000 at the default.
	MemoryScale = 50
	// MaxRSSGrowth is how much the consumer's resident set may grow from
	// its first sample, once a tenth of the events took effect, to its
	// last, once all did: a run that grows more fails.
	MaxRSSGrowth = 0.10
	// memorySamples is how many samples a drain takes, one per tenth.
	memorySamples = 10
	// memoryRowsPerInsert and memoryRowsPerTx size the feeder's
	// multi-row inserts and its transactions.
	memoryRowsPerInsert = 400
	memoryRowsPerTx     = 50000
	// memoryRecent is how many of the latest fresh messages a repeat is
	// drawn from.
	memoryRecent = 4096
	// memoryPoll is how often the drain's progress is read.
	memoryPoll = 50 * time.Millisecond
)

// memoryScenario: the example service's resident memory over a backlog
// fifty times the size of the others', on SQLite.
func memoryScenario() Scenario {
	return Scenario{
		Name:  "memory",
		Title: "Memory over a long drain (SQLite)",
		About: fmt.Sprintf("The example service (`EFFECTIVELY_TRANSPORT=sqlite`, default configuration: %d messages "+
			"in flight) on a file of its own drains a backlog of %d times the other scenarios' events (%s distinct "+
			"events at the default size, plus %.0f%% of repeats), inserted before it starts by another process "+
			"(the documented `INSERT` into `pubsub_messages`, %d rows a statement, %s rows a transaction). Once "+
			"every tenth of the events took effect the harness reads the service's resident set (VmRSS), its "+
			"anonymous part (RssAnon: the Go runtime's and SQLite's memory; the rest is mostly the binary's pages), "+
			"its peak (VmHWM), all from `/proc/PID/status`, and its Go heap in use (`go_memstats_heap_inuse_bytes` on its "+
			"/metrics). It shows whether the consumer's memory stays flat as the events it has handled and its "+
			"file grow: the run fails when the resident set at the end is more than %.0f%% above the one after "+
			"the first tenth. The service runs without a CPU profile (the profile's table of stacks grows "+
			"with its length), with no baseline and no latency phase.",
			app.DefaultSQLiteConcurrency, MemoryScale, thousands(float64(MemoryScale*DefaultEvents)), DefaultDuplicates*100,
			memoryRowsPerInsert, thousands(memoryRowsPerTx), MaxRSSGrowth*100),
		Once: true, // long, with no baseline
		Runs: []Run{{
			Name:    fmt.Sprintf("example service, default configuration (concurrency %d)", app.DefaultSQLiteConcurrency),
			Measure: measureMemory,
		}},
	}
}

// Memory is the consumer's memory as a drain went on: a sample once each
// tenth of the events took effect, the last once all did.
type Memory struct {
	Samples []MemorySample
}

// MemorySample is a reading of the consumer's memory, in bytes.
type MemorySample struct {
	// Effects is how many effects there were when it was read.
	Effects int
	// RSS is the resident set (VmRSS), HWM its peak so far (VmHWM).
	RSS, HWM int64
	// Anon is the anonymous part of RSS (RssAnon): the Go runtime's
	// memory and SQLite's; the rest is mostly the binary's pages.
	Anon int64
	// Heap is the Go heap in use (go_memstats_heap_inuse_bytes).
	Heap int64
}

// Growth returns how much the resident set grew from the first sample to
// the last, as a share of the first: 0.05 for 5%.
func (m *Memory) Growth() float64 {
	first, last, ok := m.ends()
	if !ok || first.RSS == 0 {
		return 0
	}
	return float64(last.RSS)/float64(first.RSS) - 1
}

// Check fails when the resident set grew more than bound from the first
// sample to the last.
func (m *Memory) Check(bound float64) error {
	first, last, ok := m.ends()
	if !ok {
		return errors.New("memory: fewer than two samples")
	}
	if float64(last.RSS) > float64(first.RSS)*(1+bound) {
		return fmt.Errorf("memory: the resident set grew %.1f%% (more than %.0f%%) from %s after %s effects to %s after %s",
			m.Growth()*100, bound*100, mib(first.RSS), thousands(float64(first.Effects)), mib(last.RSS), thousands(float64(last.Effects)))
	}
	return nil
}

func (m *Memory) ends() (first, last MemorySample, ok bool) {
	if m == nil || len(m.Samples) < 2 {
		return MemorySample{}, MemorySample{}, false
	}
	return m.Samples[0], m.Samples[len(m.Samples)-1], true
}

// String sums the memory up in a line.
func (m *Memory) String() string {
	first, last, ok := m.ends()
	if !ok {
		if m != nil && len(m.Samples) == 1 {
			s := m.Samples[0]
			return fmt.Sprintf("RSS %s after %s effects (a single reading)", mib(s.RSS), thousands(float64(s.Effects)))
		}
		return "memory: no reading"
	}
	return fmt.Sprintf("RSS %s after %s effects, %s after %s: %+.1f%% (bound +%.0f%%); anonymous %s, %s; VmHWM %s, %s; Go heap %s, %s",
		mib(first.RSS), thousands(float64(first.Effects)), mib(last.RSS), thousands(float64(last.Effects)),
		m.Growth()*100, MaxRSSGrowth*100, mib(first.Anon), mib(last.Anon), mib(first.HWM), mib(last.HWM), mib(first.Heap), mib(last.Heap))
}

func mib(b int64) string {
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// measureMemory drains the memory scenario's backlog through the example
// service on SQLite, sampling its memory each tenth of the way. Outside a
// smoke run it fails when the resident set grew more than MaxRSSGrowth.
func measureMemory(ctx context.Context, env *Env) (Result, error) {
	s, err := newSQLiteService(ctx, env, "")
	if err != nil {
		return Result{}, err
	}
	distinct := env.Events
	if !env.Smoke {
		distinct *= MemoryScale
	}
	feed := newMemoryFeed(env.ID+"-m", distinct, env.Duplicates)
	env.Logf("feeding %d messages (%d distinct events)", feed.total, distinct)
	start := time.Now()
	if err := feed.insert(ctx, s.db); err != nil {
		return Result{}, fmt.Errorf("feed: %w", err)
	}
	env.Logf("fed in %s", time.Since(start).Round(time.Millisecond))
	// No CPU profile: its table of stacks grows with its length (runtime/pprof's
	// profMap), by some 30 kB a second here, which is the harness's
	// memory, not the service's.
	vars := serviceVars("sqlite", s.file, s.config)
	vars["EFFECTIVELY_CPU_PROFILE"] = ""
	p, err := env.StartService(ctx, vars)
	if err != nil {
		return Result{}, err
	}
	mem := &Memory{}
	mallocs, cpu, err := beginDrain(ctx, p, feed.total, func(ctx context.Context) error {
		mem.Samples, err = sampleDrain(ctx, env, p, s.Effects(), distinct)
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("drain: %w", err)
	}
	res := Result{Events: distinct, Messages: feed.total, AllocsPerMessage: mallocs / float64(feed.total), CPU: cpu, Memory: mem}
	if res.Drained, res.Elapsed, err = effectSpan(ctx, s.Effects()); err != nil {
		return Result{}, err
	}
	env.Logf("drained %d effects at %.0f/s; %s", res.Drained, res.EffectsPerSecond(), mem)
	if res.PeakRSS, err = p.PeakRSS(); err != nil {
		return Result{}, err
	}
	if err := p.Stop(stopTimeout); err != nil {
		return Result{}, err
	}
	if res.Effects, res.DistinctEffects, err = s.Effects().Count(ctx); err != nil {
		return Result{}, err
	}
	if res.Profile, err = ProfileTop(ctx, p.ProfilePath(), 10); err != nil {
		return Result{}, err
	}
	if env.Smoke {
		res.Note = "smoke run: memory not checked"
		return res, nil
	}
	if err := mem.Check(MaxRSSGrowth); err != nil {
		return res, errors.Join(err, res.Check())
	}
	return res, nil
}

// memoryFeed generates the memory scenario's backlog as it inserts it,
// without holding it: distinct fresh events and total-distinct repeats,
// each of one of the latest fresh ones, byte for byte, spread at random
// (fixed by the size) after it.
type memoryFeed struct {
	prefix          string
	distinct, total int

	rng     *rand.Rand
	fresh   int       // fresh events generated so far
	repeats int       // repeats still to place
	recent  []Message // ring of the latest fresh messages
}

// newMemoryFeed returns the feed of distinct events, with repeats making
// up the share dup of all the messages.
func newMemoryFeed(prefix string, distinct int, dup float64) *memoryFeed {
	repeats := 0
	if dup > 0 && dup < 1 {
		repeats = int(float64(distinct)*dup/(1-dup) + 0.5)
	}
	return &memoryFeed{
		prefix: prefix, distinct: distinct, total: distinct + repeats, repeats: repeats,
		rng: rand.New(rand.NewPCG(uint64(distinct), 3)), recent: make([]Message, 0, memoryRecent),
	}
}

// next returns the message at position i of the backlog: a repeat with
// the chance of the repeats left over the positions left, once there is
// an event to repeat.
func (f *memoryFeed) next(i int) Message {
	if f.fresh > 0 && f.repeats > 0 && f.rng.IntN(f.total-i) < f.repeats {
		f.repeats--
		return f.recent[f.rng.IntN(len(f.recent))]
	}
	m := NewMessage(fmt.Sprintf("%s-%d", f.prefix, f.fresh))
	f.fresh++
	if len(f.recent) < memoryRecent {
		f.recent = append(f.recent, m)
	} else {
		f.recent[f.rng.IntN(memoryRecent)] = m
	}
	return m
}

// insert writes the whole backlog to the file of db, memoryRowsPerInsert
// rows a statement, memoryRowsPerTx rows a transaction.
func (f *memoryFeed) insert(ctx context.Context, db *sqlx.DB) error {
	for i := 0; i < f.total; {
		end := min(f.total, i+memoryRowsPerTx)
		err := inTx(ctx, db, func(tx *sqlx.Tx) error {
			for i < end {
				n := min(memoryRowsPerInsert, end-i)
				args := make([]any, 0, 2*n)
				for j := range n {
					m := f.next(i + j)
					args = append(args, m.ID, string(m.Body))
				}
				if _, err := tx.ExecContext(ctx, multiRowInsert(n), args...); err != nil {
					return fmt.Errorf("insert messages %d to %d: %w", i, i+n, err)
				}
				i += n
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if f.fresh != f.distinct || f.repeats != 0 {
		return fmt.Errorf("fed %d events and left %d repeats, want %d and none", f.fresh, f.repeats, f.distinct)
	}
	return nil
}

// multiRowInsert is the documented INSERT into pubsub_messages (see
// sqliteMessagesInsert) with n rows of values.
func multiRowInsert(n int) string {
	head, row, ok := strings.Cut(sqliteMessagesInsert, " VALUES ")
	if !ok {
		panic("sqliteMessagesInsert has no VALUES")
	}
	return head + " VALUES " + strings.Repeat(row+", ", n-1) + row
}

// sampleDrain waits until want effects are in the service's reminders,
// failing when the process exits or no effect comes for
// Options.StallTimeout, and samples the process's memory each tenth of
// the way and at the end.
func sampleDrain(ctx context.Context, env *Env, p *Process, effects *EffectTable, want int) ([]MemorySample, error) {
	var samples []MemorySample
	next := 1 // the tenth the next sample waits for
	last, lastAt := -1, time.Now()
	for {
		n, err := effects.Progress(ctx)
		if err != nil {
			return nil, fmt.Errorf("progress: %w", err)
		}
		if next <= memorySamples && n >= want*next/memorySamples {
			s, err := sampleMemory(ctx, p, n)
			if err != nil {
				return nil, err
			}
			env.Logf("%d effects: RSS %s (anonymous %s), VmHWM %s, Go heap %s", n, mib(s.RSS), mib(s.Anon), mib(s.HWM), mib(s.Heap))
			samples = append(samples, s)
			for next <= memorySamples && n >= want*next/memorySamples {
				next++
			}
		}
		if n >= want {
			return samples, nil
		}
		if n != last {
			last, lastAt = n, time.Now()
		}
		if time.Since(lastAt) > env.StallTimeout {
			return nil, fmt.Errorf("stalled at %d of %d effects for %s", n, want, env.StallTimeout)
		}
		if err := p.Exited(); err != nil {
			return nil, err
		}
		if err := sleep(ctx, memoryPoll); err != nil {
			return nil, err
		}
	}
}

// sampleMemory reads the process's memory, after effects effects.
func sampleMemory(ctx context.Context, p *Process, effects int) (MemorySample, error) {
	s := MemorySample{Effects: effects}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return s, fmt.Errorf("memory: %w", err)
	}
	if s.RSS, err = statusKB(string(b), "VmRSS"); err != nil {
		return s, err
	}
	if s.HWM, err = statusKB(string(b), "VmHWM"); err != nil {
		return s, err
	}
	if s.Anon, err = statusKB(string(b), "RssAnon"); err != nil {
		return s, err
	}
	heap, err := p.Metric(ctx, "go_memstats_heap_inuse_bytes")
	if err != nil {
		return s, err
	}
	s.Heap = int64(heap)
	return s, nil
}

// statusKB returns the field key of a /proc/PID/status text, in bytes.
func statusKB(status, key string) (int64, error) {
	for line := range strings.Lines(status) {
		rest, ok := strings.CutPrefix(line, key+":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("memory: %s: %w", key, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("memory: no %s in /proc/PID/status", key)
}

// Metric returns the value of the process's unlabelled sample name on
// its /metrics.
func (p *Process) Metric(ctx context.Context, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+"/metrics", nil)
	if err != nil {
		return 0, fmt.Errorf("%s: metrics request: %w", p.name, err)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s: get /metrics: %w", p.name, err)
	}
	defer resp.Body.Close()
	v, err := metricValue(resp.Body, name)
	_, _ = io.Copy(io.Discard, resp.Body)
	if err != nil {
		return 0, fmt.Errorf("%s: /metrics: %w", p.name, err)
	}
	return v, nil
}

// effectSpan returns the number of the SQLite table's effects and the
// time from the first to the last, in one query (Read would load them
// all).
func effectSpan(ctx context.Context, t *EffectTable) (int, time.Duration, error) {
	var (
		n            int
		first, final int64
	)
	q := fmt.Sprintf(`SELECT count(*), COALESCE(min(handled_at), 0), COALESCE(max(handled_at), 0) FROM %s WHERE %s LIKE ?`, t.Table, t.EventColumn)
	if err := t.DB.QueryRowContext(ctx, q, t.Prefix+"-%").Scan(&n, &first, &final); err != nil {
		return 0, 0, fmt.Errorf("span of the effects in %s: %w", t.Table, err)
	}
	return n, time.Duration(final-first) * time.Millisecond, nil
}

// writeMemory writes the memory samples of run as a table of their own,
// with the growth from the first to the last; nothing without samples.
func writeMemory(b *strings.Builder, run RunReport) {
	m := run.Result.Memory
	first, last, ok := m.ends()
	if !ok {
		return
	}
	fmt.Fprintf(b, "Memory along the drain of **%s**:\n\n", run.Name)
	fmt.Fprintf(b, "| effects | RSS (VmRSS) | anonymous (RssAnon) | peak RSS (VmHWM) | Go heap in use |\n|---:|---:|---:|---:|---:|\n")
	for _, s := range m.Samples {
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", thousands(float64(s.Effects)), mib(s.RSS), mib(s.Anon), mib(s.HWM), mib(s.Heap))
	}
	growth := func(a, z int64) string {
		if a == 0 {
			return "—"
		}
		return fmt.Sprintf("%+.1f%%", (float64(z)/float64(a)-1)*100)
	}
	fmt.Fprintf(b, "| growth, %s to %s | %s (bound +%.0f%%) | %s | %s | %s |\n\n",
		thousands(float64(first.Effects)), thousands(float64(last.Effects)),
		growth(first.RSS, last.RSS), MaxRSSGrowth*100, growth(first.Anon, last.Anon), growth(first.HWM, last.HWM), growth(first.Heap, last.Heap))
}
