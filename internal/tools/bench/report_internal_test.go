package bench

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestReportGate: a scenario's gate fails the report when the gated run's
// effects per second are below its share of the best run's, shows in the
// report either way, and never fails a smoke run.
func TestReportGate(t *testing.T) {
	rate := func(name string, eps int) RunReport {
		return RunReport{Name: name, Result: Result{Drained: eps + 1, Elapsed: time.Second}}
	}
	report := func(def int, smoke bool) *Report {
		return &Report{Options: Options{Smoke: smoke}, Scenarios: []ScenarioReport{{
			Title: "Outside call",
			Gate:  &Gate{Run: "default", Min: 0.9},
			Runs:  []RunReport{rate("default", def), rate("batch_size 1", 2000), rate("baseline", 1000)},
		}}}
	}
	if err := report(1900, false).Err(); err != nil {
		t.Errorf("default at 0.95 of the best: %v, want no error", err)
	}
	requireMarkdownLines(t, report(1900, false),
		"Gate: default at least 0.90 of the best run's effects/s (batch_size 1): 1,900 / 2,000 = 0.95, met.")
	r := report(1000, false)
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "gate not met") {
		t.Errorf("default at 0.5 of the best: %v, want the gate not met", err)
	}
	requireMarkdownLines(t, r,
		"Gate: default at least 0.90 of the best run's effects/s (batch_size 1): 1,000 / 2,000 = 0.50, NOT MET.")
	var table strings.Builder
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "NOT MET") || !strings.Contains(table.String(), "FAILED") {
		t.Errorf("table of a gate not met:\n%s", table.String())
	}
	if err := report(1000, true).Err(); err != nil {
		t.Errorf("smoke run: %v, want no error", err)
	}
}

// TestMinRounds: a scenario with MinRounds measures its runs that many
// times when the bench measures in rounds, never in a single-round or
// smoke run, and the report says so; Once wins.
func TestMinRounds(t *testing.T) {
	hot := Scenario{Title: "Hot", MinRounds: 7}
	for _, c := range []struct {
		s      Scenario
		rounds int
		want   int
	}{
		{hot, 3, 7},
		{hot, 9, 9},
		{hot, 1, 1},
		{Scenario{MinRounds: 7, Once: true}, 3, 1},
		{Scenario{}, 3, 3},
	} {
		if got := roundsOf(c.s, Options{Rounds: c.rounds}); got != c.want {
			t.Errorf("roundsOf(%+v, %d rounds) = %d, want %d", c.s, c.rounds, got, c.want)
		}
	}
	r := &Report{Options: Options{Rounds: 3}, Scenarios: []ScenarioReport{
		{Title: "Hot", Rounds: 7}, {Title: "Cold", Rounds: 3}, {Title: "Memory", Rounds: 1, Once: true},
	}}
	var b strings.Builder
	if err := r.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	want := "- Rounds: each run measured 3 times, in rounds (every run of a scenario once a round, in the order listed, the other way round every other round), but those of Memory (once), and those of Hot (7 times), whose runs drain in under a second;"
	if !strings.Contains(b.String(), want) {
		t.Errorf("report:\n%s\nwant a line beginning %q", b.String(), want)
	}
}

// TestRoundOrder: a round measures its scenario's runs in the order
// listed, the next one the other way round, so that no run always
// follows the same one.
func TestRoundOrder(t *testing.T) {
	for _, c := range []struct {
		n, round int
		want     []int
	}{{3, 0, []int{0, 1, 2}}, {3, 1, []int{2, 1, 0}}, {3, 2, []int{0, 1, 2}}, {1, 1, []int{0}}} {
		if got := roundOrder(c.n, c.round); !slices.Equal(got, c.want) {
			t.Errorf("roundOrder(%d, %d) = %v, want %v", c.n, c.round, got, c.want)
		}
	}
}

// TestDocsHoldFindings: docs/benchmarks.md, written by a full run, holds
// findings.md as it is now, so that a finding edited by hand after the
// run is edited in both.
func TestDocsHoldFindings(t *testing.T) {
	docs, err := os.ReadFile("../../../docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(docs), findings) {
		t.Error("docs/benchmarks.md does not hold internal/tools/bench/findings.md as it is: edit both alike")
	}
}
