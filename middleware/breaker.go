package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// Defaults and limits of BreakerConfig.
const (
	// DefaultBreakerCoolDown is how long an open breaker waits before it
	// lets one probe attempt through.
	DefaultBreakerCoolDown = 30 * time.Second
	// DefaultBreakerMaxHold is how long a message waits at an open
	// breaker before it is released (nacked, delivered again later).
	DefaultBreakerMaxHold = time.Minute
	// MaxBreakerHold is the longest MaxHold allowed: a held message, with
	// its handling after it, must stay well within RabbitMQ's
	// consumer_timeout (30 minutes by default).
	MaxBreakerHold = 10 * time.Minute
)

// BreakerConfig is a consumer's circuit breaker (see Settings.Breaker;
// YAML key breaker, e.g. breaker: {failures: 5, cool_down: 30s, max_hold:
// 1m}): after Failures failed attempts in a row the consumer stops taking
// new messages; they wait, uncounted, up to MaxHold, and are then nacked
// to come back later; after CoolDown one probe attempt goes through, and
// its success closes the breaker. It is off unless Failures is set.
type BreakerConfig struct {
	// Failures opens the breaker after so many failed attempts in a row;
	// zero turns the breaker off. Attempts that ran beside a failure
	// already counted (the attempts of one failed batch, say) count
	// once with it. Defaults to 0, off.
	Failures int `yaml:"failures"`
	// AnyError counts every failed attempt but permanent ones; without
	// it only dependency failures count (framework.Dependency). Defaults
	// to false.
	AnyError bool `yaml:"any_error"`
	// CoolDown is how long the breaker stays open before one probe
	// attempt goes through. Defaults to DefaultBreakerCoolDown.
	CoolDown time.Duration `yaml:"cool_down"`
	// MaxHold is how long a message waits at the open breaker before it
	// is released: nacked and delivered again later, neither counted as a
	// delivery nor dead-lettered. At most MaxBreakerHold. Defaults to
	// DefaultBreakerMaxHold.
	MaxHold time.Duration `yaml:"max_hold"`
}

// withDefaults returns a copy of c with zero fields set to their
// defaults.
func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.CoolDown == 0 {
		c.CoolDown = DefaultBreakerCoolDown
	}
	if c.MaxHold == 0 {
		c.MaxHold = DefaultBreakerMaxHold
	}
	return c
}

// merge returns a copy of c with its zero fields set from base, AnyError
// on when on in either (see Settings.Merge).
func (c BreakerConfig) merge(base BreakerConfig) BreakerConfig {
	c.Failures = cmp.Or(c.Failures, base.Failures)
	c.AnyError = c.AnyError || base.AnyError
	c.CoolDown = cmp.Or(c.CoolDown, base.CoolDown)
	c.MaxHold = cmp.Or(c.MaxHold, base.MaxHold)
	return c
}

// BreakerState is the state of a consumer's circuit breaker.
type BreakerState int

// The states of a breaker, as the gauge effectively_consumer_breaker_state
// reports them.
const (
	// BreakerClosed lets every message through.
	BreakerClosed BreakerState = 0
	// BreakerOpen holds new messages until the cool-down ends.
	BreakerOpen BreakerState = 1
	// BreakerHalfOpen lets one probe through and holds the others.
	BreakerHalfOpen BreakerState = 2
)

// String returns "closed", "open" or "half_open".
func (s BreakerState) String() string {
	switch s {
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half_open"
	}
	return "closed"
}

// BreakerStatus is a consumer's breaker at one moment (see
// Metrics.Breakers).
type BreakerStatus struct {
	// Consumer is the consumer's name.
	Consumer string
	// State is the breaker's state.
	State BreakerState
}

// errHeld is the error of a message released by an open breaker: it wraps
// pipeline.ErrLater, so the chain nacks it without a dead letter.
var errHeld = fmt.Errorf("circuit breaker open: message released, %w", pipeline.ErrLater)

