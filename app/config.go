package app

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/middleware"
)

// The transports EFFECTIVELY_TRANSPORT names.
const (
	TransportSQLite   = "sqlite"
	TransportPostgres = "postgres"
	TransportAMQP     = "amqp"
	TransportMemory   = "memory"
)

// Defaults of Config.
const (
	DefaultTransport   = TransportSQLite
	DefaultDatabaseURL = "file:./data/effectively.db"
	DefaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultHTTPAddr    = "127.0.0.1:9464"
	// DefaultPurgeInterval is how often the purge runs (see purge_interval).
	DefaultPurgeInterval = runner.DefaultPurgeInterval
	// MinProcessedRetention is the shortest processed_retention allowed:
	// marks purged sooner would let a redelivery that comes late, as
	// one after an outage or a broker's requeue does, take effect twice.
	MinProcessedRetention = runner.MinProcessedRetention
	// DefaultOutboxRetention is how long sent outbox rows are kept.
	DefaultOutboxRetention = runner.DefaultOutboxRetention
	// DefaultReplayRetention is how long sent replays are kept.
	DefaultReplayRetention = runner.DefaultReplayRetention
	// DefaultDeadLetterRetention is how long resolved (replayed or
	// discarded) dead letters are kept, with their history.
	DefaultDeadLetterRetention = runner.DefaultDeadLetterRetention
	// DefaultConcurrency is how many messages a consumer has in flight
	// under group commit (batch_size above 1) when neither its settings
	// nor the defaults: section say. The messages in flight fill the
	// consumer's batches, and make bench rose with them (20,000 messages,
	// effects/s): at 16, 64 and 128 in flight AMQP + PostgreSQL 6,281,
	// 8,661 to 12,900 and 13,200 to 15,000, the PostgreSQL transport
	// 3,520, 4,824 to 14,100 and 14,700 to 15,100.
	DefaultConcurrency = 128
	// DefaultUngroupedConcurrency is the default at batch_size 1, where
	// each message in flight holds a database connection.
	DefaultUngroupedConcurrency = 64
	// DefaultSQLiteConcurrency is DefaultConcurrency on the sqlite
	// transport. One writer at a time holds the file: its batches run one
	// after another, so the messages in flight must fill the batch that
	// runs, the one that waits for it and the claims ahead. A message in
	// flight costs a lease row. make bench (60,000 messages, the example
	// service): 26,000 to 30,000 effects/s at 64, 29,000 to 39,000 at 256,
	// no more at 512.
	DefaultSQLiteConcurrency = 256
)

