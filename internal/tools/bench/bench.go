package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"time"
)

// Defaults of Options.
const (
	// DefaultEvents is how many messages each run drains: enough for
	// steady figures, small enough for a 2-core machine in a few minutes.
	DefaultEvents = 20000
	// DefaultDuplicates is the share of the messages that repeat an
	// earlier event (same source and id).
	DefaultDuplicates = 0.02
	// DefaultLatencyDuration is how long the paced producer of the
	// latency phase runs: at half drain rates of thousands a second,
	// thousands of events. It was 5 s, which took some four of make
	// bench's minutes over its 80-odd runs, where the run must fit in
	// MaxRunTime.
	DefaultLatencyDuration = 2 * time.Second
	// DefaultStallTimeout is how long a run may go without a new effect
	// before it fails.
	DefaultStallTimeout = time.Minute
	// DefaultRounds is how many times each run is measured.
	DefaultRounds = 3
)

// Options say how big the runs are and what they measure.
type Options struct {
	// Events is how many messages each run drains, duplicates included.
	// Defaults to DefaultEvents.
	Events int
	// Duplicates is the share of Events that repeat an earlier event.
	// Defaults to DefaultDuplicates; negative means none.
	Duplicates float64
	// LatencyDuration is how long the paced producer of the latency phase
	// runs, at half the rate the run drained at. Defaults to
	// DefaultLatencyDuration.
	LatencyDuration time.Duration
	// Rounds is how many times each run of a scenario is measured, in
	// rounds (each run once per round, in order, so that a slow spell of
	// the machine falls on all of them alike); the report shows the round
	// of each run with the median effects per second. Defaults to
	// DefaultRounds; a smoke run measures once.
	Rounds int
	// StallTimeout fails a run that goes that long without a new effect.
	// Defaults to DefaultStallTimeout.
	StallTimeout time.Duration
	// Smoke checks the effects and skips the figures that need time: no
	// latency phase, no CPU profiles. The report of a smoke run says
	// nothing about speed.
	Smoke bool
	// Profiles, when set, is a folder that keeps each run's CPU profiles
	// (scenario-run-process.pprof) for go tool pprof; otherwise they are
	// removed with the run's folder.
	Profiles string
	// Run selects the scenarios whose name matches; nil runs all.
	Run *regexp.Regexp
	// RunNames selects, within those scenarios, the runs whose name
	// matches; nil runs all. A report of a selection shows only its runs.
	RunNames *regexp.Regexp
	// PostgresURL is the PostgreSQL server the runs create their
	// schemas on (EFFECTIVELY_TEST_POSTGRES_URL).
	PostgresURL string
	// AMQPURL is the RabbitMQ broker (EFFECTIVELY_TEST_AMQP_URL).
	AMQPURL string
	// Self is the command line that starts this program again as a
	// child (see Child): os.Args[0] alone for a command, the test binary
	// for a test. Defaults to the running executable.
	Self []string
	// ServiceBinary is the example service's binary (BuildService), built
	// beforehand: TestSmoke, which calls Execute once a scenario, builds
	// it once for all (a build with -race takes seconds, mostly its
	// link). Defaults to one that Execute builds on first use.
	ServiceBinary string
	// Log receives progress lines. Defaults to discarding them.
	Log io.Writer
}

// WithDefaults returns a copy of o with zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.Events == 0 {
		o.Events = DefaultEvents
	}
	if o.Duplicates == 0 {
		o.Duplicates = DefaultDuplicates
	}
	if o.Duplicates < 0 {
		o.Duplicates = 0
	}
	if o.LatencyDuration == 0 {
		o.LatencyDuration = DefaultLatencyDuration
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = DefaultStallTimeout
	}
	if o.Rounds == 0 {
		o.Rounds = DefaultRounds
	}
	if o.Smoke {
		o.Rounds = 1
	}
	if len(o.Self) == 0 {
		if exe, err := os.Executable(); err == nil {
			o.Self = []string{exe}
		}
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return o
}

