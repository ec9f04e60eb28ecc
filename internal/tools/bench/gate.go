package bench

import (
	"errors"
	"fmt"
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
		if g.Of != "" && run.Name == g.Of || g.Of == "" && (ref == nil || run.Result.EffectsPerSecond() > ref.Result.EffectsPerSecond()) {
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
	case g.Floor > 0:
		line = fmt.Sprintf("Gate: %s at least %s effects/s: %s", g.Run, thousands(g.Floor), thousands(eps))
		met = eps >= g.Floor
		miss = fmt.Errorf("gate not met: %s at %s effects/s, want at least %s", g.Run, thousands(eps), thousands(g.Floor))
	case ref == nil || ref.Result.EffectsPerSecond() <= 0:
		return "", nil
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