// Config is the application's configuration. LoadConfig reads it from the
// environment and the YAML file named by EFFECTIVELY_CONFIG; the YAML keys
// are the lower-case names in the yaml tags.
type Config struct {
	// Transport is sqlite, postgres, amqp or memory (tests only, not
	// durable). Defaults to DefaultTransport. Env EFFECTIVELY_TRANSPORT.
	Transport string `yaml:"transport"`
	// DatabaseURL is the SQLite file (a path or file: URI) or a
	// postgres:// URL of the stores, outbox and dead letters, and of the SQL
	// transports. Defaults to DefaultDatabaseURL. Env
	// EFFECTIVELY_DATABASE_URL.
	DatabaseURL string `yaml:"database_url"`
	// TransportURL, when set, puts the SQL transport's messages in a
	// database of their own. The ack then comes right after the commit
	// instead of inside it. Defaults to DatabaseURL. Env
	// EFFECTIVELY_TRANSPORT_URL.
	TransportURL string `yaml:"transport_url"`
	// AMQPURL is RabbitMQ's URL when Transport is amqp, or the URLs of
	// several nodes of one cluster separated by commas, which may differ
	// only by host and port: the transport connects to the first that
	// answers and, when the connection is lost, to the next that answers
	// (amqp.ParseURLs). In YAML a string or a list of URLs. Defaults to
	// DefaultAMQPURL. Env EFFECTIVELY_AMQP_URL.
	AMQPURL string `yaml:"-"`
	// amqpURLYAML is the YAML key amqp_url, a string or a list, which
	// LoadConfig moves to AMQPURL.
	amqpURLYAML `yaml:",inline"`
	// AMQPQueueType is the type of the consumers' queues when Transport is
	// amqp: classic, or quorum (replicated over a cluster's nodes,
	// x-delivery-limit AMQPDeliveryLimit). A queue's type cannot change:
	// docs/transports.md says how to move a consumer to a queue of the
	// other type. Defaults to classic. Env EFFECTIVELY_AMQP_QUEUE_TYPE.
	AMQPQueueType string `yaml:"amqp_queue_type"`
	// AMQPDeliveryLimit is the x-delivery-limit of quorum queues: RabbitMQ
	// drops a message returned to its queue more often. It must be above
	// every consumer's MaxDeliveries, so that the framework dead-letters
	// the message first. Defaults to amqp.DefaultDeliveryLimit (YAML
	// only).
	AMQPDeliveryLimit int `yaml:"amqp_delivery_limit"`
	// DatabaseMaxConns bounds the connection pool of DatabaseURL. It must
	// be at least what the declared consumers and the background work may
	// hold at once (each message in flight holds one; how many are in
	// flight depends on the transport, see Concurrency), and the background
	// work (the outbox relay, the readiness check, the purger, the SQL
	// transport's own claims and acks); a smaller value is refused at start,
	// with what makes up the need. Defaults to that need, or to the
	// driver's default pool when it is larger (YAML only).
	DatabaseMaxConns int `yaml:"database_max_conns"`
	// AMQPPrefetch is how many unacknowledged messages RabbitMQ sends
	// ahead to each subscription when Transport is amqp. It buffers; the
	// messages in flight are set by each consumer's Concurrency. Defaults
	// to amqp.DefaultPrefetch (YAML only).
	AMQPPrefetch int `yaml:"amqp_prefetch"`
	// AutoMigrate applies the migrations at start. Defaults to false. Env
	// EFFECTIVELY_AUTO_MIGRATE.
	AutoMigrate bool `yaml:"auto_migrate"`
	// TablePrefix prefixes every table the framework owns. Defaults to
	// none. Env EFFECTIVELY_TABLE_PREFIX.
	TablePrefix string `yaml:"table_prefix"`
	// HTTPAddr serves /healthz, /readyz and /metrics; empty turns it off,
	// ":0" picks a free port. Defaults to DefaultHTTPAddr. Env
	// EFFECTIVELY_HTTP_ADDR.
	HTTPAddr string `yaml:"http_addr"`
	// Console is the operator console in the browser, under /console/ on
	// HTTPAddr; off by default (see ConsoleConfig).
	Console ConsoleConfig `yaml:"console"`
	// CPUProfile, when set, is the file that a CPU profile of the process
	// (runtime/pprof) is written to, from the application's build (its
	// start included) to its stop; read it with go tool pprof. Defaults to none. Env
	// EFFECTIVELY_CPU_PROFILE.
	CPUProfile string `yaml:"cpu_profile"`
	// ProcessedRetention is how long processed marks are kept; older ones
	// are purged in the background. An event redelivered after its mark
	// was purged is processed again, so keep marks longer than any
	// redelivery or replay can come late; it is at least
	// MinProcessedRetention. Zero keeps them forever (YAML only).
	// Defaults to zero.
	ProcessedRetention Duration `yaml:"processed_retention"`
	// PurgeInterval is how often the purge runs in the service: marks
	// older than ProcessedRetention, the delivery counts of messages that
	// finished, sent outbox rows and replays and resolved dead letters past
	// their retention (YAML only; the purge command runs it once).
	// Defaults to DefaultPurgeInterval.
	PurgeInterval Duration `yaml:"purge_interval"`
	// OutboxRetention is how long sent outbox rows are kept (YAML only).
	// Defaults to DefaultOutboxRetention.
	OutboxRetention Duration `yaml:"outbox_retention"`
	// OutboxBatchTimeout bounds the outbox relay's publishing of one
	// batch, and its marking of what it published by as long again
	// (outbox.RelayConfig.BatchTimeout; YAML only); on SQLite a relay that
	// dies leaves its rows leased for twice as long.
	// Defaults to outbox.DefaultBatchTimeout.
	OutboxBatchTimeout Duration `yaml:"outbox_batch_timeout"`
	// OutboxBatchSize is how many rows one batch of the outbox relay
	// publishes at most (outbox.RelayConfig.BatchSize; YAML only).
	// Defaults to outbox.DefaultBatchSize.
	OutboxBatchSize int `yaml:"outbox_batch_size"`
	// OutboxBatchBytes bounds the memory of one batch of the outbox
	// relay: it reads rows while their encoded events come to at most
	// this many bytes, and always one (outbox.RelayConfig.BatchBytes;
	// YAML only). Defaults to outbox.DefaultBatchBytes.
	OutboxBatchBytes int `yaml:"outbox_batch_bytes"`
	// ReplayRetention is how long sent replays are kept (YAML only).
	// Defaults to DefaultReplayRetention.
	ReplayRetention Duration `yaml:"replay_retention"`
	// DeadLetterRetention is how long a replayed or discarded dead letter
	// is kept, with its history, after its resolution; pending ones are
	// kept until resolved (YAML only). Defaults to
	// DefaultDeadLetterRetention.
	DeadLetterRetention Duration `yaml:"dead_letter_retention"`
	// Consumers holds per-consumer settings, keyed by consumer name (YAML
	// only). Consumers not listed use Defaults.
	Consumers map[string]ConsumerConfig `yaml:"consumers"`
	// Defaults are the settings of consumers not listed in Consumers
	// (YAML key "defaults").
	Defaults ConsumerConfig `yaml:"defaults"`
	// Service is the file's service: section, the service's own settings,
	// kept as written: decode it with DecodeService or ServiceConfig (YAML
	// only).
	Service ServiceSection `yaml:"service"`
}

// amqpURLYAML holds the YAML key amqp_url until LoadConfig moves it to
// Config.AMQPURL.
type amqpURLYAML struct {
	AMQPURLs urlList `yaml:"amqp_url"`
}

// urlList is a YAML string or list of strings, kept as one string of
// comma-separated items.
type urlList string

// UnmarshalYAML accepts a string or a list of strings.
func (u *urlList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.SequenceNode {
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		*u = urlList(strings.Join(list, ","))
		return nil
	}
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	*u = urlList(s)
	return nil
}

// ServiceSection is the service: section of the configuration file, kept
// as written until the service decodes it into its own settings (see
// Config.DecodeService). LoadConfig checks every other key of the file;
// the service's struct decides which keys this section may have.
type ServiceSection struct {
	present bool
	path    string       // of the file
	file    []byte       // the whole file, so that errors name its lines
	decoded *atomic.Bool // set by DecodeService, shared by the copies of the Config
}

// UnmarshalYAML records that the file has the section.
func (s *ServiceSection) UnmarshalYAML(*yaml.Node) error {
	s.present = true
	return nil
}

