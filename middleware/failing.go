package middleware

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/effectively-once/effectively/framework"
)

// redeliveryGrace is what the chain adds to a delivery's attempt budget before
// a failing message that fails no more is forgotten: time for a nacked
// message to come back.
const redeliveryGrace = time.Minute

// ConsumerStatus is what a consumer's failing messages look like in this
// process at one moment (see Metrics.Consumers). A message is failing from
// its first failed attempt or nack until it is acknowledged (its effect
// committed, or it was a duplicate or stale) or dead-lettered.
type ConsumerStatus struct {
	// Consumer is the consumer's name.
	Consumer string
	// FailingMessages counts the consumer's failing messages.
	FailingMessages int
	// OldestFailing is the time since the first failure of the oldest
	// failing message; zero when none fails.
	OldestFailing time.Duration
	// HoldUpLimit is the longest a message should keep failing before it
	// is dead-lettered, MaxDeliveries × Attempts × (Timeout + RetryDelay) of
	// its Config.
	HoldUpLimit time.Duration
	// PausedMessages counts the consumer's messages whose attempts pause
	// now for an outage of the database, uncharged (see Paused).
	PausedMessages int
	// Paused says why, when PausedMessages is not 0:
	// PausedDatabaseFull when any of them pauses for that, else
	// PausedDatabaseUnreachable.
	Paused string
}

// HeldUp reports whether the oldest failing message has been failing for
// longer than the hold-up limit: it is not being dead-lettered (the
// dead-letter store or the delivery count fails), and on a transport that
// hands the consumer one message at a time, the messages behind it wait.
func (s ConsumerStatus) HeldUp() bool {
	return s.HoldUpLimit > 0 && s.OldestFailing > s.HoldUpLimit
}

// failing tracks, per consumer, the messages that failed in this process
// and were neither acknowledged nor dead-lettered yet, and reports them as
// Prometheus gauges, computed when scraped.
type failing struct {
	mu        sync.Mutex
	consumers map[string]*failingConsumer

	messages, oldest, limit, paused *prometheus.Desc
}

// failingConsumer is one consumer's part of failing. Its methods are safe
// on a nil receiver, which tracks nothing (a chain without Metrics).
type failingConsumer struct {
	parent      *failing
	name        string
	holdUpLimit time.Duration
	forgetAfter time.Duration
	now         func() time.Time
	messages    map[framework.Key]failure
	paused      map[*state]string // the messages whose attempts pause, and why
}

// failure is when a message first and last failed in this process.
type failure struct{ first, last time.Time }

var _ prometheus.Collector = (*failing)(nil)

func newFailing() *failing {
	return &failing{
		consumers: make(map[string]*failingConsumer),
		messages: prometheus.NewDesc("effectively_consumer_failing_messages",
			"Messages whose last attempt or delivery failed in this process, neither acknowledged nor dead-lettered yet, by consumer.",
			[]string{"consumer"}, nil),
		oldest: prometheus.NewDesc("effectively_consumer_oldest_failing_seconds",
			"Time since the first failure of the consumer's oldest failing message; 0 when none fails. Alert when above effectively_consumer_hold_up_limit_seconds.",
			[]string{"consumer"}, nil),
		paused: prometheus.NewDesc("effectively_consumer_paused_messages",
			"Messages whose attempts pause now in this process for an outage of the database, uncharged, by consumer and reason (\"database unreachable\" or \"database full\").",
			[]string{"consumer", "reason"}, nil),
		limit: prometheus.NewDesc("effectively_consumer_hold_up_limit_seconds",
			"The longest a message of the consumer should keep failing before it is dead-lettered: max deliveries × attempts × (timeout + retry delay).",
			[]string{"consumer"}, nil),
	}
}

// consumer registers the consumer named name (again: its messages stay)
// and returns its part.
func (f *failing) consumer(name string, holdUpLimit, forgetAfter time.Duration, now func() time.Time) *failingConsumer {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.consumers[name]
	if !ok {
		c = &failingConsumer{parent: f, name: name, messages: make(map[framework.Key]failure), paused: make(map[*state]string)}
		f.consumers[name] = c
	}
	c.holdUpLimit, c.forgetAfter, c.now = holdUpLimit, forgetAfter, now
	return c
}

