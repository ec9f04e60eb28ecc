package bench

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// gate returns the lines of the scenario's gates (Gate and those chained
// to it by And), and an error for each not met (see gateLine).
func (s ScenarioReport) gate(smoke bool) ([]string, error) {
	var lines []string
	var errs []error
	for g := s.Gate; g != nil; g = g.And {
		line, err := s.gateLine(g, smoke)
		if line != "" {
			lines = append(lines, line)
		}
		errs = append(errs, err)
	}
	return lines, errors.Join(errs...)
}

// gateLine returns the gate g as a line of text, and an error when it is
// not met: the gated run's effects per second below Floor, or below Min
// of Of's (of the best run's when Of is empty). It says nothing when the
// gated run (or Of) did not run (a selection of runs) or failed; a smoke
// run's gate is shown but never fails, as its figures say nothing about
// speed.
func (s ScenarioReport) gateLine(g *Gate, smoke bool) (string, error) {
	if s.Skipped != "" {
		return "", nil
	}
	var gated, ref *RunReport
	for i, run := range s.Runs {
		if run.Err != nil {
			continue
		}
		if run.Name == g.Run {
			gated = &s.Runs[i]
		}
		better := ref == nil || run.Result.EffectsPerSecond() > ref.Result.EffectsPerSecond()
		switch {
		case len(g.Among) > 0:
			if slices.Contains(g.Among, run.Name) && better {
				ref = &s.Runs[i]
			}
		case g.Of != "":
			if run.Name == g.Of {
				ref = &s.Runs[i]
			}
		case better:
			ref = &s.Runs[i]
		}
	}
	if gated == nil {
		return "", nil
	}
	eps := gated.Result.EffectsPerSecond()
	var line string
	var met bool
	var miss error
	switch {
	case g.MaxStartUp > 0:
		su := gated.Result.StartUp
		if su <= 0 {
			return "", nil
		}
		line = fmt.Sprintf("Gate: %s's start-up to first effect below %s: %s", g.Run, seconds(g.MaxStartUp), seconds(su))
		met = su < g.MaxStartUp
		miss = fmt.Errorf("gate not met: %s's start-up to first effect %s, want below %s", g.Run, seconds(su), seconds(g.MaxStartUp))
	case g.MaxP50 > 0:
		if gated.Result.Latency == nil {
			return "", nil
		}
		p50 := gated.Result.Latency.P50
		line = fmt.Sprintf("Gate: %s's p50 below %s: %s", g.Run, ms(g.MaxP50), ms(p50))
		met = p50 < g.MaxP50
		miss = fmt.Errorf("gate not met: %s's p50 %s, want below %s", g.Run, ms(p50), ms(g.MaxP50))
	case g.Floor > 0:
		line = fmt.Sprintf("Gate: %s at least %s effects/s: %s", g.Run, thousands(g.Floor), thousands(eps))
		met = eps >= g.Floor
		miss = fmt.Errorf("gate not met: %s at %s effects/s, want at least %s", g.Run, thousands(eps), thousands(g.Floor))
	case ref == nil || ref.Result.EffectsPerSecond() <= 0:
		return "", nil
	case len(g.Among) > 0:
		share := eps / ref.Result.EffectsPerSecond()
		line = fmt.Sprintf("Gate: %s at least %.2f × the best of %s's effects/s (%s): %s / %s = %.2f",
			g.Run, g.Min, strings.Join(g.Among, " and "), ref.Name, thousands(eps), thousands(ref.Result.EffectsPerSecond()), share)
		met = share >= g.Min
		miss = fmt.Errorf("gate not met: %s at %.2f × %s's effects/s (the best of %s), want at least %.2f",
			g.Run, share, ref.Name, strings.Join(g.Among, " and "), g.Min)
	case g.Of != "":
		share := eps / ref.Result.EffectsPerSecond()
		line = fmt.Sprintf("Gate: %s at least %.2f × %s's effects/s: %s / %s = %.2f",
			g.Run, g.Min, g.Of, thousands(eps), thousands(ref.Result.EffectsPerSecond()), share)
		met = share >= g.Min
		miss = fmt.Errorf("gate not met: %s at %.2f × %s's effects/s, want at least %.2f", g.Run, share, g.Of, g.Min)
	default:
		share := eps / ref.Result.EffectsPerSecond()
		line = fmt.Sprintf("Gate: %s at least %.2f of the best run's effects/s (%s): %s / %s = %.2f",
			g.Run, g.Min, ref.Name, thousands(eps), thousands(ref.Result.EffectsPerSecond()), share)
		met = share >= g.Min
		miss = fmt.Errorf("gate not met: %s at %.2f of %s's effects/s, want at least %.2f", g.Run, share, ref.Name, g.Min)
	}
	switch {
	case smoke:
		return line + ", not checked (smoke run)", nil
	case !met:
		return line + ", NOT MET", miss
	default:
		return line + ", met", nil
	}
}

// The gates of issue 47 on the figures of the scenarios: each scenario
// names its own in its Gate.
const (
	// AMQPGainGate is how many times the best hand-written watermill-amqp
	// consumer's effects/s the default configuration must reach.
	AMQPGainGate = 1.6
	// AMQPLimitGate is the share of the hand-optimized consumer's
	// effects/s the default configuration must reach.
	AMQPLimitGate = 0.7
	// PostgresGainGate is how many times the best hand-written
	// watermill-sql consumer's effects/s the PostgreSQL transport's
	// default configuration must reach.
	PostgresGainGate = 3.0
	// SQLiteLimitGate is the share of the sqlite3 program's effects/s the
	// SQLite transport's default configuration must reach.
	SQLiteLimitGate = 0.35
	// RelayLimitGate is the share of the broker's confirming-publisher
	// limit the outbox relay must reach.
	RelayLimitGate = 0.85
	// StartUpGate bounds the time from a service's process start to its
	// first effect, on every transport.
	StartUpGate = 2 * time.Second
	// IdleP50Gate bounds the idle-to-handled p50, on every transport.
	IdleP50Gate = 20 * time.Millisecond
)

// MaxRunTime is how long a full make bench (every scenario at the
// default size and rounds) may take: longer fails it (Report.GatesErr).
const MaxRunTime = 25 * time.Minute

// full reports whether r is a full make bench, whose time MaxRunTime
// bounds: every scenario and run, at least the default size and rounds.
func (r *Report) full() bool {
	o := r.Options
	return !o.Smoke && o.Run == nil && o.RunNames == nil && o.Events >= DefaultEvents && o.Rounds >= DefaultRounds
}

// timeGate returns the line of the whole run's time gate, and an error
// when a full run took longer than MaxRunTime; nothing when r is no full
// run or has no time.
func (r *Report) timeGate() (string, error) {
	if !r.full() || r.Elapsed <= 0 {
		return "", nil
	}
	line := fmt.Sprintf("Gate: the whole run within %s: %s", MaxRunTime, r.Elapsed.Round(time.Second))
	if r.Elapsed > MaxRunTime {
		return line + ", NOT MET", fmt.Errorf("gate not met: the whole run took %s, want at most %s", r.Elapsed.Round(time.Second), MaxRunTime)
	}
	return line + ", met", nil
}