// DecodeService decodes the service: section of the configuration file
// into v, a pointer to the service's own settings, over what v holds (its
// defaults). The keys are those of v's yaml tags, as for Config. A key that
// v has no field for, or a value of the wrong type, is an error naming it
// (e.g. "service.smtp.port (line 12): ..."). Without the section, v is left
// as it is.
func (c Config) DecodeService(v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("app: DecodeService: want a non-nil pointer, got %T", v)
	}
	if !c.Service.present {
		return nil
	}
	// The whole file is decoded again, into the framework's keys (kept
	// raw, already checked) and v, so that an error names the line as it
	// is in the file.
	doc := reflect.New(reflect.StructOf([]reflect.StructField{
		{Name: "Service", Type: rv.Type(), Tag: `yaml:"service"`},
		{Name: "Framework", Type: reflect.TypeFor[map[string]yaml.Node](), Tag: `yaml:",inline"`},
	}))
	doc.Elem().Field(0).Set(rv)
	dec := yaml.NewDecoder(bytes.NewReader(c.Service.file))
	dec.KnownFields(true)
	if err := dec.Decode(doc.Interface()); err != nil {
		return fmt.Errorf("configuration: %s %s: %w", EnvConfig, c.Service.path, namedYAMLError(c.Service.file, err))
	}
	if err := fractionsInIntegers(c.Service.file, doc.Elem().Type()); err != nil {
		return fmt.Errorf("configuration: %s %s: %w", EnvConfig, c.Service.path, err)
	}
	if c.Service.decoded != nil {
		c.Service.decoded.Store(true)
	}
	return nil
}

// checkServiceDecoded refuses a service: section that the service did not
// decode (app.ServiceConfig, Config.DecodeService) once all its
// constructors ran: its settings, typos included, would be ignored
// without a word, as those of an undeclared consumer would be
// (checkConsumers). New runs it last.
func (c Config) checkServiceDecoded() error {
	if !c.Service.present || c.Service.decoded == nil || c.Service.decoded.Load() {
		return nil
	}
	return fmt.Errorf("configuration: %s %s: service: the service decodes no service: section (app.ServiceConfig or Config.DecodeService), so its settings would be ignored; remove it, or decode it into the service's settings", EnvConfig, c.Service.path)
}

// ServiceConfig returns the service: section of the configuration file
// decoded into a T (see Config.DecodeService), for fx:
//
//	fx.Provide(app.ServiceConfig[Settings])
//
// To start from defaults, provide a function that fills them and calls
// DecodeService instead.
func ServiceConfig[T any](cfg Config) (T, error) {
	var v T
	err := cfg.DecodeService(&v)
	return v, err
}

// checkConsumers refuses settings under consumers: for a name that no
// declared consumer has, nor had (handlers.RenamedFrom): a typo there
// would leave the consumer on the defaults without a word. The error names
// each such key and lists the declared names. Module runs it at start.
func (c Config) checkConsumers(declared []handlers.Declaration) error {
	known := make(map[string]bool)
	names := make([]string, 0, len(declared))
	for _, d := range declared {
		known[d.Name] = true
		names = append(names, d.Name)
		for _, old := range d.RenamedFrom {
			known[old] = true
		}
	}
	slices.Sort(names)
	list := strings.Join(names, ", ")
	if list == "" {
		list = "none"
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(c.Consumers)) {
		if !known[name] {
			errs = append(errs, fmt.Errorf("%s: no consumer of this service has that name (declared: %s)", consumerKey(name), list))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("configuration: %w", errors.Join(errs...))
	}
	return nil
}

// ConsumerConfig holds the settings of one consumer. Zero fields take the
// value of Config.Defaults, then the framework's default.
type ConsumerConfig struct {
	// Attempts per delivery, the first included. Defaults to
	// middleware.DefaultAttempts.
	Attempts int `yaml:"attempts"`
	// RetryDelay is the constant pause between attempts. Defaults to
	// middleware.DefaultRetryDelay.
	RetryDelay Duration `yaml:"retry_delay"`
	// Timeout limits one attempt. Defaults to middleware.DefaultTimeout.
	Timeout Duration `yaml:"timeout"`
	// Concurrency is how many messages of the consumer are in flight at
	// once in this process: on amqp that many subscriptions of the
	// consumer's queue, on sqlite that many leases, on postgres that many
	// messages handed out per subscription; memory hands every
	// subscription every message. Under group
	// commit the messages in flight fill the consumer's batches; at
	// batch_size 1 each holds a connection of DatabaseURL's pool, which
	// grows with it.
	// Defaults to DefaultConcurrency under group commit (BatchSize above
	// 1), DefaultSQLiteConcurrency on sqlite, and to
	// DefaultUngroupedConcurrency at BatchSize 1.
	Concurrency int `yaml:"concurrency"`
	// RateLimit caps messages per second; zero means no limit.
	RateLimit float64 `yaml:"rate_limit"`
	// MaxDeliveries dead-letters a message delivered more often, with code
	// delivery_limit. Defaults to middleware.DefaultMaxDeliveries.
	MaxDeliveries int `yaml:"max_deliveries"`
	// SkipStale turns the sequence guard on: an event older (by subjectseq)
	// than one of the same subject that already took effect is skipped
	// (middleware.Config.SkipStale). On when set here or in defaults.
	// Defaults to false.
	SkipStale bool `yaml:"skip_stale"`
	// StrictOrder applies each subject's events one after the other, in
	// sequence: an event ahead of its turn waits, delivered again later,
	// until GapTimeout, or is parked behind an earlier event of its
	// subject that is a dead letter, until that one is replayed or
	// discarded (middleware.Config.StrictOrder). Not with SkipStale.
	// On when set here or in defaults. Defaults to false.
	StrictOrder bool `yaml:"strict_order"`
	// GapTimeout is how long an event waits for an earlier one of its
	// subject under StrictOrder before it is dead-lettered with code
	// sequence_gap. Defaults to middleware.DefaultGapTimeout.
	GapTimeout Duration `yaml:"gap_timeout"`
	// OrderFromFirstSeen, under StrictOrder, starts a subject's sequence
	// at the first event of it the consumer sees, whatever its number,
	// instead of at 1: for a consumer that joins a stream whose subjects
	// began before it. The first event of a new subject that overtakes its
	// predecessors then starts the sequence, and they are skipped as stale
	// (middleware.Config.OrderFromFirstSeen). Without StrictOrder it does
	// nothing. On when set here or in defaults. Defaults to false.
	OrderFromFirstSeen bool `yaml:"order_from_first_seen"`
	// BatchSize is the most of the consumer's attempts that commit in one
	// database transaction (group commit), one after another: when one
	// fails, the transaction rolls back and the others run again without
	// it, so a handler may run more than once for one delivery. 1 gives
	// each attempt a transaction of its own, which no other attempt's
	// failure runs again. Defaults to framework.DefaultBatchSize.
	BatchSize int `yaml:"batch_size"`
	// Batches is how many of the consumer's batches run at once, each on
	// a connection of the pool. Defaults to framework.DefaultBatches.
	Batches int `yaml:"batches"`
	// BatchLinger is how long a batch that could start waits for more
	// attempts while it holds fewer than BatchSize. Defaults to 0: a
	// batch holds what arrived while the previous ones ran.
	BatchLinger Duration `yaml:"batch_linger"`
	// Breaker is the consumer's circuit breaker, off unless
	// breaker.failures is set (middleware.BreakerConfig).
	Breaker BreakerConfig `yaml:"breaker"`
}

// BreakerConfig is a consumer's circuit breaker (YAML key breaker, e.g.
// breaker: {failures: 5, cool_down: 30s, max_hold: 1m}): after failures
// failed attempts in a row the consumer stops taking new messages; they
// wait, uncounted, up to max_hold, and are then nacked to come back
// later; after cool_down one probe attempt goes through, and its success
// closes the breaker. Zero fields take the value of defaults' breaker,
// then middleware's default.
type BreakerConfig struct {
	// Failures opens the breaker after so many failed attempts in a row;
	// zero leaves it off. Defaults to 0, off.
	Failures int `yaml:"failures"`
	// AnyError counts every failed attempt but permanent ones; without it
	// only the dependency failures that handlers mark with
	// framework.Dependency count. On when set here or in defaults.
	// Defaults to false.
	AnyError bool `yaml:"any_error"`
	// CoolDown is how long the breaker stays open before a probe.
	// Defaults to middleware.DefaultBreakerCoolDown.
	CoolDown Duration `yaml:"cool_down"`
	// MaxHold is the longest a message waits at the open breaker before
	// it is nacked, uncounted, to be delivered again later. At most
	// middleware.MaxBreakerHold. Defaults to
	// middleware.DefaultBreakerMaxHold.
	MaxHold Duration `yaml:"max_hold"`
}

// merge fills c's zero fields from base.
func (c BreakerConfig) merge(base BreakerConfig) BreakerConfig {
	c.Failures = cmp.Or(c.Failures, base.Failures)
	c.AnyError = c.AnyError || base.AnyError
	c.CoolDown = cmp.Or(c.CoolDown, base.CoolDown)
	c.MaxHold = cmp.Or(c.MaxHold, base.MaxHold)
	return c
}

// validate reports every invalid setting of c, under key.
func (c BreakerConfig) validate(key string) error {
	var errs []error
	if c.Failures < 0 {
		errs = append(errs, fmt.Errorf("%s.failures: want 1 or more (or nothing: off), got %d", key, c.Failures))
	}
	if c.CoolDown < 0 {
		errs = append(errs, fmt.Errorf("%s.cool_down: must not be negative", key))
	}
	if c.MaxHold < 0 || time.Duration(c.MaxHold) > middleware.MaxBreakerHold {
		errs = append(errs, fmt.Errorf("%s.max_hold: want more than 0 and at most %s (held messages must stay within the transport's deadlines), got %s", key, middleware.MaxBreakerHold, time.Duration(c.MaxHold)))
	}
	return errors.Join(errs...)
}

// Duration is a time.Duration written as "1.5s" or "200ms" in YAML.
type Duration time.Duration

// UnmarshalYAML parses a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		// A TypeError, which yaml.v3 reports with the line of the value, so
		// that LoadConfig can name the key.
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: want a duration such as 500ms or 2s, got %q", n.Line, s)}}
	}
	*d = Duration(v)
	return nil
}

