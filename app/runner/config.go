package runner

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/internal/keypath"
	"github.com/effectively-once/effectively/middleware"
)

// ConsumerConfig is one consumer and how the runner handles its messages.
// Zero settings take their defaults (see middleware.Settings.WithDefaults).
type ConsumerConfig struct {
	// Consumer is the consumer (see framework.NewConsumer). Required.
	Consumer *framework.Consumer
	// Settings are the consumer's settings: retries, time limits,
	// concurrency, ordering, batches, breaker (see middleware.Settings),
	// the same type as a consumer's entry in the application's YAML file.
	middleware.Settings
	// RenamedFrom are the consumer's former names, whose processed marks
	// it adopts at Start.
	RenamedFrom []string
	// WithoutDedup, when not empty, is why the consumer takes no
	// processed marks (handlers.WithoutDedup): every delivery runs its
	// handler (driver.UnitOfWorkConfig.WithoutMark).
	WithoutDedup string
}

// WithDefaults returns a copy of c with zero settings set to their
// defaults (see middleware.Settings.WithDefaults).
func (c ConsumerConfig) WithDefaults() ConsumerConfig {
	c.Settings = c.Settings.WithDefaults()
	return c
}

// unitOfWork is the configuration of the consumer's unit of work on db.
func (c ConsumerConfig) unitOfWork(db *sqlx.DB, store driver.Store) driver.UnitOfWorkConfig {
	return driver.UnitOfWorkConfig{
		DB: db, Store: store, BatchSize: c.BatchSize, Batches: c.Batches, Linger: c.BatchLinger,
		Overlap: c.Overlap, WithoutMark: c.WithoutDedup != "",
	}
}

// Validate reports a missing Consumer, else every invalid setting (see
// middleware.Settings.Validate), named ConsumerConfig.Settings.<key>.
func (c ConsumerConfig) Validate() error {
	if c.Consumer == nil {
		return errors.New("ConsumerConfig.Consumer: required (build it with framework.NewConsumer)")
	}
	return keypath.Prefix("ConsumerConfig.Settings", c.Settings.Validate())
}

// The defaults of Config's service-level fields.
const (
	// DefaultPurgeInterval is how often the runner purges (see
	// Config.PurgeInterval).
	DefaultPurgeInterval = 10 * time.Minute
	// MinProcessedRetention is the shortest Config.ProcessedRetention
	// allowed: a processed mark must outlive any redelivery of its
	// message.
	MinProcessedRetention = time.Hour
	// DefaultOutboxRetention is how long sent outbox rows are kept.
	DefaultOutboxRetention = 24 * time.Hour
	// DefaultReplayRetention is how long sent replays are kept.
	DefaultReplayRetention = 7 * 24 * time.Hour
	// DefaultDeadLetterRetention is how long resolved (replayed or
	// discarded) dead letters are kept.
	DefaultDeadLetterRetention = 30 * 24 * time.Hour
	// DefaultTransportRetention is how long the transport's messages
	// that every consumer group passed are kept (see
	// Config.TransportRetention).
	DefaultTransportRetention = 24 * time.Hour
)

// Config is what New takes: the consumers, the transport they consume
// from and the database they take effect in, and the service's settings
// of the outbox relay, the purge and the gauges.
type Config struct {
	// Consumers are the consumers to run, each with its settings.
	Consumers []ConsumerConfig
	// Transport delivers the consumers' messages. The runner subscribes
	// through it but never closes it. Required.
	Transport driver.Transport
	// DB is the database of the handlers' transactions. Required.
	DB *sqlx.DB
	// Store is the consumers' store in DB. Required.
	Store driver.Store
	// Logger logs the router and the messages. Defaults to a logger that
	// discards.
	Logger *slog.Logger
	// Metrics, when set, counts the messages (see middleware.NewMetrics).
	Metrics *middleware.Metrics
	// Tracer, when set, traces the messages.
	Tracer trace.Tracer
	// Outer middleware runs once per delivery, outside the retries and
	// the transaction (see middleware.Config). A consumer's RateLimit
	// waits before it.
	Outer []message.HandlerMiddleware
	// Inner middleware runs inside each attempt, in its transaction.
	Inner []message.HandlerMiddleware

	// OutboxRelay is the relay of the service's outbox: when its Outbox
	// is set, the runner runs it from Start to Stop, publishing through
	// Transport's publisher (see outbox.RelayConfig; its TablePrefix must
	// be the outbox's). Its Logger and Tracer default to the runner's.
	// While the runner purges, the purge deletes the sent rows (see
	// OutboxRetention) and the relay's own cleanup is off. Defaults to no
	// relay.
	OutboxRelay outbox.RelayConfig
	// PurgeInterval is how often the runner deletes what is past its
	// retention (the delivery counts of messages that finished, and the
	// rows older than the retentions below), one process of the service
	// at a time; the first purge is at Start. A negative interval turns
	// the purge off, and so does a Store that does not implement
	// driver.Purger. Defaults to DefaultPurgeInterval.
	PurgeInterval time.Duration
	// ProcessedRetention is how long processed marks are kept; at least
	// MinProcessedRetention. Zero keeps them for ever.
	ProcessedRetention time.Duration
	// OutboxRetention is how long sent outbox rows are kept. Defaults to
	// DefaultOutboxRetention.
	OutboxRetention time.Duration
	// ReplayRetention is how long sent replays are kept. Defaults to
	// DefaultReplayRetention.
	ReplayRetention time.Duration
	// DeadLetterRetention is how long replayed or discarded dead letters
	// are kept, with their history; pending ones are never purged.
	// Defaults to DefaultDeadLetterRetention.
	DeadLetterRetention time.Duration
	// TransportRetention is how long the messages of the consumers'
	// topics that every consumer group of the topic passed are kept in
	// the transport's tables, when the Transport keeps tables the purge
	// deletes from (driver.TopicPurger: the PostgreSQL transport).
	// Defaults to DefaultTransportRetention.
	TransportRetention time.Duration
	// Registerer, when set, is where New registers the gauges read from
	// the database on scrape, when the Store implements driver.Gauges:
	// effectively_dead_letters_pending{consumer,code} and
	// effectively_parked_events{consumer}; and, when a consumer is
	// partitioned and the Store implements driver.Leases,
	// effectively_partition_leases{consumer,partition,owner} and (with
	// Backlogs) effectively_partition_backlog{consumer,partition}; and,
	// with Backlogs and a Store that holds leases (driver.Purger), the
	// lag of every consumer (LagGauges), exported by the one process that
	// holds the lease "lag". Stop unregisters them, and gives the lease
	// up.
	Registerer prometheus.Registerer
	// Backlogs counts what waits in the partitioned consumers'
	// partitions, for the gauge effectively_partition_backlog, and for
	// every consumer, for the lag gauges (LagGauges). Defaults
	// to Transport when it implements driver.BacklogCounter, else none.
	Backlogs driver.BacklogCounter
	// TopicPurger deletes, with the purge, the messages of the
	// consumers' topics that every consumer group passed, older than
	// TransportRetention. Defaults to Transport when it implements
	// driver.TopicPurger, else none.
	TopicPurger driver.TopicPurger
	// GroupAdopter gives a renamed consumer (ConsumerConfig.RenamedFrom)
	// its old names' positions in the transport's topics, at start.
	// Defaults to Transport when it implements driver.GroupAdopter, else
	// none: a renamed consumer's group then starts as the transport
	// starts a new one.
	GroupAdopter driver.GroupAdopter
	// PartitionLease is how long a partitioned consumer's leases (see
	// middleware.Settings.Partitions) last without renewal, and so how
	// long a process that died keeps its partitions; the runner renews
	// them every fifth of it. Defaults to driver.DefaultLease.
	PartitionLease time.Duration
	// Member is this process's name in its partitioned consumers' groups
	// (driver.Leases), unique among the processes of the service, now
	// and later. When the Store ends a stale owner's sessions
	// (driver.SessionEnder), name the connections of DB, and of the
	// transport's pool on PostgreSQL, after it (their application_name,
	// see postgres.OpenConfig.ApplicationName): a process that takes over
	// a partition from this one, frozen past its lease, then ends them.
	// Defaults to NewMember().
	Member string
}