// fail records a failure of msg, whose state is st.
func (c *failingConsumer) fail(msg *message.Message, st *state) {
	if c == nil {
		return
	}
	k := messageKey(msg, st)
	c.parent.mu.Lock()
	defer c.parent.mu.Unlock()
	now := c.now()
	c.forget(now)
	f, ok := c.messages[k]
	if !ok {
		f.first = now
	}
	f.last = now
	c.messages[k] = f
}

// clear forgets msg, whose state is st: it was acknowledged or
// dead-lettered.
func (c *failingConsumer) clear(msg *message.Message, st *state) {
	if c == nil {
		return
	}
	c.parent.mu.Lock()
	defer c.parent.mu.Unlock()
	if len(c.messages) == 0 { // the usual case: spare the key
		return
	}
	delete(c.messages, messageKey(msg, st))
}

// pause records that the attempts of msg, whose state is st, pause for
// reason.
func (c *failingConsumer) pause(msg *message.Message, st *state, reason string) {
	if c == nil {
		return
	}
	c.fail(msg, st)
	c.parent.mu.Lock()
	defer c.parent.mu.Unlock()
	c.paused[st] = reason
}

// resume records that the pause of the message of st ended.
func (c *failingConsumer) resume(st *state) {
	if c == nil {
		return
	}
	c.parent.mu.Lock()
	defer c.parent.mu.Unlock()
	delete(c.paused, st)
}

// forget drops the messages that failed no more for forgetAfter: they went
// to another process, or their event was handled there.
func (c *failingConsumer) forget(now time.Time) {
	for k, f := range c.messages {
		if now.Sub(f.last) > c.forgetAfter {
			delete(c.messages, k)
		}
	}
}

// status returns the consumer's status now; the caller holds the lock.
func (c *failingConsumer) status() ConsumerStatus {
	now := c.now()
	c.forget(now)
	s := ConsumerStatus{Consumer: c.name, FailingMessages: len(c.messages), HoldUpLimit: c.holdUpLimit, PausedMessages: len(c.paused)}
	for _, f := range c.messages {
		s.OldestFailing = max(s.OldestFailing, now.Sub(f.first))
	}
	for _, reason := range c.paused {
		if s.Paused != PausedDatabaseFull {
			s.Paused = reason
		}
	}
	return s
}

// statuses returns every consumer's status, by name.
func (f *failing) statuses() []ConsumerStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]ConsumerStatus, 0, len(f.consumers))
	for _, name := range slices.Sorted(maps.Keys(f.consumers)) {
		out = append(out, f.consumers[name].status())
	}
	return out
}

// Describe implements prometheus.Collector.
func (f *failing) Describe(ch chan<- *prometheus.Desc) {
	ch <- f.messages
	ch <- f.oldest
	ch <- f.limit
	ch <- f.paused
}

// Collect implements prometheus.Collector.
func (f *failing) Collect(ch chan<- prometheus.Metric) {
	for _, s := range f.statuses() {
		ch <- prometheus.MustNewConstMetric(f.messages, prometheus.GaugeValue, float64(s.FailingMessages), s.Consumer)
		ch <- prometheus.MustNewConstMetric(f.oldest, prometheus.GaugeValue, s.OldestFailing.Seconds(), s.Consumer)
		ch <- prometheus.MustNewConstMetric(f.limit, prometheus.GaugeValue, s.HoldUpLimit.Seconds(), s.Consumer)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(f.consumers)) {
		counts := map[string]int{PausedDatabaseUnreachable: 0, PausedDatabaseFull: 0}
		for _, reason := range f.consumers[name].paused {
			counts[reason]++
		}
		for reason, n := range counts {
			ch <- prometheus.MustNewConstMetric(f.paused, prometheus.GaugeValue, float64(n), name, reason)
		}
	}
}

// holdUp returns what a message costs the consumer of cfg at most before
// it is dead-lettered, MaxDeliveries × Attempts × (Timeout + RetryDelay),
// and how long a failing message that fails no more stays counted: one
// delivery's attempts plus time to come back. cfg has its defaults and is
// valid (its Timeout is positive).
func holdUp(cfg Config) (limit, forgetAfter time.Duration) {
	budget := time.Duration(cfg.Attempts) * (cfg.Timeout + cfg.RetryDelay)
	return time.Duration(cfg.MaxDeliveries) * budget, budget + redeliveryGrace
}
