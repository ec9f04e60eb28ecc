package middleware

import (
	"cmp"
	"errors"
	"time"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/keypath"
)

// Limits of Settings.
const (
	// maxConcurrency is the most messages of one consumer in flight at
	// once in a process (Settings.Concurrency).
	maxConcurrency = 1024
	// maxBatchSize is the largest Settings.BatchSize, and the most
	// batches of a consumer at once (Settings.Batches).
	maxBatchSize = 64
	// MaxHandlingTime bounds how long a consumer's settings let one
	// message be handled: Attempts × (Timeout + RetryDelay), plus
	// Breaker.MaxHold. The transports size their leases and ack deadlines
	// from it, so past it they would overflow; a year is past any
	// sensible setting.
	MaxHandlingTime = 365 * 24 * time.Hour
	// MinTimeout is the shortest Timeout. An attempt's time limit also
	// sizes the transports' leases and ack deadlines: at 1ns every attempt
	// timed out before its handler's first statement, and every message
	// was dead-lettered after its attempts. A millisecond is less than
	// any handler that touches the database needs, so the bound refuses
	// only limits that no attempt can meet.
	MinTimeout = time.Millisecond
	// MinGapTimeout is the shortest GapTimeout. An event ahead of its
	// turn waits that long for its subject's earlier one: at 1ns it was
	// dead-lettered with sequence_gap at once, before the earlier one,
	// delivered in the same instant or a retry away, could run.
	MinGapTimeout = time.Millisecond
	// MinRateLimit is the slowest RateLimit other than none (0): one
	// message an hour, the bound of the command line's replay --rate. A
	// slower one made each message wait for its turn longer than its
	// deadlines (1e-300 messages a second is one in 10^292 years), so
	// every message was nacked, none handled.
	MinRateLimit = 1.0 / 3600
)

