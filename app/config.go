package app

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"gopkg.in/yaml.v3"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/middleware"
)

// The transports EFFECTIVELY_TRANSPORT names.
const (
	TransportSQLite   = "sqlite"
	TransportPostgres = "postgres"
	TransportAMQP     = "amqp"
	TransportMemory   = "memory"
)

// Defaults and bounds of Config.
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
	// DefaultTransportRetention is how long the PostgreSQL transport's
	// messages that every consumer group passed are kept.
	DefaultTransportRetention = runner.DefaultTransportRetention
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
	// MinPurgeInterval is the shortest purge_interval. A purge takes its
	// lease and reads each kind's index even when it finds nothing, so an
	// interval of nanoseconds ran one purge after another and kept a core
	// and the database busy. A service purges every few minutes
	// (DefaultPurgeInterval); the bound refuses the intervals that keep
	// it running without a pause, and leaves a test's short ones.
	MinPurgeInterval = 10 * time.Millisecond
	// MinOutboxBatchTimeout is the shortest outbox_batch_timeout. A batch
	// takes a round trip to the broker per event and one to the database
	// to mark them: at 1ns every batch timed out before its first publish,
	// and the relay published nothing. 10ms is above a round trip on a
	// local network, and far below any sensible setting (the default is
	// outbox.DefaultBatchTimeout).
	MinOutboxBatchTimeout = 10 * time.Millisecond
	// MinRetention is the shortest outbox_retention, replay_retention,
	// dead_letter_retention and transport_retention. Shorter, the purge
	// deletes a row as soon as it runs: a dead letter replayed, with its
	// history, or a replay sent, would be gone before an operator could
	// look at it (events show, dead-letters show). Zero is the default,
	// not "keep nothing".
	MinRetention = time.Minute
	// MaxConfigFileBytes is the largest file EFFECTIVELY_CONFIG may name,
	// 16 MiB: far more than any service's settings, and a bound on what
	// LoadConfig reads into memory (a path to /dev/zero read until the
	// process ran out of it).
	MaxConfigFileBytes = 16 << 20
)

// The bounds of Config.PartitionLease: a shorter lease is renewed so
// often that a busy database or a pause of the process loses it, a
// longer one leaves a dead process's partitions waiting for long.
const (
	minPartitionLease = time.Second
	maxPartitionLease = 10 * time.Minute
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
	// transports: a file, not an in-memory database (:memory:,
	// mode=memory, an empty path), without white space around it or a NUL
	// byte in it. Defaults to DefaultDatabaseURL. Env
	// EFFECTIVELY_DATABASE_URL.
	DatabaseURL string `yaml:"database_url"`
	// TransportURL, when set, puts the SQL transport's messages in a
	// database of their own. The ack then comes right after the commit
	// instead of inside it. The same rules as DatabaseURL's. Defaults to
	// DatabaseURL. Env EFFECTIVELY_TRANSPORT_URL.
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
	// the message first. From 1 to 2147483647, checked on any transport.
	// Defaults to amqp.DefaultDeliveryLimit (YAML only).
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
	// TablePrefix prefixes every table the framework owns (see
	// migrate.ValidateTablePrefix); on SQLite it may not begin with
	// sqlite_, which SQLite reserves. Defaults to none. Env
	// EFFECTIVELY_TABLE_PREFIX.
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
	// start included) to its stop; read it with go tool pprof. A file
	// that exists must be empty or a CPU profile (the last run's), which
	// is overwritten; any other is refused. Defaults to none. Env
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
	// their retention (YAML only; the purge command runs it once). At
	// least MinPurgeInterval. Defaults to DefaultPurgeInterval.
	PurgeInterval Duration `yaml:"purge_interval"`
	// OutboxRetention is how long sent outbox rows are kept (YAML only),
	// at least MinRetention. Defaults to DefaultOutboxRetention.
	OutboxRetention Duration `yaml:"outbox_retention"`
	// OutboxBatchTimeout bounds the outbox relay's publishing of one
	// batch, and its marking of what it published by as long again
	// (outbox.RelayConfig.BatchTimeout; YAML only); on SQLite a relay that
	// dies leaves its rows leased for twice as long. At least
	// MinOutboxBatchTimeout. Defaults to outbox.DefaultBatchTimeout.
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
	// OutboxDropUnroutable lists the event types whose outbox rows may be
	// dropped when the broker routes them nowhere (on RabbitMQ, no queue
	// bound to the type's exchange): marked sent and counted
	// (outbox.RelayConfig.DropUnroutable; YAML only). The rows of other
	// types wait unsent until a queue is bound. Defaults to none.
	OutboxDropUnroutable []string `yaml:"outbox_drop_unroutable"`
	// ReplayRetention is how long sent replays are kept (YAML only), at
	// least MinRetention. Defaults to DefaultReplayRetention.
	ReplayRetention Duration `yaml:"replay_retention"`
	// DeadLetterRetention is how long a replayed or discarded dead letter
	// is kept, with its history, after its resolution; pending ones are
	// kept until resolved (YAML only); at least MinRetention. Defaults to
	// DefaultDeadLetterRetention.
	DeadLetterRetention Duration `yaml:"dead_letter_retention"`
	// TransportRetention is how long the PostgreSQL transport keeps, in
	// its watermill_<type> tables, the messages that every consumer group
	// of their topic passed; the purge deletes the older ones (YAML
	// only); at least MinRetention. Defaults to DefaultTransportRetention.
	TransportRetention Duration `yaml:"transport_retention"`
	// PartitionLease is how long the leases of partitioned consumers'
	// partitions (the consumer setting partitions), and each process's
	// membership of their groups, last without renewal: a process that
	// dies or freezes keeps its partitions that long, and the service
	// renews them every fifth of it (runner.Config.PartitionLease). From
	// 1s to 10m (YAML only). Defaults to driver.DefaultLease.
	PartitionLease Duration `yaml:"partition_lease"`
	// Consumers holds per-consumer settings, keyed by consumer name (YAML
	// only): the keys of middleware.Settings. A zero field takes the value
	// of Defaults (see Settings).
	Consumers map[string]middleware.Settings `yaml:"consumers"`
	// Defaults are the settings of consumers not listed in Consumers, and
	// the zero fields of those listed (YAML key "defaults").
	Defaults middleware.Settings `yaml:"defaults"`
	// Service is the file's service: section, the service's own settings,
	// kept as written: decode it with DecodeService or ServiceConfig (YAML
	// only).
	Service ServiceSection `yaml:"service"`
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
	c.TransportRetention = cmp.Or(c.TransportRetention, Duration(DefaultTransportRetention))
	c.PartitionLease = cmp.Or(c.PartitionLease, Duration(driver.DefaultLease))
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
		errs = append(errs, fmt.Errorf("%s: want sqlite, postgres, amqp or memory, got %s", setting("transport", EnvTransport), quoteValue(c.Transport)))
	}
	errs = append(errs, c.validateURLs()...)
	errs = append(errs, c.validateTablePrefix())
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
	for i, typ := range c.OutboxDropUnroutable {
		if strings.TrimSpace(typ) == "" {
			errs = append(errs, fmt.Errorf("outbox_drop_unroutable[%d]: want an event type, got %s", i, quoteValue(typ)))
		}
	}
	if c.AMQPPrefetch < 0 || c.AMQPPrefetch > 65535 {
		errs = append(errs, fmt.Errorf("amqp_prefetch: want 1..65535, got %d", c.AMQPPrefetch))
	}
	if c.AMQPDeliveryLimit < 0 || c.AMQPDeliveryLimit > math.MaxInt32 { // on any transport: a file may move to amqp
		errs = append(errs, fmt.Errorf("amqp_delivery_limit: want 1..%d (or nothing: %d), got %d", math.MaxInt32, amqp.DefaultDeliveryLimit, c.AMQPDeliveryLimit))
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil || spaceAround(c.HTTPAddr) {
			errs = append(errs, fmt.Errorf("%s: want host:port, without white space around it, got %s", setting("http_addr", EnvHTTPAddr), quoteValue(c.HTTPAddr)))
		}
	}
	if c.ProcessedRetention < 0 || c.ProcessedRetention > 0 && time.Duration(c.ProcessedRetention) < MinProcessedRetention {
		errs = append(errs, fmt.Errorf("processed_retention: want at least %s, or zero to keep marks forever: an event redelivered after its mark was purged takes effect again, got %s",
			MinProcessedRetention, time.Duration(c.ProcessedRetention)))
	}
	errs = append(errs, c.validateDurations()...)
	if d := time.Duration(c.PartitionLease); d != 0 && (d < minPartitionLease || d > maxPartitionLease) {
		errs = append(errs, fmt.Errorf("partition_lease: want %s to %s (renewed every fifth of it; a process that dies keeps its partitions that long), got %s",
			minPartitionLease, maxPartitionLease, d))
	}
	errs = append(errs, c.validateConsumers())
	errs = append(errs, c.Console.validate(c.HTTPAddr))
	return errors.Join(errs...)
}

