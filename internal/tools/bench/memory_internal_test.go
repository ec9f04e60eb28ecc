package bench

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/framework/sqlite"
)

// TestMemoryFeed: the memory scenario's feeder inserts, in multi-row
// statements, every distinct event once and the repeats, each byte for
// byte the message of an earlier event, so that the backlog holds the
// share of repeats asked for.
func TestMemoryFeed(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "feed.db"), sqlite.OpenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := sqlite.InitializePubSubSchema(ctx, db, ""); err != nil {
		t.Fatal(err)
	}
	const distinct = 2000 // 5 statements and a short one
	f := newMemoryFeed("t", distinct, 0.02)
	if f.total != 2041 {
		t.Fatalf("total = %d, want 2041 (2000 events, 41 repeats: 2%% of the messages)", f.total)
	}
	if err := f.insert(ctx, db); err != nil {
		t.Fatal(err)
	}
	var rows, ids, messages int
	if err := db.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT uuid), count(DISTINCT uuid || payload) FROM pubsub_messages WHERE topic = ?`, EventType).
		Scan(&rows, &ids, &messages); err != nil {
		t.Fatal(err)
	}
	if rows != f.total || ids != distinct || messages != distinct {
		t.Fatalf("got %d rows of %d ids and %d distinct messages, want %d of %d and %d (repeats byte for byte)", rows, ids, messages, f.total, distinct, distinct)
	}
}

// TestMemoryCheck: the memory check fails when the resident set grew more
// than the bound from the first sample to the last, and says by how much.
func TestMemoryCheck(t *testing.T) {
	mem := func(first, last int64) *Memory {
		return &Memory{Samples: []MemorySample{{Effects: 100000, RSS: first}, {Effects: 550000, RSS: first * 2}, {Effects: 1000000, RSS: last}}}
	}
	if err := mem(100<<20, 110<<20).Check(0.10); err != nil {
		t.Errorf("10%% growth: %v, want none", err)
	}
	err := mem(100<<20, 111<<20).Check(0.10)
	if err == nil || !strings.Contains(err.Error(), "grew 11.0%") {
		t.Errorf("11%% growth: %v, want an error saying it grew 11.0%%", err)
	}
	if err := (&Memory{Samples: []MemorySample{{RSS: 1}}}).Check(0.10); err == nil {
		t.Error("one sample: no error")
	}
}

// TestWriteMarkdownMemory: the report shows a run's memory samples in a
// table of their own, with the growth from the first to the last.
func TestWriteMarkdownMemory(t *testing.T) {
	r := &Report{Scenarios: []ScenarioReport{{Title: "Memory", Runs: []RunReport{{Name: "service", Result: Result{
		Memory: &Memory{Samples: []MemorySample{
			{Effects: 100000, RSS: 40 << 20, Anon: 16 << 20, HWM: 41 << 20, Heap: 6 << 20},
			{Effects: 1000000, RSS: 42 << 20, Anon: 18 << 20, HWM: 44 << 20, Heap: 6 << 20},
		}},
	}}}}}}
	requireMarkdownLines(t, r,
		"| 100,000 | 40.0 MiB | 16.0 MiB | 41.0 MiB | 6.0 MiB |",
		"| 1,000,000 | 42.0 MiB | 18.0 MiB | 44.0 MiB | 6.0 MiB |",
		"| growth, 100,000 to 1,000,000 | +5.0% (bound +10%) | +12.5% | +7.3% | +0.0% |",
	)
}

// TestCheckScenarios: a scenario may have no baseline (no run has a
// ratio), not two.
func TestCheckScenarios(t *testing.T) {
	run := func(baseline bool) Run {
		return Run{Name: "r", Baseline: baseline, Measure: func(context.Context, *Env) (Result, error) { return Result{}, nil }}
	}
	if err := checkScenarios([]Scenario{{Name: "none", Runs: []Run{run(false)}}}); err != nil {
		t.Errorf("no baseline: %v, want none", err)
	}
	if err := checkScenarios([]Scenario{{Name: "two", Runs: []Run{run(true), run(true)}}}); err == nil {
		t.Error("two baselines: no error")
	}
}
