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

// TestReportGateStartUpP50: a start-up gate fails at or above its bound,
// a p50 gate too; each shows its figure.
func TestReportGateStartUpP50(t *testing.T) {
	report := func(startUp, p50 time.Duration) *Report {
		return &Report{Scenarios: []ScenarioReport{{
			Title: "Idle",
			Gate:  &Gate{Run: "service", MaxStartUp: 2 * time.Second, And: &Gate{Run: "service", MaxP50: 20 * time.Millisecond}},
			Runs:  []RunReport{{Name: "service", Result: Result{StartUp: startUp, Latency: &Latency{P50: p50}}}},
		}}}
	}
	r := report(800*time.Millisecond, 5*time.Millisecond)
	if err := r.Err(); err != nil {
		t.Errorf("start-up 0.8 s, p50 5 ms: %v, want no error", err)
	}
	requireMarkdownLines(t, r,
		"Gate: service's start-up to first effect below 2.00 s: 0.80 s, met.",
		"Gate: service's p50 below 20.0 ms: 5.0 ms, met.")
	for _, c := range []struct {
		startUp, p50 time.Duration
		want         string
	}{
		{3 * time.Second, 5 * time.Millisecond, "start-up to first effect 3.00 s, want below 2.00 s"},
		{time.Second, 25 * time.Millisecond, "p50 25.0 ms, want below 20.0 ms"},
	} {
		if err := report(c.startUp, c.p50).Err(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("start-up %s, p50 %s: %v, want %q", c.startUp, c.p50, err, c.want)
		}
	}
}

// TestReportTimeGate: a full run longer than MaxRunTime fails; a
// selection of scenarios, whatever its time, does not.
func TestReportTimeGate(t *testing.T) {
	full := Options{Events: DefaultEvents, Rounds: DefaultRounds}
	if err := (&Report{Options: full, Elapsed: 24 * time.Minute}).Err(); err != nil {
		t.Errorf("24 minutes: %v, want no error", err)
	}
	err := (&Report{Options: full, Elapsed: 26 * time.Minute}).Err()
	if err == nil || !strings.Contains(err.Error(), "the whole run took 26m0s") {
		t.Errorf("26 minutes: %v, want the time gate not met", err)
	}
	some := full
	some.Events = 2000
	if err := (&Report{Options: some, Elapsed: time.Hour}).Err(); err != nil {
		t.Errorf("a smaller run of an hour: %v, want no error", err)
	}
}

// TestStartUpSteady: the start-up runs from the process's start to the
// first effect; the steady rate leaves out the first tenth of the
// effects.
func TestStartUpSteady(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var effects []Effect
	// 10 effects in the first second (the start), then 90 over 9 more.
	for i := range 10 {
		effects = append(effects, Effect{At: t0.Add(time.Second + time.Duration(i)*100*time.Millisecond)})
	}
	for i := range 90 {
		effects = append(effects, Effect{At: t0.Add(2*time.Second + time.Duration(i)*100*time.Millisecond)})
	}
	startUp, steady := startUpSteady(effects, t0)
	if startUp != time.Second {
		t.Errorf("start-up %s, want 1s", startUp)
	}
	// From effect 10 (at 2 s) to effect 99 (at 10.9 s): 89 in 8.9 s.
	if steady < 9.99 || steady > 10.01 {
		t.Errorf("steady %.2f/s, want 10/s", steady)
	}
}

// TestMedianFigures: a run of three rounds reports the round with the
// median effects per second, and its start-up and p50 each the median of
// the rounds'.
func TestMedianFigures(t *testing.T) {
	round := func(eps int, startUp, p50 time.Duration) RunReport {
		return RunReport{Result: Result{Drained: eps + 1, Elapsed: time.Second, StartUp: startUp, Latency: &Latency{P50: p50}}}
	}
	m := median([]RunReport{
		round(100, 3*time.Second, 9*time.Millisecond),
		round(300, 1*time.Second, 1*time.Millisecond),
		round(200, 5*time.Second, 2*time.Millisecond),
	})
	if eps := m.Result.EffectsPerSecond(); eps != 200 {
		t.Errorf("effects/s %.0f, want 200", eps)
	}
	if m.Result.StartUp != 3*time.Second || m.Result.Latency.P50 != 2*time.Millisecond {
		t.Errorf("start-up %s, p50 %s: want 3s and 2ms", m.Result.StartUp, m.Result.Latency.P50)
	}
}

// TestReportGateAmong: a gate among runs takes the best of them, not of
// the scenario's other runs.
func TestReportGateAmong(t *testing.T) {
	rate := func(name string, eps int) RunReport {
		return RunReport{Name: name, Result: Result{Drained: eps + 1, Elapsed: time.Second}}
	}
	r := &Report{Scenarios: []ScenarioReport{{
		Title: "AMQP",
		Gate:  &Gate{Run: "service", Among: []string{"best", "earlier"}, Min: 1.6},
		Runs:  []RunReport{rate("service", 1000), rate("earlier", 700), rate("best", 600), rate("limit", 5000)},
	}}}
	err := r.Err()
	if err == nil || !strings.Contains(err.Error(), "1.43 × earlier's effects/s") {
		t.Errorf("service 1,000 against earlier 700: %v, want the gate not met against earlier", err)
	}
	requireMarkdownLines(t, r, "Gate: service at least 1.60 × the best of best and earlier's effects/s (earlier): 1,000 / 700 = 1.43, NOT MET.")
}