// Settings are one consumer's settings: how its messages are retried,
// timed, limited, ordered and batched. The same type is a consumer's
// entry under consumers: (and the defaults: section) of the
// application's YAML file, whose keys are those of the yaml tags; the
// runner's ConsumerConfig, the chain's Config and the test kit's Config
// hold it. Zero fields take their defaults (see WithDefaults); Validate
// names each invalid setting by its YAML key.
type Settings struct {
	// Attempts per delivery, the first included. Defaults to
	// DefaultAttempts.
	Attempts int `yaml:"attempts"`
	// RetryDelay is the constant pause between attempts. Defaults to
	// DefaultRetryDelay.
	RetryDelay time.Duration `yaml:"retry_delay"`
	// Timeout limits each attempt; it also sizes the transports' leases
	// and ack deadlines. At least MinTimeout. Defaults to DefaultTimeout.
	Timeout time.Duration `yaml:"timeout"`
	// Concurrency is how many messages of the consumer are in flight at
	// once in this process (the runner's, not the chain's, which handles
	// what it is given): on amqp that many subscriptions of the
	// consumer's queue, on sqlite that many leases, on postgres that many
	// messages handed out per subscription; memory hands every
	// subscription every message. Under group commit the messages in
	// flight fill the consumer's batches; at batch_size 1 each holds a
	// database connection. At most 1024. Defaults to 1; the
	// application's default depends on its transport and batch size (see
	// app.DefaultConcurrency).
	Concurrency int `yaml:"concurrency"`
	// RateLimit caps the messages per second that this process hands to
	// the Outer middleware and the attempts; zero means no limit, else at
	// least MinRateLimit (one an hour). A message waiting for its turn
	// when its context ends is nacked. Defaults to 0, no limit.
	RateLimit float64 `yaml:"rate_limit"`
	// MaxDeliveries dead-letters a message delivered more often, with
	// code delivery_limit. Defaults to DefaultMaxDeliveries.
	MaxDeliveries int `yaml:"max_deliveries"`
	// MaxBodyBytes limits message bodies: a larger one is dead-lettered
	// with code too_large.
	// Defaults to framework.DefaultMaxBodyBytes.
	MaxBodyBytes int `yaml:"max_body_bytes"`
	// SkipStale skips an event older (by subjectseq) than one of the same
	// subject that already took effect. Not with StrictOrder. Defaults to
	// false.
	SkipStale bool `yaml:"skip_stale"`
	// StrictOrder applies each subject's events in sequence; an event
	// ahead of its turn waits, up to GapTimeout: it is nacked, and parked
	// (acknowledged, not processed, applied as soon as its turn comes)
	// once it has waited GapPark; while an earlier event of its subject
	// is a dead letter it is parked at once, and applied after that one
	// takes effect or is discarded with its parked events released. Not
	// with SkipStale. Defaults to false.
	StrictOrder bool `yaml:"strict_order"`
	// GapTimeout is how long an event waits for an earlier one of its
	// subject under StrictOrder before it is dead-lettered with code
	// sequence_gap; at least MinGapTimeout. Defaults to DefaultGapTimeout.
	GapTimeout time.Duration `yaml:"gap_timeout"`
	// OrderFromFirstSeen, under StrictOrder, starts a subject's sequence
	// at the first event of it this consumer sees, whatever its number,
	// instead of at 1: for a consumer that joins a stream whose subjects
	// began before it. Its cost: the first event of a new subject that
	// overtakes its predecessors (a retry, a redelivery, two messages in
	// flight) starts the sequence, and they are skipped as stale. Without
	// StrictOrder it does nothing. Defaults to false.
	OrderFromFirstSeen bool `yaml:"order_from_first_seen"`
	// BatchSize is the most of the consumer's attempts that commit in one
	// transaction (group commit), one after another: when one fails, the
	// transaction rolls back and the others run again without it, so a
	// handler may run more than once for one delivery. 1 gives each
	// attempt a transaction of its own, which no other attempt's failure
	// runs again. It configures the unit of work that the runner (or the
	// test kit) builds; Handler uses the one it is given. At most
	// 64. Defaults to driver.DefaultBatchSize.
	BatchSize int `yaml:"batch_size"`
	// Batches is how many of the consumer's batches run at once, each on
	// a connection of its own (see BatchSize). At most 64.
	// Defaults to driver.DefaultBatches.
	Batches int `yaml:"batches"`
	// BatchLinger is how long a batch that could start waits for more of
	// the consumer's attempts while it holds fewer than BatchSize (see
	// BatchSize); less than Timeout. Defaults to 0: a batch holds what
	// arrived while the previous ones ran.
	BatchLinger time.Duration `yaml:"batch_linger"`
	// Overlap is the most database connections the consumer's attempts
	// hold at once, besides its batches', while its handlers spend their
	// time outside the database, as a handler that calls an HTTP service
	// does: group commit then stops running them one after another in a
	// batch; each runs at once, its transaction begun at its handler's
	// first statement, holding no connection while it waits (see
	// driver.UnitOfWork), and they gather into batches again once their
	// time goes to the database. PostgreSQL only: SQLite has one writer.
	// 1 keeps the attempts in batches whatever their handlers do. At
	// most 1024. Defaults to driver.DefaultOverlap.
	Overlap int `yaml:"overlap"`
	// Partitions splits the consumer's subjects into so many partitions
	// (by a hash of each event's subject, or of its id when it has
	// none), each consumed by one of the consumer's live processes at a
	// time, so that several processes share the consumer and each
	// subject's events still run in order. 1 is one partition: every
	// process takes messages of every subject. The count is the
	// consumer's for good: a start with another count is refused. At
	// most driver.MaxPartitions; the RabbitMQ and PostgreSQL transports
	// only. Defaults to 1.
	Partitions int `yaml:"partitions"`
	// Breaker, with Breaker.Failures set, is the consumer's circuit
	// breaker: after so many failed attempts in a row new messages wait
	// before the delivery guard, uncounted, until a probe attempt after
	// the cool-down succeeds (see BreakerConfig). Its MaxHold adds to the
	// time a message may be held by the transport (the PostgreSQL ack
	// deadline). Defaults to off.
	Breaker BreakerConfig `yaml:"breaker"`
	// LogErrorText logs the text of a failed attempt's error, and of the
	// error that dead-lettered a message, as it is. Off by default: the
	// log then says the error's type, its code and its SQLSTATE, not its
	// text, since a handler's error and a database's may quote the
	// payload's values (`invalid input syntax for type uuid: "…"`), and a
	// service's logs are read by more people, and kept longer, than the
	// database its events are in. The framework's own decode and
	// validation errors, which name the field and quote no value, are
	// logged with their text either way.
	LogErrorText bool `yaml:"log_error_text"`
}

