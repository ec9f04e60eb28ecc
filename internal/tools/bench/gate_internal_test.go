package bench

import (
	"strings"
	"testing"
	"time"
)

// TestReportGateFloorOf: a gate with a floor fails below it whatever the
// other runs did, a gate of another run (Of) fails below Min times that
// run's, and both gates of a chain (And) show and count.
func TestReportGateFloorOf(t *testing.T) {
	rate := func(name string, eps int) RunReport {
		return RunReport{Name: name, Result: Result{Drained: eps + 1, Elapsed: time.Second}}
	}
	report := func(one, four int) *Report {
		return &Report{Scenarios: []ScenarioReport{{
			Title: "Scale-out",
			Gate:  &Gate{Run: "1 process", Floor: 256, And: &Gate{Run: "4 processes", Of: "1 process", Min: 3}},
			Runs:  []RunReport{rate("1 process", one), rate("2 processes", 2*one), rate("4 processes", four)},
		}}}
	}
	r := report(300, 1000)
	if err := r.Err(); err != nil {
		t.Errorf("1 process at 300, 4 at 1000: %v, want no error", err)
	}
	requireMarkdownLines(t, r,
		"Gate: 1 process at least 256 effects/s: 300, met.",
		"Gate: 4 processes at least 3.00 × 1 process's effects/s: 1,000 / 300 = 3.33, met.")
	for _, c := range []struct {
		one, four int
		want      string
	}{
		{200, 1000, "1 process at 200 effects/s, want at least 256"},
		{300, 600, "4 processes at 2.00 × 1 process's effects/s, want at least 3.00"},
	} {
		err := report(c.one, c.four).Err()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("1 process at %d, 4 at %d: %v, want %q", c.one, c.four, err, c.want)
		}
	}
	requireMarkdownLines(t, report(200, 1000), "Gate: 1 process at least 256 effects/s: 200, NOT MET.")
}