// setting names a setting that the YAML file and an environment variable
// both set, as errors name it: "transport (EFFECTIVELY_TRANSPORT)".
func setting(key, env string) string { return key + " (" + env + ")" }

func isPostgresURL(u string) bool {
	return strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://")
}

// checkPostgresURL reports a postgres:// URL that pgx cannot read, as
// the service would at start: a bad port, an unknown
// target_session_attrs. Several hosts are fine, as libpq writes them
// (postgres://user:password@host1:port1,host2:port2/database), and Go's
// net/url does not always read (a host without a port after one with a
// port: postgres://db-1:5432,db-2/app).
// The error says why without the URL, which may hold a password (pgx's
// own masks it on a best-effort basis).
func checkPostgresURL(u string) error {
	if !isPostgresURL(u) {
		return nil
	}
	_, err := pgx.ParseConfig(u)
	if err == nil {
		return nil
	}
	why := "cannot parse it"
	var pe *pgconn.ParseConfigError
	if _, after, ok := strings.Cut(err.Error(), "`: "); ok && errors.As(err, &pe) && !strings.Contains(after, "`") {
		why += ": " + after // the reason, after the URL
	}
	return fmt.Errorf("not a PostgreSQL URL (%s); want postgres://user:password@host:port/database, or for a failover postgres://user:password@host1:port1,host2:port2/database?target_session_attrs=read-write", why)
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
// EFFECTIVELY_CONFIG, when set (a regular file of at most
// MaxConfigFileBytes), then the environment variables, which win.
// lookupEnv is os.LookupEnv in production. The error names each bad key.
func LoadConfig(lookupEnv func(string) (string, bool)) (Config, error) {
	getenv := func(key string) string { v, _ := lookupEnv(key); return v }
	var cfg Config
	cfg.HTTPAddr = DefaultHTTPAddr
	if path := getenv(EnvConfig); path != "" {
		raw, err := readConfigFile(path)
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
		b, err := envBool(EnvAutoMigrate, v)
		if err != nil {
			return Config{}, fmt.Errorf("configuration: %w", err)
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