// WithDefaults returns a copy of s with zero fields set to their
// defaults.
func (s Settings) WithDefaults() Settings {
	s.Attempts = cmp.Or(s.Attempts, DefaultAttempts)
	s.RetryDelay = cmp.Or(s.RetryDelay, DefaultRetryDelay)
	s.Timeout = cmp.Or(s.Timeout, DefaultTimeout)
	s.Concurrency = cmp.Or(s.Concurrency, 1)
	s.MaxDeliveries = cmp.Or(s.MaxDeliveries, DefaultMaxDeliveries)
	s.MaxBodyBytes = cmp.Or(s.MaxBodyBytes, framework.DefaultMaxBodyBytes)
	s.GapTimeout = cmp.Or(s.GapTimeout, DefaultGapTimeout)
	s.BatchSize = cmp.Or(s.BatchSize, driver.DefaultBatchSize)
	s.Batches = cmp.Or(s.Batches, driver.DefaultBatches)
	s.Overlap = cmp.Or(s.Overlap, driver.DefaultOverlap)
	s.Partitions = cmp.Or(s.Partitions, 1)
	s.Breaker = s.Breaker.withDefaults()
	return s
}

// Merge returns a copy of s with its zero fields set from base, as a
// consumer's entry takes the file's defaults: section: a number or
// duration that s leaves zero takes base's, and a switch (SkipStale,
// StrictOrder, OrderFromFirstSeen, Breaker.AnyError) is on when on in
// either.
func (s Settings) Merge(base Settings) Settings {
	s.Attempts = cmp.Or(s.Attempts, base.Attempts)
	s.RetryDelay = cmp.Or(s.RetryDelay, base.RetryDelay)
	s.Timeout = cmp.Or(s.Timeout, base.Timeout)
	s.Concurrency = cmp.Or(s.Concurrency, base.Concurrency)
	s.RateLimit = cmp.Or(s.RateLimit, base.RateLimit)
	s.MaxDeliveries = cmp.Or(s.MaxDeliveries, base.MaxDeliveries)
	s.MaxBodyBytes = cmp.Or(s.MaxBodyBytes, base.MaxBodyBytes)
	s.SkipStale = s.SkipStale || base.SkipStale
	s.StrictOrder = s.StrictOrder || base.StrictOrder
	s.GapTimeout = cmp.Or(s.GapTimeout, base.GapTimeout)
	s.OrderFromFirstSeen = s.OrderFromFirstSeen || base.OrderFromFirstSeen
	s.BatchSize = cmp.Or(s.BatchSize, base.BatchSize)
	s.Batches = cmp.Or(s.Batches, base.Batches)
	s.BatchLinger = cmp.Or(s.BatchLinger, base.BatchLinger)
	s.Overlap = cmp.Or(s.Overlap, base.Overlap)
	s.Partitions = cmp.Or(s.Partitions, base.Partitions)
	s.Breaker = s.Breaker.merge(base.Breaker)
	s.LogErrorText = s.LogErrorText || base.LogErrorText
	return s
}