// merge fills c's zero fields from base.
func (c ConsumerConfig) merge(base ConsumerConfig) ConsumerConfig {
	if c.Attempts == 0 {
		c.Attempts = base.Attempts
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = base.RetryDelay
	}
	if c.Timeout == 0 {
		c.Timeout = base.Timeout
	}
	if c.Concurrency == 0 {
		c.Concurrency = base.Concurrency
	}
	if c.RateLimit == 0 {
		c.RateLimit = base.RateLimit
	}
	if c.MaxDeliveries == 0 {
		c.MaxDeliveries = base.MaxDeliveries
	}
	c.SkipStale = c.SkipStale || base.SkipStale
	c.StrictOrder = c.StrictOrder || base.StrictOrder
	c.OrderFromFirstSeen = c.OrderFromFirstSeen || base.OrderFromFirstSeen
	if c.GapTimeout == 0 {
		c.GapTimeout = base.GapTimeout
	}
	c.BatchSize = cmp.Or(c.BatchSize, base.BatchSize)
	c.Batches = cmp.Or(c.Batches, base.Batches)
	c.BatchLinger = cmp.Or(c.BatchLinger, base.BatchLinger)
	c.Breaker = c.Breaker.merge(base.Breaker)
	return c
}

// Settings returns the settings of the consumer name, defaults filled in.
func (c Config) Settings(name string) ConsumerConfig {
	s := c.Consumers[name].merge(c.Defaults).merge(ConsumerConfig{
		Attempts:      middleware.DefaultAttempts,
		RetryDelay:    Duration(middleware.DefaultRetryDelay),
		Timeout:       Duration(middleware.DefaultTimeout),
		MaxDeliveries: middleware.DefaultMaxDeliveries,
		GapTimeout:    Duration(middleware.DefaultGapTimeout),
		BatchSize:     framework.DefaultBatchSize,
		Batches:       framework.DefaultBatches,
	})
	if s.Concurrency == 0 {
		s.Concurrency = c.defaultConcurrency(s.BatchSize)
	}
	return s
}

