package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
)

// SweepScale is the share of Options.Events each configuration of a
// pre-sweep drains (5,000 messages at the default): long enough to rank
// configurations whose rates differ by tens of percent, short enough
// that a sweep of nine costs under a minute (see preSweep).
const SweepScale = 0.25

// A Sweep is the pre-sweep of a hand-written baseline: the
// configurations a competent team would try, each drained once at
// SweepScale of the run's size, and the best of them, which the run
// that carries the sweep then measures in full rounds beside the others.
type Sweep struct {
	// Events is how many messages each configuration drained.
	Events int
	// Points are the configurations tried, in order.
	Points []SweepPoint
	// Best is the index in Points of the configuration with the most
	// effects per second; -1 when every one failed.
	Best int
}

// A SweepPoint is one configuration of a pre-sweep and how it drained.
type SweepPoint struct {
	// Config says what was set, e.g. "16 subscriptions, prefetch 1, pool 16".
	Config string
	// Result holds the drain's figures (no latency phase, no profile).
	Result Result
	// Err is why the configuration failed; its figures then say nothing.
	Err error
}

// BestConfig is the best configuration's description; empty when none
// drained.
func (s *Sweep) BestConfig() string {
	if s == nil || s.Best < 0 {
		return ""
	}
	return s.Points[s.Best].Config
}

// sweepConfig is a configuration a pre-sweep tries: its description and
// how to measure it.
type sweepConfig[C any] struct {
	name   string
	config C
}

// sweeps remembers each pre-sweep of an Execute by key, so that a run
// measured in several rounds sweeps once, in its first.
type sweeps struct {
	mu   sync.Mutex
	done map[string]any
}

// measureBest sweeps the configurations of the hand-written consumer
// name once (preSweep), then drains the best one with measure, the sweep
// in its result.
func measureBest[C any](ctx context.Context, env *Env, name string, configs []sweepConfig[C],
	measure func(ctx context.Context, env *Env, c C) (Result, error),
) (Result, error) {
	sweep, best, err := preSweep(ctx, env, env.Scenario+"/"+name, configs, measure)
	if err != nil {
		return Result{}, err
	}
	res, err := measure(ctx, env, best)
	return withSweep(res, sweep), err
}

// preSweep drains each of configs once, at SweepScale of the run's
// events, with measure, and returns the sweep and the best
// configuration; the first call of an Execute with key sweeps, the
// others return what it found. Each configuration runs in an Env of its
// own (a folder, an id, its cleanups after it) as a smoke run does: no
// latency phase, no profile. A smoke run tries the last configuration
// only (those of the grids here differ in their settings, not in their
// code), at the run's size.
func preSweep[C any](ctx context.Context, env *Env, key string, configs []sweepConfig[C],
	measure func(ctx context.Context, env *Env, c C) (Result, error),
) (*Sweep, C, error) {
	sh := env.shared
	sh.sweeps.mu.Lock()
	defer sh.sweeps.mu.Unlock()
	type found struct {
		sweep *Sweep
		best  C
	}
	if f, ok := sh.sweeps.done[key].(found); ok {
		return f.sweep, f.best, nil
	}
	if env.Smoke && len(configs) > 1 {
		configs = configs[len(configs)-1:]
	}
	events := env.Events
	if !env.Smoke {
		events = scaledEvents(env.Events, SweepScale)
	}
	sweep := &Sweep{Events: events, Best: -1}
	var errs []error
	for _, c := range configs {
		env.Logf("pre-sweep: %s", c.name)
		res, err := measureSweepPoint(ctx, env, events, func(ctx context.Context, sub *Env) (Result, error) {
			return measure(ctx, sub, c.config)
		})
		if err != nil {
			env.Logf("pre-sweep: %s FAILED: %v", c.name, err)
			errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
		} else {
			env.Logf("pre-sweep: %s at %.0f/s", c.name, res.EffectsPerSecond())
		}
		sweep.Points = append(sweep.Points, SweepPoint{Config: c.name, Result: res, Err: err})
		if ctx.Err() != nil {
			return nil, *new(C), ctx.Err()
		}
	}
	for i, p := range sweep.Points {
		if p.Err == nil && (sweep.Best < 0 || p.Result.EffectsPerSecond() > sweep.Points[sweep.Best].Result.EffectsPerSecond()) {
			sweep.Best = i
		}
	}
	if sweep.Best < 0 {
		return nil, *new(C), fmt.Errorf("pre-sweep: every configuration failed: %w", errors.Join(errs...))
	}
	env.Logf("pre-sweep: the best is %s", sweep.BestConfig())
	best := configs[sweep.Best].config
	if sh.sweeps.done == nil {
		sh.sweeps.done = make(map[string]any)
	}
	sh.sweeps.done[key] = found{sweep: sweep, best: best}
	return sweep, best, nil
}

// measureSweepPoint runs measure in an Env of its own, events big, as a
// smoke run (no latency phase, no profile), cleans up after it and
// checks its effects.
func measureSweepPoint(ctx context.Context, env *Env, events int, measure func(context.Context, *Env) (Result, error)) (Result, error) {
	dir, err := mkdirTemp(env.Dir, "sweep-")
	if err != nil {
		return Result{}, err
	}
	opts := env.Options
	opts.Events = events
	opts.Smoke = true
	opts.Log = indented{env.Log}
	sub := &Env{Options: opts, Scenario: env.Scenario, Dir: dir, ID: env.Scenario + "-" + randomHex(4), shared: env.shared}
	res, err := measure(ctx, sub)
	if err = errors.Join(err, sub.cleanup()); err != nil {
		return res, err
	}
	return res, res.Check()
}

// indented writes to w with each line indented two more spaces.
type indented struct{ w io.Writer }

func (i indented) Write(b []byte) (int, error) {
	s := strings.ReplaceAll(string(b), "\n    ", "\n      ")
	if _, err := i.w.Write([]byte("  " + s)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// withSweep returns res carrying sweep, with a note naming the best
// configuration.
func withSweep(res Result, sweep *Sweep) Result {
	res.Sweep = sweep
	note := "the best configuration of the pre-sweep: " + sweep.BestConfig()
	if res.Note != "" {
		note = res.Note + "; " + note
	}
	res.Note = note
	return res
}

// writeSweeps writes the pre-sweep of each run that carries one, as a
// table: each configuration's effects/s, steady/s and start-up.
func writeSweeps(b *strings.Builder, s ScenarioReport) {
	for _, run := range s.Runs {
		sw := run.Result.Sweep
		if sw == nil {
			continue
		}
		fmt.Fprintf(b, "Pre-sweep of **%s**, %s messages a configuration, each drained once:\n\n", run.Name, thousands(float64(sw.Events)))
		fmt.Fprintf(b, "| configuration | effects/s | steady/s | start-up |\n|---|---:|---:|---:|\n")
		for i, p := range sw.Points {
			name := p.Config
			if i == sw.Best {
				name = "**" + name + "** (best)"
			}
			if p.Err != nil {
				fmt.Fprintf(b, "| %s | FAILED: %v | | |\n", name, p.Err)
				continue
			}
			c := []string{"—", "—", "—"}
			if eps := p.Result.EffectsPerSecond(); eps > 0 {
				c[0] = thousands(eps)
			}
			if p.Result.Steady > 0 {
				c[1] = thousands(p.Result.Steady)
			}
			if p.Result.StartUp > 0 {
				c[2] = seconds(p.Result.StartUp)
			}
			fmt.Fprintf(b, "| %s | %s |\n", name, strings.Join(c, " | "))
		}
		fmt.Fprintln(b)
	}
}