// Validate reports every invalid setting of s, which has its defaults
// (see WithDefaults), joined (errors.Join); each names the setting by its
// YAML key ("attempts: want 1 or more, got 0", "breaker.max_hold: ...").
func (s Settings) Validate() error {
	var errs []error
	add := func(key, format string, args ...any) {
		errs = append(errs, keypath.Errorf(key, format, args...))
	}
	if s.Attempts < 1 {
		add("attempts", "want 1 or more, got %d", s.Attempts)
	}
	if s.RetryDelay < 0 {
		add("retry_delay", "must not be negative, got %s", s.RetryDelay)
	}
	switch {
	case s.Timeout <= 0:
		add("timeout", "must be positive (it sizes the transports' leases), got %s", s.Timeout)
	case s.Timeout < MinTimeout:
		add("timeout", "want at least %s (no attempt finishes sooner; it sizes the transports' leases), got %s", MinTimeout, s.Timeout)
	}
	if s.Concurrency < 1 || s.Concurrency > maxConcurrency {
		add("concurrency", "want 1..%d, got %d", maxConcurrency, s.Concurrency)
	}
	switch {
	case !(s.RateLimit >= 0): // NaN too, which would turn the limit off
		add("rate_limit", "want 0 (no limit) or more messages a second, got %g", s.RateLimit)
	case s.RateLimit > 0 && s.RateLimit < MinRateLimit:
		add("rate_limit", "want 0 (no limit) or at least %.6f messages a second (one an hour; a message waiting longer for its turn is nacked), got %g", MinRateLimit, s.RateLimit)
	}
	if s.MaxDeliveries < 1 {
		add("max_deliveries", "want 1 or more, got %d", s.MaxDeliveries)
	}
	if s.MaxBodyBytes < 1 {
		add("max_body_bytes", "want 1 or more, got %d", s.MaxBodyBytes)
	}
	if s.SkipStale && s.StrictOrder {
		add("strict_order", "not with skip_stale: strict order waits for earlier events, skip_stale drops them")
	}
	switch {
	case s.GapTimeout <= 0:
		add("gap_timeout", "must be positive, got %s", s.GapTimeout)
	case s.GapTimeout < MinGapTimeout:
		add("gap_timeout", "want at least %s (an event ahead of its turn would be dead-lettered before the earlier one could run), got %s", MinGapTimeout, s.GapTimeout)
	}
	if s.BatchSize < 1 || s.BatchSize > maxBatchSize {
		add("batch_size", "want 1..%d, got %d", maxBatchSize, s.BatchSize)
	}
	if s.Batches < 1 || s.Batches > maxBatchSize {
		add("batches", "want 1..%d, got %d", maxBatchSize, s.Batches)
	}
	if s.Overlap < 1 || s.Overlap > maxConcurrency {
		add("overlap", "want 1..%d, got %d", maxConcurrency, s.Overlap)
	}
	if s.Partitions < 1 || s.Partitions > driver.MaxPartitions {
		add("partitions", "want 1..%d, got %d", driver.MaxPartitions, s.Partitions)
	}
	switch {
	case s.BatchLinger < 0:
		add("batch_linger", "must not be negative, got %s", s.BatchLinger)
	case s.BatchLinger > 0 && s.Timeout > 0 && s.BatchLinger >= s.Timeout:
		add("batch_linger", "want less than its timeout (%s): a batch waits within the time limit of its attempts, so a message that arrived alone would time out and be dead-lettered, got %s",
			s.Timeout, s.BatchLinger)
	}
	if s.Breaker.Failures < 0 {
		add("breaker.failures", "want 1 or more (or nothing: off), got %d", s.Breaker.Failures)
	}
	if s.Breaker.CoolDown <= 0 {
		add("breaker.cool_down", "must be positive, got %s", s.Breaker.CoolDown)
	}
	if s.Breaker.MaxHold <= 0 || s.Breaker.MaxHold > MaxBreakerHold {
		add("breaker.max_hold", "want more than 0 and at most %s (held messages must stay within the transport's deadlines), got %s", MaxBreakerHold, s.Breaker.MaxHold)
	}
	if float64(s.Attempts)*(float64(s.Timeout)+float64(s.RetryDelay))+float64(s.Breaker.MaxHold) > float64(MaxHandlingTime) {
		// In floating point: the product may overflow a Duration.
		add("", "attempts × (timeout + retry_delay) + breaker.max_hold: want at most %s (the transports size leases and ack deadlines from it), got %d × (%s + %s) + %s",
			MaxHandlingTime, s.Attempts, s.Timeout, s.RetryDelay, s.Breaker.MaxHold)
	}
	return errors.Join(errs...)
}
