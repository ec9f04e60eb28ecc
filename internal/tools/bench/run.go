package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Execute runs the scenarios (those Options.Run matches) one after the other,
// each run of a scenario once a round (see roundOrder), Options.Rounds
// rounds (but a scenario measured Once), and returns the report, with the
// round of each run that had the median effects per second. A run whose
// consumer leaves other than one effect per distinct event fails; it
// returns the report with every failure (Report.Err) and goes on with the
// next run. A scenario whose servers are missing is skipped, and the
// report says why.
//
// Outside a smoke run, this process runs its goroutines on one thread
// (GOMAXPROCS 1) until Execute returns: it shares the machine's cores
// with what it measures, and on two its sink's handoffs from goroutine to
// goroutine woke a thread for nearly every message (the outbox sink's 20
// to 26 µs a message of CPU, against 14 to 15 on one), taking cores from
// the broker and the relay it times.
func Execute(ctx context.Context, scenarios []Scenario, opts Options) (*Report, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if !opts.Smoke {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	}
	if err := checkScenarios(scenarios); err != nil {
		return nil, err
	}
	dir, err := mkdirTemp("", "effectively-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	sh := &shared{dir: dir}

	report := &Report{Date: time.Now(), Options: opts, Machine: ReadMachine(ctx, opts)}
	defer func() { report.Elapsed = time.Since(report.Date) }()
	for _, s := range scenarios {
		began := time.Now()
		if opts.Run != nil && !opts.Run.MatchString(s.Name) {
			continue
		}
		sr := ScenarioReport{Name: s.Name, Title: s.Title, About: s.About, Once: s.Once, Scale: s.Scale, Gate: s.Gate, Rounds: roundsOf(s, opts)}
		if missing := missingNeeds(s, opts); missing != "" {
			sr.Skipped = "needs " + missing
			fmt.Fprintf(opts.Log, "== %s: skipped, %s\n", s.Title, sr.Skipped)
			report.Scenarios = append(report.Scenarios, sr)
			continue
		}
		fmt.Fprintf(opts.Log, "== %s\n", s.Title)
		rounds := sr.Rounds
		s.Runs = slices.DeleteFunc(slices.Clone(s.Runs), func(r Run) bool {
			return opts.RunNames != nil && !opts.RunNames.MatchString(r.Name) || opts.Smoke && r.NoSmoke
		})
		measured := make([][]RunReport, len(s.Runs))
		for round := range rounds {
			for _, i := range roundOrder(len(s.Runs), round) {
				r := s.Runs[i]
				if rounds > 1 {
					fmt.Fprintf(opts.Log, "  -- %s (round %d of %d)\n", r.Name, round+1, rounds)
				} else {
					fmt.Fprintf(opts.Log, "  -- %s\n", r.Name)
				}
				rr := runOne(ctx, s, r, opts, sh)
				if rr.Err != nil {
					fmt.Fprintf(opts.Log, "     FAILED: %v\n", rr.Err)
				}
				measured[i] = append(measured[i], rr)
			}
		}
		for _, rrs := range measured {
			sr.Runs = append(sr.Runs, median(rrs))
		}
		sr.Elapsed = time.Since(began)
		fmt.Fprintf(opts.Log, "   %s in %s\n", s.Title, sr.Elapsed.Round(time.Second))
		report.Scenarios = append(report.Scenarios, sr)
	}
	return report, nil
}

// median returns the round of a run with the median effects per second
// (the lower of the two middle ones of an even count), with the effects
// per second of every round; the first failed round when one failed.
func median(rounds []RunReport) RunReport {
	eps := make([]float64, len(rounds))
	for i, rr := range rounds {
		if rr.Err != nil {
			return rr
		}
		eps[i] = rr.Result.EffectsPerSecond()
	}
	byRate := slices.Clone(rounds)
	slices.SortStableFunc(byRate, func(a, b RunReport) int {
		return cmp.Compare(a.Result.EffectsPerSecond(), b.Result.EffectsPerSecond())
	})
	m := byRate[(len(byRate)-1)/2]
	if len(rounds) > 1 {
		m.Rounds = eps
		m.Result = medianFigures(m.Result, rounds)
	}
	return m
}

// medianFigures returns res with the figures that the gates judge apart
// from effects per second (the start-up, the steady-state rate, the
// latency's p50 and p99) each the median of the rounds' own, those
// measured: each figure is the median of its rounds, whichever round
// its run's row comes from.
func medianFigures(res Result, rounds []RunReport) Result {
	var startUps, p50s, p99s []time.Duration
	var steady []float64
	for _, rr := range rounds {
		r := rr.Result
		if r.StartUp > 0 {
			startUps = append(startUps, r.StartUp)
		}
		if r.Steady > 0 {
			steady = append(steady, r.Steady)
		}
		if r.Latency != nil {
			p50s = append(p50s, r.Latency.P50)
			p99s = append(p99s, r.Latency.P99)
		}
	}
	if len(startUps) > 0 {
		res.StartUp = middle(startUps)
	}
	if len(steady) > 0 {
		res.Steady = middle(steady)
	}
	if res.Latency != nil && len(p50s) > 0 {
		lat := *res.Latency
		lat.P50, lat.P99 = middle(p50s), middle(p99s)
		res.Latency = &lat
	}
	return res
}

// middle returns the median of vs (the lower of the two middle ones of
// an even count).
func middle[T cmp.Ordered](vs []T) T {
	s := slices.Clone(vs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// runOne measures one run in a folder of its own, cleans up after it and
// checks its effects.
func runOne(ctx context.Context, s Scenario, r Run, opts Options, sh *shared) RunReport {
	rr := RunReport{Name: r.Name, Baseline: r.Baseline}
	dir, err := mkdirTemp(sh.dir, "run-")
	if err != nil {
		rr.Err = err
		return rr
	}
	if !opts.Smoke {
		opts.Events = scaledEvents(scaledEvents(opts.Events, s.Scale), r.Scale)
	}
	env := &Env{Options: opts, Scenario: s.Name, Dir: dir, ID: s.Name + "-" + randomHex(4), shared: sh}
	res, err := r.Measure(ctx, env)
	if r.Scale > 0 && !opts.Smoke {
		note := fmt.Sprintf("drained %s messages, %.0f%% of the scenario's", thousands(float64(opts.Events)), r.Scale*100)
		res.Note = strings.TrimPrefix(res.Note+"; "+note, "; ")
	}
	err = errors.Join(err, env.cleanup(), keepProfiles(opts.Profiles, dir, s.Name+"-"+r.Name))
	switch {
	case err != nil:
		rr.Err = err
	default:
		rr.Err = res.Check()
	}
	rr.Result = res
	return rr
}

func checkScenarios(scenarios []Scenario) error {
	names := make(map[string]bool)
	for _, s := range scenarios {
		if s.Name == "" || names[s.Name] {
			return fmt.Errorf("bench: scenario name %q is empty or repeated", s.Name)
		}
		names[s.Name] = true
		baselines := 0
		for _, r := range s.Runs {
			if r.Baseline {
				baselines++
			}
			if r.Measure == nil {
				return fmt.Errorf("bench: scenario %s: run %q has no Measure", s.Name, r.Name)
			}
		}
		if baselines > 1 {
			return fmt.Errorf("bench: scenario %s has %d baselines, want at most 1", s.Name, baselines)
		}
	}
	return nil
}

func missingNeeds(s Scenario, opts Options) string {
	for _, n := range s.Needs {
		switch {
		case n == NeedPostgres && opts.PostgresURL == "":
			return string(n)
		case n == NeedAMQP && opts.AMQPURL == "":
			return string(n)
		}
	}
	return ""
}

// keepProfiles copies the CPU profiles in a run's folder dir to the folder
// profiles, named after the run; it does nothing when profiles is empty.
func keepProfiles(profiles, dir, run string) error {
	if profiles == "" {
		return nil
	}
	if err := os.MkdirAll(profiles, 0o755); err != nil {
		return fmt.Errorf("keep profile: %w", err)
	}
	paths, err := filepath.Glob(filepath.Join(dir, "*.pprof"))
	if err != nil {
		return err
	}
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '_'
	}, strings.ToLower(run))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("keep profile: %w", err)
		}
		if err := os.WriteFile(filepath.Join(profiles, name+"-"+filepath.Base(p)), b, 0o644); err != nil {
			return fmt.Errorf("keep profile: %w", err)
		}
	}
	return nil
}

// scaledEvents is how many messages a run of a scenario of the given
// Scale drains when Options.Events says events: never fewer than 100.
func scaledEvents(events int, scale float64) int {
	if scale <= 0 || scale == 1 {
		return events
	}
	return max(int(float64(events)*scale), 100)
}

// roundsOf is how many times each run of s is measured under opts (see
// Scenario.Once and Scenario.MinRounds).
func roundsOf(s Scenario, opts Options) int {
	switch {
	case s.Once:
		return 1
	case opts.Rounds > 1:
		return max(opts.Rounds, s.MinRounds)
	default:
		return opts.Rounds
	}
}

// roundOrder is the order in which a round measures a scenario's n runs:
// as listed in even rounds, the other way round in odd ones, so that
// no run always follows the same one (what a run leaves the servers to
// do, and a drift of the machine's pace over the rounds, fall on each
// run alike).
func roundOrder(n, round int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
		if round%2 == 1 {
			order[i] = n - 1 - i
		}
	}
	return order
}