// defaultConcurrency is a consumer's concurrency on c's transport, at
// batchSize, when neither its settings nor the defaults: section say.
func (c Config) defaultConcurrency(batchSize int) int {
	switch {
	case batchSize <= 1:
		return DefaultUngroupedConcurrency
	case cmp.Or(c.Transport, DefaultTransport) == TransportSQLite:
		return DefaultSQLiteConcurrency
	}
	return DefaultConcurrency
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Transport = cmp.Or(c.Transport, DefaultTransport)
	c.DatabaseURL = cmp.Or(c.DatabaseURL, DefaultDatabaseURL)
	c.TransportURL = cmp.Or(c.TransportURL, c.DatabaseURL)
	c.AMQPURL = cmp.Or(c.AMQPURL, DefaultAMQPURL)
	c.PurgeInterval = cmp.Or(c.PurgeInterval, Duration(DefaultPurgeInterval))
	c.OutboxRetention = cmp.Or(c.OutboxRetention, Duration(DefaultOutboxRetention))
	c.OutboxBatchTimeout = cmp.Or(c.OutboxBatchTimeout, Duration(outbox.DefaultBatchTimeout))
	c.ReplayRetention = cmp.Or(c.ReplayRetention, Duration(DefaultReplayRetention))
	c.DeadLetterRetention = cmp.Or(c.DeadLetterRetention, Duration(DefaultDeadLetterRetention))
	return c
}

// Validate reports every invalid setting, each naming its key.
func (c Config) Validate() error {
	var errs []error
	switch c.Transport {
	case TransportSQLite, TransportMemory:
		switch {
		case c.Transport != TransportSQLite || !isPostgresURL(c.TransportURL):
		case c.TransportURL == c.DatabaseURL:
			errs = append(errs, fmt.Errorf("%s: sqlite needs a SQLite %s or %s, got a postgres:// URL (use the postgres transport)", setting("transport", EnvTransport), setting("database_url", EnvDatabaseURL), setting("transport_url", EnvTransportURL)))
		default: // the stores may be on PostgreSQL, the SQLite transport's messages not
			errs = append(errs, fmt.Errorf("%s: the sqlite transport keeps its messages in a SQLite file, got a postgres:// URL (use the postgres transport)", setting("transport_url", EnvTransportURL)))
		}
	case TransportPostgres:
		if !isPostgresURL(c.TransportURL) {
			errs = append(errs, fmt.Errorf("%s: postgres needs a postgres:// %s or %s", setting("transport", EnvTransport), setting("database_url", EnvDatabaseURL), setting("transport_url", EnvTransportURL)))
		}
	case TransportAMQP:
		if _, err := amqp.ParseURLs(c.AMQPURL); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", setting("amqp_url", EnvAMQPURL), err))
		}
		errs = append(errs, c.validateQueueType())
	default:
		errs = append(errs, fmt.Errorf("%s: want sqlite, postgres, amqp or memory, got %q", setting("transport", EnvTransport), c.Transport))
	}
	if c.DatabaseURL == "" {
		errs = append(errs, fmt.Errorf("%s: empty", setting("database_url", EnvDatabaseURL)))
	}
	for _, u := range []struct{ key, env, url string }{
		{"database_url", EnvDatabaseURL, c.DatabaseURL},
		{"transport_url", EnvTransportURL, c.TransportURL},
	} {
		if u.key == "transport_url" && c.TransportURL == c.DatabaseURL {
			continue // database_url's, said once
		}
		if mistypedPostgresURL(u.url) { // the URL is not quoted: it may hold a password
			errs = append(errs, fmt.Errorf("%s: begins as a PostgreSQL URL but is not one: want postgres://user:password@host:port/database (a SQLite file would be created at that path)", setting(u.key, u.env)))
		} else if scheme, ok := foreignScheme(u.url); ok {
			errs = append(errs, fmt.Errorf("%s: a %s:// URL: want a SQLite file (a path or file: URI) or postgres://user:password@host:port/database (a SQLite file would be created at that path)", setting(u.key, u.env), scheme))
		}
	}
	if err := migrate.ValidateTablePrefix(c.TablePrefix); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", setting("table_prefix", EnvTablePrefix), err))
	}
	if c.DatabaseMaxConns < 0 {
		errs = append(errs, fmt.Errorf("database_max_conns: want 1 or more (or nothing: sized from the consumers), got %d", c.DatabaseMaxConns))
	}
	for _, n := range []struct {
		key string
		n   int
	}{{"outbox_batch_size", c.OutboxBatchSize}, {"outbox_batch_bytes", c.OutboxBatchBytes}} {
		if n.n < 0 {
			errs = append(errs, fmt.Errorf("%s: want 1 or more (or nothing: the default), got %d", n.key, n.n))
		}
	}
	if c.AMQPPrefetch < 0 || c.AMQPPrefetch > 65535 {
		errs = append(errs, fmt.Errorf("amqp_prefetch: want 1..65535, got %d", c.AMQPPrefetch))
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("%s: want host:port, got %q", setting("http_addr", EnvHTTPAddr), c.HTTPAddr))
		}
	}
	if c.ProcessedRetention < 0 || c.ProcessedRetention > 0 && time.Duration(c.ProcessedRetention) < MinProcessedRetention {
		errs = append(errs, fmt.Errorf("processed_retention: want at least %s, or zero to keep marks forever: an event redelivered after its mark was purged takes effect again, got %s",
			MinProcessedRetention, time.Duration(c.ProcessedRetention)))
	}
	if c.PurgeInterval < 0 {
		errs = append(errs, errors.New("purge_interval: must not be negative"))
	}
	for _, r := range []struct {
		key string
		d   Duration
	}{{"outbox_retention", c.OutboxRetention}, {"outbox_batch_timeout", c.OutboxBatchTimeout}, {"replay_retention", c.ReplayRetention}, {"dead_letter_retention", c.DeadLetterRetention}} {
		if r.d < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative (zero is the default)", r.key))
		}
	}
	for name, cc := range c.Consumers {
		if err := framework.ValidateConsumerName(name); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", consumerKey(name), err))
		}
		errs = append(errs, cc.validate(consumerKey(name)))
	}
	errs = append(errs, c.Defaults.validate("defaults"))
	errs = append(errs, c.validateMerged())
	errs = append(errs, c.Console.validate(c.HTTPAddr))
	return errors.Join(errs...)
}