// WithDefaults returns a copy of c with zero fields set to their defaults,
// the consumers' included.
func (c Config) WithDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	consumers := make([]ConsumerConfig, len(c.Consumers))
	for i, cc := range c.Consumers {
		consumers[i] = cc.WithDefaults()
	}
	c.Consumers = consumers
	c.PurgeInterval = cmp.Or(c.PurgeInterval, DefaultPurgeInterval)
	c.OutboxRetention = cmp.Or(c.OutboxRetention, DefaultOutboxRetention)
	c.ReplayRetention = cmp.Or(c.ReplayRetention, DefaultReplayRetention)
	c.DeadLetterRetention = cmp.Or(c.DeadLetterRetention, DefaultDeadLetterRetention)
	c.TransportRetention = cmp.Or(c.TransportRetention, DefaultTransportRetention)
	c.PartitionLease = cmp.Or(c.PartitionLease, driver.DefaultLease)
	if c.Member == "" {
		c.Member = NewMember()
	}
	if c.Backlogs == nil {
		c.Backlogs, _ = c.Transport.(driver.BacklogCounter)
	}
	if c.TopicPurger == nil {
		c.TopicPurger, _ = c.Transport.(driver.TopicPurger)
	}
	if c.GroupAdopter == nil {
		c.GroupAdopter, _ = c.Transport.(driver.GroupAdopter)
	}
	return c
}

// Validate reports the first invalid field of c.
func (c Config) Validate() error {
	switch {
	case c.Transport == nil:
		return errors.New("Config.Transport: required")
	case c.DB == nil:
		return errors.New("Config.DB: required")
	case c.Store == nil:
		return errors.New("Config.Store: required")
	case c.ProcessedRetention < 0 || c.ProcessedRetention > 0 && c.ProcessedRetention < MinProcessedRetention:
		return fmt.Errorf("Config.ProcessedRetention: must be zero (kept for ever) or at least %s, got %s", MinProcessedRetention, c.ProcessedRetention)
	case c.OutboxRetention < 0:
		return fmt.Errorf("Config.OutboxRetention: must not be negative, got %s", c.OutboxRetention)
	case c.ReplayRetention < 0:
		return fmt.Errorf("Config.ReplayRetention: must not be negative, got %s", c.ReplayRetention)
	case c.DeadLetterRetention < 0:
		return fmt.Errorf("Config.DeadLetterRetention: must not be negative, got %s", c.DeadLetterRetention)
	case c.TransportRetention < 0:
		return fmt.Errorf("Config.TransportRetention: must not be negative, got %s", c.TransportRetention)
	case c.PartitionLease < 0:
		return fmt.Errorf("Config.PartitionLease: must not be negative, got %s", c.PartitionLease)
	}
	seen := make(map[string]bool, len(c.Consumers))
	for i, cc := range c.Consumers {
		if err := cc.Validate(); err != nil {
			return fmt.Errorf("Config.Consumers[%d]: %w", i, err)
		}
		if seen[cc.Consumer.Name()] {
			return fmt.Errorf("Config.Consumers[%d]: consumer %s appears twice", i, cc.Consumer.Name())
		}
		seen[cc.Consumer.Name()] = true
	}
	return nil
}