// breaker is one consumer's circuit breaker. Its gate step, before the
// delivery guard, holds new messages while it is open; its count step,
// inside the retries, learns from each attempt.
//
// A failure counts when no failure was counted since its attempt started:
// attempts that overlapped a counted failure failed, most likely, of the
// same cause (a batch whose transaction failed fails all its attempts at
// once), so they count once. epoch numbers the counted failures.
type breaker struct {
	cfg      BreakerConfig
	consumer string
	clk      clock
	logger   *slog.Logger

	mu        sync.Mutex
	state     BreakerState
	failures  int // failures in a row, while closed
	epoch     uint64
	openUntil time.Time
	probing   bool   // half-open: the probe is out
	probe     uint64 // the number of the latest probe
	changed   chan struct{}
}

// newBreaker returns the breaker of cfg, which has its defaults and a
// breaker, and registers it with cfg.Metrics.
func newBreaker(cfg Config, clk clock) *breaker {
	b := &breaker{
		cfg: cfg.Breaker, consumer: cfg.Consumer.Name(), clk: clk, logger: cfg.Logger,
		changed: make(chan struct{}),
	}
	if cfg.Metrics != nil {
		cfg.Metrics.breakers.add(b)
	}
	return b
}

// State returns the breaker's state.
func (b *breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// gate is the step before the delivery guard: while the breaker is open a
// message waits here, uncounted, until the breaker closes, it becomes the
// probe, or MaxHold passed (then it is released with errHeld).
func (b *breaker) gate(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		probe, err := b.enter(msg.Context())
		if err != nil {
			return nil, err
		}
		if probe == 0 {
			return next(msg)
		}
		stateOf(msg).probe = probe
		defer b.probeEnded(probe)
		return next(msg)
	}
}

// enter waits until a message that arrived now may go on; probe is the
// number of the probe it became, 0 when the breaker is closed.
func (b *breaker) enter(ctx context.Context) (probe uint64, err error) {
	holdUntil := b.clk.now().Add(b.cfg.MaxHold)
	for {
		b.mu.Lock()
		now := b.clk.now()
		switch {
		case b.state == BreakerClosed:
			b.mu.Unlock()
			return 0, nil
		case b.state == BreakerOpen && !now.Before(b.openUntil):
			b.setState(ctx, BreakerHalfOpen)
			fallthrough
		case b.state == BreakerHalfOpen && !b.probing:
			b.probing = true
			b.probe++
			probe := b.probe
			b.mu.Unlock()
			return probe, nil
		case !now.Before(holdUntil):
			b.mu.Unlock()
			return 0, errHeld
		}
		wake := holdUntil
		if b.state == BreakerOpen && b.openUntil.Before(wake) {
			wake = b.openUntil
		}
		changed := b.changed
		b.mu.Unlock()
		select {
		case <-changed:
		case <-b.clk.after(wake.Sub(now)):
		case <-ctx.Done():
			return 0, fmt.Errorf("circuit breaker open: %w", ctx.Err())
		}
	}
}

// probeEnded lets another message probe when the probe numbered probe
// ended without a verdict (no attempt of it succeeded or counted as a
// failure).
func (b *breaker) probeEnded(probe uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == BreakerHalfOpen && b.probing && b.probe == probe {
		b.probing = false
		b.notify()
	}
}

// count is the step inside the retries: it tells the breaker how each
// attempt ended. An attempt that failed of a dependency while the breaker
// is open (it opened it, or it ran beside the failure that did) ends the
// message's attempts: it is nacked with pipeline.ErrLater, not retried
// now nor dead-lettered, and waits at the gate when it comes back.
func (b *breaker) count(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx, st := msg.Context(), stateOf(msg) // the inner steps set contexts of their own
		b.mu.Lock()
		epoch := b.epoch
		b.mu.Unlock()
		out, err := next(msg)
		if b.attempted(ctx, st, epoch, err) {
			return out, fmt.Errorf("circuit breaker open, %w: %w", pipeline.ErrLater, err)
		}
		return out, err
	}
}

// verdict is what an attempt tells the breaker.
type verdict int

const (
	verdictNone verdict = iota
	verdictSuccess
	verdictFailure
)