// MaxHandlingTime bounds how long a consumer's settings let one message
// be handled: attempts × (timeout + retry_delay), plus breaker.max_hold
// (runner.MaxHandlingTime).
const MaxHandlingTime = runner.MaxHandlingTime

// settingsKeys returns the keys of the consumers' settings, defaults
// first, and the consumer name of each: empty for the defaults, which a
// consumer not listed takes.
func (c Config) settingsKeys() (keys, names []string) {
	keys, names = []string{"defaults"}, []string{""}
	for _, name := range slices.Sorted(maps.Keys(c.Consumers)) {
		keys, names = append(keys, consumerKey(name)), append(names, name)
	}
	return keys, names
}

// consumerKey is the key of the settings of consumer name, as errors name
// it: "consumers.<name>", with the name printable (see printable). A name
// under consumers: is the file's, not yet checked: one with a newline or
// an escape sequence would otherwise break the one-line message, or move
// the terminal's cursor, and no longer read as its key.
func consumerKey(name string) string { return "consumers." + printable(name) }

// validateMerged checks each consumer's settings merged with the
// defaults, naming the consumer's key (defaults for those not listed):
// that batch_linger is shorter than the timeout (a batch waits for more
// attempts within the time limit of the attempts it holds, so a message
// that arrived alone would time out on every attempt and be
// dead-lettered as timeout), and that the handling time is at most
// MaxHandlingTime.
func (c Config) validateMerged() error {
	keys, names := c.settingsKeys()
	var errs []error
	for i, name := range names {
		s := c.Settings(name)
		if s.BatchLinger > 0 && s.BatchLinger >= s.Timeout {
			errs = append(errs, fmt.Errorf("%s.batch_linger: want less than its timeout (%s): a batch waits within the time limit of its attempts, so a message that arrived alone would time out and be dead-lettered, got %s",
				keys[i], time.Duration(s.Timeout), time.Duration(s.BatchLinger)))
		}
		if runner.OverMaxHandlingTime(s.Attempts, time.Duration(s.Timeout), time.Duration(s.RetryDelay), time.Duration(s.Breaker.MaxHold)) {
			errs = append(errs, fmt.Errorf("%s: attempts × (timeout + retry_delay) + breaker.max_hold: want at most %s, got %d × (%s + %s) + %s",
				keys[i], MaxHandlingTime, s.Attempts, time.Duration(s.Timeout), time.Duration(s.RetryDelay), time.Duration(s.Breaker.MaxHold)))
		}
	}
	return errors.Join(errs...)
}

// validateQueueType checks the AMQP queue type and, for quorum queues,
// that their delivery limit is above every consumer's max_deliveries.
func (c Config) validateQueueType() error {
	switch c.AMQPQueueType {
	case "", amqp.QueueClassic:
		return nil
	case amqp.QueueQuorum:
	default:
		return fmt.Errorf("%s: want %s or %s, got %q", setting("amqp_queue_type", EnvAMQPQueueType), amqp.QueueClassic, amqp.QueueQuorum, c.AMQPQueueType)
	}
	limit := cmp.Or(c.AMQPDeliveryLimit, amqp.DefaultDeliveryLimit)
	if limit < 1 || limit > math.MaxInt32 {
		return fmt.Errorf("amqp_delivery_limit: want 1..%d, got %d", math.MaxInt32, limit)
	}
	keys, names := c.settingsKeys()
	var errs []error
	for i, name := range names {
		if most := c.Settings(name).MaxDeliveries; most >= limit {
			errs = append(errs, fmt.Errorf("amqp_delivery_limit: want more than %s.max_deliveries (%d), so that the framework dead-letters a message before RabbitMQ drops it from its quorum queue, got %d", keys[i], most, limit))
		}
	}
	return errors.Join(errs...)
}

func (c ConsumerConfig) validate(key string) error {
	var errs []error
	if c.Attempts < 0 {
		errs = append(errs, fmt.Errorf("%s.attempts: want 1 or more, got %d", key, c.Attempts))
	}
	if c.RetryDelay < 0 {
		errs = append(errs, fmt.Errorf("%s.retry_delay: must not be negative", key))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("%s.timeout: must not be negative", key))
	}
	if c.Concurrency < 0 || c.Concurrency > 1024 {
		errs = append(errs, fmt.Errorf("%s.concurrency: want 1..1024, got %d", key, c.Concurrency))
	}
	if !(c.RateLimit >= 0) { // NaN too, which would turn the limit off
		errs = append(errs, fmt.Errorf("%s.rate_limit: want 0 (no limit) or more messages a second, got %g", key, c.RateLimit))
	}
	if c.MaxDeliveries < 0 {
		errs = append(errs, fmt.Errorf("%s.max_deliveries: want 1 or more, got %d", key, c.MaxDeliveries))
	}
	if c.SkipStale && c.StrictOrder {
		errs = append(errs, fmt.Errorf("%s.strict_order: not with skip_stale: strict order waits for earlier events, skip_stale drops them", key))
	}
	if c.GapTimeout < 0 {
		errs = append(errs, fmt.Errorf("%s.gap_timeout: must not be negative", key))
	}
	if c.BatchSize < 0 || c.BatchSize > 64 {
		errs = append(errs, fmt.Errorf("%s.batch_size: want 1..64, got %d", key, c.BatchSize))
	}
	if c.Batches < 0 || c.Batches > 64 {
		errs = append(errs, fmt.Errorf("%s.batches: want 1..64, got %d", key, c.Batches))
	}
	if c.BatchLinger < 0 {
		errs = append(errs, fmt.Errorf("%s.batch_linger: must not be negative", key))
	}
	errs = append(errs, c.Breaker.validate(key+".breaker"))
	return errors.Join(errs...)
}