// Validate says what is wrong with o, naming the field.
func (o Options) Validate() error {
	switch {
	case o.Events < 2:
		return fmt.Errorf("bench: Events must be at least 2, got %d", o.Events)
	case o.Rounds < 1:
		return fmt.Errorf("bench: Rounds must be at least 1, got %d", o.Rounds)
	case o.Duplicates >= 1:
		return fmt.Errorf("bench: Duplicates must be below 1, got %g", o.Duplicates)
	case len(o.Self) == 0:
		return errors.New("bench: Self is empty and the executable is unknown (set it to the command that runs this program)")
	}
	return nil
}

// A Scenario is one comparison: runs of the framework and the baseline
// they are measured against, run one after the other in one process, so
// that they share the machine's state.
type Scenario struct {
	// Name is short and unique (amqp, postgres, sqlite): Options.Run
	// matches it, and children are named after it.
	Name string
	// Title heads the scenario in the table and in docs/benchmarks.md.
	Title string
	// About is a paragraph for docs/benchmarks.md: what runs, on what,
	// fed how.
	About string
	// Needs names the servers the scenario needs (NeedPostgres,
	// NeedAMQP); without them it is skipped and the report says why.
	Needs []Need
	// Runs are measured in order. At most one is the baseline; without
	// one, no run has a ratio.
	Runs []Run
	// Children are the programs the runs start as child processes of
	// their own (see Child), by name.
	Children []Child
	// Once measures each run once whatever Options.Rounds says: for a
	// long scenario with no baseline.
	Once bool
	// MinRounds, when above Options.Rounds (and Options.Rounds above
	// one), is how many times each run is measured: for a scenario whose
	// runs drain in under a second, where one round's figure moves with
	// the moment more than with the consumer, and more rounds cost
	// seconds.
	MinRounds int
	// Scale is how many times Options.Events messages each run drains (but
	// in a smoke run); zero means once. Above one it is for a scenario
	// whose runs drain Options.Events in about a second, too short a time
	// to leave the start behind: its figures then move with the first
	// moments of the drain more than with the consumer. Below one it is
	// for a scenario with a run that drains at a few dozen messages a
	// second, which would take minutes a round at full size, or whose
	// runs are smaller by design (the hot-key ordering scenarios).
	Scale float64
	// Gate, when set, is a bound the scenario's figures must meet outside
	// a smoke run; the report shows it and fails when it is not met.
	Gate *Gate
}

// A Gate bounds a run's effects per second by the best of its
// scenario's runs in the same report: Run's must be at least Min times
// the best's (each the round with the median effects per second); or
// Min times another run's (Of), or at least Floor. Or it bounds another
// figure of the run, each the median of its rounds: its start-up to
// first effect by MaxStartUp, its latency p50 by MaxP50.
type Gate struct {
	// Run is the name of the gated run.
	Run string
	// Min is the lowest share of the best run's effects per second that
	// Run may reach, e.g. 0.9; with Of, the lowest multiple of Of's,
	// e.g. 3.
	Min float64
	// Of, when set, names the run Min is taken of, instead of the best.
	Of string
	// Among, when set, names the runs Min is taken of the best of,
	// instead of Of or the best of all: the hand-written consumers of a
	// scenario, say.
	Among []string
	// Floor, when above zero, is the fewest effects per second Run may
	// reach, whatever the other runs did; Min and Of are then unused.
	Floor float64
	// MaxStartUp, when above zero, is the longest start-up to first
	// effect (Result.StartUp) Run may take; Min, Of and Floor are then
	// unused.
	MaxStartUp time.Duration
	// MaxP50, when above zero, is the highest latency p50 Run may have
	// (Result.Latency); Min, Of and Floor are then unused.
	MaxP50 time.Duration
	// And, when set, is one more gate of the scenario, checked too.
	And *Gate
}

// Need is a server a scenario needs.
type Need string

// The servers a scenario may need.
const (
	NeedPostgres Need = "PostgreSQL (EFFECTIVELY_TEST_POSTGRES_URL)"
	NeedAMQP     Need = "RabbitMQ (EFFECTIVELY_TEST_AMQP_URL)"
)