// verdictOf is what an attempt of st that ended with err tells: a success
// when it took effect, a failure when it failed of a dependency (or of
// anything but a permanent error, with AnyError), else nothing: a
// duplicate, a stale event, a permanent error, a wait, a shutdown.
func (b *breaker) verdictOf(ctx context.Context, st *state, err error) verdict {
	switch {
	case ctx.Err() != nil || errors.Is(err, pipeline.ErrLater):
		return verdictNone
	case err == nil:
		if st.outcome == framework.Duplicate || st.stale || st.parked {
			return verdictNone
		}
		return verdictSuccess
	case framework.IsPermanent(err):
		return verdictNone
	case b.cfg.AnyError || framework.IsDependency(err):
		return verdictFailure
	}
	return verdictNone
}

// attempted records an attempt of st, started in epoch, that ended with
// err, and reports whether it failed of a dependency while the breaker is
// open (then the message is to come back later).
func (b *breaker) attempted(ctx context.Context, st *state, epoch uint64, err error) (later bool) {
	v := b.verdictOf(ctx, st, err)
	if v == verdictNone {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		if v == verdictSuccess {
			b.failures = 0
			return false
		}
		if epoch != b.epoch {
			return false // it overlapped a counted failure: counted with it
		}
		b.epoch++
		if b.failures++; b.failures >= b.cfg.Failures {
			b.open(ctx)
		}
	case BreakerHalfOpen:
		if !b.probing || st.probe != b.probe {
			return false // only the probe decides
		}
		b.probing = false
		if v == verdictSuccess {
			b.failures = 0
			b.setState(ctx, BreakerClosed)
			return false
		}
		b.epoch++
		b.open(ctx)
	}
	return v == verdictFailure && b.state == BreakerOpen
}

// open opens the breaker for a cool-down; the caller holds the lock.
func (b *breaker) open(ctx context.Context) {
	b.failures = 0
	b.openUntil = b.clk.now().Add(b.cfg.CoolDown)
	b.setState(ctx, BreakerOpen)
}

// setState moves the breaker to s, logs it and wakes the messages
// waiting at the gate; the caller holds the lock.
func (b *breaker) setState(ctx context.Context, s BreakerState) {
	b.state = s
	level := slog.LevelInfo
	if s == BreakerOpen {
		level = slog.LevelWarn
	}
	b.logger.LogAttrs(ctx, level, "circuit breaker "+s.String(),
		slog.String("consumer", b.consumer), slog.Int("failures", b.cfg.Failures), slog.Duration("cool_down", b.cfg.CoolDown))
	b.notify()
}

// notify wakes the messages waiting at the gate; the caller holds the
// lock.
func (b *breaker) notify() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// breakers are the breakers of the consumers observed with one Metrics,
// reported as the gauge effectively_consumer_breaker_state.
type breakers struct {
	mu     sync.Mutex
	byName map[string]*breaker
	desc   *prometheus.Desc
}

var _ prometheus.Collector = (*breakers)(nil)

func newBreakers() *breakers {
	return &breakers{
		byName: make(map[string]*breaker),
		desc: prometheus.NewDesc("effectively_consumer_breaker_state",
			"State of the consumer's circuit breaker in this process: 0 closed, 1 open (new messages wait), 2 half-open (one probe goes through). Absent for a consumer without a breaker.",
			[]string{"consumer"}, nil),
	}
}

// add registers b (again: a chain built anew replaces its breaker).
func (r *breakers) add(b *breaker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byName[b.consumer] = b
}

// statuses returns every breaker's status, by consumer name.
func (r *breakers) statuses() []BreakerStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]BreakerStatus, 0, len(r.byName))
	for _, name := range slices.Sorted(maps.Keys(r.byName)) {
		out = append(out, BreakerStatus{Consumer: name, State: r.byName[name].State()})
	}
	return out
}

// Describe implements prometheus.Collector.
func (r *breakers) Describe(ch chan<- *prometheus.Desc) { ch <- r.desc }

// Collect implements prometheus.Collector.
func (r *breakers) Collect(ch chan<- prometheus.Metric) {
	for _, s := range r.statuses() {
		ch <- prometheus.MustNewConstMetric(r.desc, prometheus.GaugeValue, float64(s.State), s.Consumer)
	}
}