// setting names a setting that the YAML file and an environment variable
// both set, as errors name it: "transport (EFFECTIVELY_TRANSPORT)".
func setting(key, env string) string { return key + " (" + env + ")" }

func isPostgresURL(u string) bool {
	return strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://")
}

// mistypedPostgresURL reports a URL that begins as a PostgreSQL URL does
// but is not one ("postgres//host/db", "postgres:/host/db",
// "POSTGRES://host/db"): SQLite would take it for a file path.
func mistypedPostgresURL(u string) bool {
	if isPostgresURL(u) {
		return false
	}
	lower := strings.ToLower(u)
	for _, scheme := range []string{"postgresql", "postgres"} {
		if rest, ok := strings.CutPrefix(lower, scheme); ok {
			return strings.HasPrefix(rest, ":") || strings.HasPrefix(rest, "//")
		}
	}
	return false
}

// foreignScheme returns the scheme of a URL that is neither a PostgreSQL
// URL nor a SQLite file: URI ("mysql://host/db", "sqlite:///data/x.db"):
// SQLite would take it for a path, and create the folders it names.
func foreignScheme(u string) (string, bool) {
	scheme, _, ok := strings.Cut(u, "://")
	if !ok || scheme == "" || !isLetter(scheme[0]) {
		return "", false
	}
	for _, c := range []byte(scheme) {
		if !isLetter(c) && (c < '0' || c > '9') && c != '+' && c != '-' && c != '.' {
			return "", false // not a scheme (RFC 3986): a path with "://" in it
		}
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql", "file":
		return "", false
	}
	return scheme, true
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// The environment variables LoadConfig reads.
const (
	EnvTransport     = "EFFECTIVELY_TRANSPORT"
	EnvDatabaseURL   = "EFFECTIVELY_DATABASE_URL"
	EnvTransportURL  = "EFFECTIVELY_TRANSPORT_URL"
	EnvAMQPURL       = "EFFECTIVELY_AMQP_URL"
	EnvAMQPQueueType = "EFFECTIVELY_AMQP_QUEUE_TYPE"
	EnvConfig        = "EFFECTIVELY_CONFIG"
	EnvAutoMigrate   = "EFFECTIVELY_AUTO_MIGRATE"
	EnvTablePrefix   = "EFFECTIVELY_TABLE_PREFIX"
	EnvHTTPAddr      = "EFFECTIVELY_HTTP_ADDR"
	EnvCPUProfile    = "EFFECTIVELY_CPU_PROFILE"
)

// LoadConfig reads the configuration: first the YAML file named by
// EFFECTIVELY_CONFIG, when set, then the environment variables, which win.
// lookupEnv is os.LookupEnv in production. The error names each bad key.
func LoadConfig(lookupEnv func(string) (string, bool)) (Config, error) {
	getenv := func(key string) string { v, _ := lookupEnv(key); return v }
	var cfg Config
	cfg.HTTPAddr = DefaultHTTPAddr
	if path := getenv(EnvConfig); path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("%s: %w", EnvConfig, err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		dec.KnownFields(true)
		if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
			return Config{}, fmt.Errorf("%s %s: %w", EnvConfig, path, namedYAMLError(raw, err))
		}
		if err := oneDocument(dec); err != nil {
			return Config{}, fmt.Errorf("%s %s: %w", EnvConfig, path, err)
		}
		if err := nullKeys(raw); err != nil {
			return Config{}, fmt.Errorf("%s %s: %w", EnvConfig, path, err)
		}
		if err := fractionsInIntegers(raw, reflect.TypeFor[Config]()); err != nil {
			return Config{}, fmt.Errorf("%s %s: %w", EnvConfig, path, err)
		}
		if cfg.Service.present {
			cfg.Service.path, cfg.Service.file, cfg.Service.decoded = path, raw, new(atomic.Bool)
		}
		cfg.AMQPURL, cfg.amqpURLYAML = string(cfg.AMQPURLs), amqpURLYAML{}
	}
	for env, dst := range map[string]*string{
		EnvTransport:     &cfg.Transport,
		EnvDatabaseURL:   &cfg.DatabaseURL,
		EnvTransportURL:  &cfg.TransportURL,
		EnvAMQPURL:       &cfg.AMQPURL,
		EnvAMQPQueueType: &cfg.AMQPQueueType,
		EnvTablePrefix:   &cfg.TablePrefix,
		EnvCPUProfile:    &cfg.CPUProfile,
	} {
		if v := getenv(env); v != "" {
			*dst = v
		}
	}
	if v, ok := lookupEnv(EnvHTTPAddr); ok {
		cfg.HTTPAddr = v // empty turns HTTP off
	}
	if v := getenv(EnvAutoMigrate); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return Config{}, fmt.Errorf("configuration: %s: want true or false, got %q", EnvAutoMigrate, v)
		}
		cfg.AutoMigrate = b
	}
	if err := cfg.Console.fromEnv(lookupEnv); err != nil {
		return Config{}, fmt.Errorf("configuration: %w", err)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("configuration: %w", err)
	}
	return cfg, nil
}

// oneDocument returns an error when dec, which decoded the file's first
// YAML document, finds another that holds anything (a file may end with
// "---" or "..."): the decoder reads only the first, so the settings after
// a "---" would be ignored without a word.
func oneDocument(dec *yaml.Decoder) error {
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return err
		}
		for _, n := range doc.Content {
			if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!null" {
				return fmt.Errorf("line %d: a second YAML document (after ---): the file holds one, whose settings are read; the settings of another would be ignored", n.Line)
			}
		}
	}
}