// A Run is one measured configuration of a scenario.
type Run struct {
	// Name says what runs, e.g. "example service, concurrency 16".
	Name string
	// Baseline marks the run the others' ratio is taken against.
	Baseline bool
	// NoSmoke leaves the run out of a smoke run: for a run whose code the
	// smoke of other runs already goes through (the unordered runs of the
	// ordering scenarios), so that TestSmoke, in make test, stays short.
	NoSmoke bool
	// Scale, when above zero, is the share of the scenario's messages
	// (after Scenario.Scale) this run alone drains, outside a smoke run:
	// for a baseline far slower than the scenario's other runs, whose
	// rate a smaller drain measures as well (one message at a time,
	// each waiting for an outside call), so that make bench stays within
	// MaxRunTime.
	Scale float64
	// Measure runs it and returns its figures. Run checks the effects
	// (Result.Check) after it returns.
	Measure func(ctx context.Context, env *Env) (Result, error)
}

// Result holds the figures of one run. Zero means not measured.
type Result struct {
	// Events is how many distinct events the run fed.
	Events int
	// Messages is how many messages it fed, duplicates included.
	Messages int
	// Effects is how many effects the consumer left, counted where it
	// writes them (its table), once it stopped.
	Effects int
	// DistinctEffects is how many distinct events those effects are of.
	DistinctEffects int
	// Drained is how many effects the drain took Elapsed for.
	Drained int
	// Elapsed is the time from the first effect of the drain to its last.
	Elapsed time.Duration
	// StartUp is the time from the consumer's process start to its first
	// effect, the backlog waiting for it; zero when not measured.
	StartUp time.Duration
	// Steady is the drain's steady-state rate: effects per second from
	// the effect that follows the first SteadyAfter of them to the last;
	// zero when not measured.
	Steady float64
	// Latency is the end-to-end latency measured with a paced producer;
	// nil when not measured.
	Latency *Latency
	// AllocsPerMessage is the consumer process's heap allocations during
	// the drain divided by the messages drained.
	AllocsPerMessage float64
	// CPU is how busy the machine and the consumer were during the drain.
	CPU CPU
	// PeakRSS is the consumer process's peak resident set (VmHWM), in
	// bytes.
	PeakRSS int64
	// Memory is the consumer's memory sampled along the drain; nil when
	// not sampled.
	Memory *Memory
	// Profile is the top of the consumer's CPU profile (go tool pprof
	// -top), one function a line; empty without one.
	Profile []string
	// Note is shown beside the figures, e.g. why a figure is missing.
	Note string
	// Sweep is the pre-sweep that chose the configuration measured; nil
	// when none (see preSweep).
	Sweep *Sweep
}

// EffectsPerSecond is the drain's rate: effects per second between the
// first and the last effect.
func (r Result) EffectsPerSecond() float64 {
	if r.Elapsed <= 0 || r.Drained < 2 {
		return 0
	}
	return float64(r.Drained-1) / r.Elapsed.Seconds()
}

// SteadyAfter is the share of a drain's effects that its steady-state
// rate (Result.Steady) leaves out: the consumer's first batches, its
// pools and caches filling.
const SteadyAfter = 0.1

// Check fails unless the consumer left exactly one effect per distinct
// event it was fed.
func (r Result) Check() error {
	if r.Events == 0 {
		return errors.New("no events fed")
	}
	if r.Effects != r.Events || r.DistinctEffects != r.Events {
		return fmt.Errorf("%d effects of %d distinct events for %d distinct events fed (%d messages): want one effect per event",
			r.Effects, r.DistinctEffects, r.Events, r.Messages)
	}
	return nil
}

// Latency is the end-to-end latency of events fed one at a time at Rate,
// from the producer's send to the effect's write in the consumer's
// transaction.
type Latency struct {
	// Rate is the producer's pace, events per second: half the drain rate.
	Rate float64
	// Events is how many events were timed.
	Events   int
	P50, P99 time.Duration
}