// nullKeys returns an error naming the first key of raw's mappings that
// is null (~, null): yaml.v3 drops such an entry of a map, so that the
// settings of "consumers: {~: {attempts: 1}}" were ignored without a
// word.
func nullKeys(raw []byte) error {
	var root yaml.Node
	if yaml.Unmarshal(raw, &root) != nil {
		return nil // the decoder reported it
	}
	var walk func(n *yaml.Node, path string) error
	walk = func(n *yaml.Node, path string) error {
		switch n.Kind {
		case yaml.DocumentNode, yaml.SequenceNode:
			for _, c := range n.Content {
				if err := walk(c, path); err != nil {
					return err
				}
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!null" {
					return fmt.Errorf("line %d: %s: a key that is null (~): name it", k.Line, cmp.Or(path, "the file"))
				}
				if err := walk(n.Content[i+1], strings.TrimPrefix(path+"."+printable(k.Value), ".")); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(&root, "")
}

// yamlLineRE matches the "line N: problem" entries of yaml.v3's errors;
// yamlFieldRE and yamlValueRE the field or the value that the problem
// names, if any.
var (
	yamlLineRE  = regexp.MustCompile(`^line (\d+): (.*)$`)
	yamlFieldRE = regexp.MustCompile(`^field (\S+) not found in type`)
	yamlValueRE = regexp.MustCompile("^cannot unmarshal !!\\w+ `(.*)` into |, got \"(.*)\"$")
)

// yamlEntry is a key of a YAML file, or a value of a list: its path from
// the root, its own name and its value when that is a scalar.
type yamlEntry struct {
	path, key, value string
}

// namedYAMLError rewrites the entries of a *yaml.TypeError, which name a
// line only ("line 3: cannot unmarshal !!str `three` into int"), to name
// the key of that line as well ("consumers.a.b.attempts (line 3): ..."),
// so that every bad value names its key. On a line of several keys (a
// mapping written {a: 1, b: 2}), it names the key that the problem names
// (an unknown field, a bad value), else the mapping that holds them all.
// Other errors are returned as they are.
func namedYAMLError(raw []byte, err error) error {
	var terr *yaml.TypeError
	if !errors.As(err, &terr) {
		return err
	}
	var root yaml.Node
	if yaml.Unmarshal(raw, &root) != nil {
		return err
	}
	lines := make(map[int][]yamlEntry) // line -> the keys and values on it
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := printable(k.Value) // a key of the file, not yet checked (see consumerKey)
				if path != "" {
					p = path + "." + p
				}
				if v.Kind == yaml.ScalarNode {
					e := yamlEntry{path: p, key: k.Value, value: v.Value}
					lines[k.Line] = append(lines[k.Line], e)
					if v.Line != k.Line { // a value below its key: yaml.v3 names its line
						lines[v.Line] = append(lines[v.Line], e)
					}
					continue
				}
				lines[k.Line] = append(lines[k.Line], yamlEntry{path: p, key: k.Value})
				if v.Kind == yaml.SequenceNode && v.Line != k.Line {
					// A list below its key: yaml.v3 names the line of its
					// first item when the key wants no list.
					lines[v.Line] = append(lines[v.Line], yamlEntry{path: p, key: k.Value})
				}
				walk(v, p)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				walk(c, fmt.Sprintf("%s[%d]", path, i))
			}
		case yaml.ScalarNode: // an item of a list: a mapping's values are its keys' entries
			if path != "" {
				lines[n.Line] = append(lines[n.Line], yamlEntry{path: path, value: n.Value})
			}
		}
	}
	walk(&root, "")
	errs := make([]error, 0, len(terr.Errors))
	for _, e := range terr.Errors {
		m := yamlLineRE.FindStringSubmatch(e)
		if m == nil {
			errs = append(errs, errors.New(e))
			continue
		}
		line, _ := strconv.Atoi(m[1])
		key, ok := keyOfProblem(lines[line], m[2])
		if !ok {
			errs = append(errs, errors.New(e))
			continue
		}
		errs = append(errs, fmt.Errorf("%s (line %d): %s", key, line, m[2]))
	}
	return errors.Join(errs...)
}

// keyOfProblem returns the path of the entry of a line that problem is
// about: the only one; else the one of the field or value it names, when
// one alone matches; else the mapping that holds them all.
func keyOfProblem(entries []yamlEntry, problem string) (string, bool) {
	switch len(entries) {
	case 0:
		return "", false
	case 1:
		return entries[0].path, true
	}
	var match func(yamlEntry) bool
	if m := yamlFieldRE.FindStringSubmatch(problem); m != nil {
		match = func(e yamlEntry) bool { return e.key == m[1] }
	} else if m := yamlValueRE.FindStringSubmatch(problem); m != nil {
		value := m[1] + m[2] // one of the two groups matched
		match = func(e yamlEntry) bool { return e.value == value }
	}
	if match != nil {
		var found []string
		for _, e := range entries {
			if match(e) {
				found = append(found, e.path)
			}
		}
		if len(found) == 1 {
			return found[0], true
		}
	}
	common := pathParts(entries[0].path)
	for _, e := range entries[1:] {
		parts := pathParts(e.path)
		n := 0
		for n < len(common) && n < len(parts) && common[n] == parts[n] {
			n++
		}
		common = common[:n]
	}
	if len(common) == 0 {
		return "", false
	}
	return strings.TrimPrefix(strings.Join(common, ""), "."), true
}

// pathParts splits the path of a yamlEntry into its keys and list
// indexes, each with the separator before it ("a.b[0]": "a", ".b",
// "[0]"), so that a list's items share their key with it.
func pathParts(path string) []string {
	var parts []string
	start := 0
	for i := 1; i < len(path); i++ {
		if path[i] == '.' || path[i] == '[' {
			parts = append(parts, path[start:i])
			start = i
		}
	}
	return append(parts, path[start:])
}
