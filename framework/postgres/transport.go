package postgres

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/internal/replay"
	"github.com/effectively-once/effectively/framework/internal/storedmsg"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/internal/bound"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/internal/watermilllog"
)

// The postgres transport keeps watermill-sql v4's default PostgreSQL
// schema: one table of messages per topic, ordered by the transaction that
// wrote them (xid8) so that no commit is skipped, and one table of offsets
// per topic with a row per consumer group. It publishes with watermill-sql's
// publisher and subscribes with a subscriber of its own over the same
// tables (subscriber.go), which hands out many messages of a group at once.
// It adds columns of its own, which watermill-sql's statements ignore: the
// bucket of each message (partition_bucket.go), and the handed-out
// position of each group (subscriber_tables.go).
// docs/transports.md says why this schema and not the queue schema (which
// has no consumer groups), and how to insert a message by hand.

// Defaults of TransportConfig.
const (
	// DefaultPollInterval is how long an idle subscription waits before it
	// looks for new messages again, and a standby subscription before it
	// tries its group's lock again.
	DefaultPollInterval = 100 * time.Millisecond
	// DefaultResendInterval is the pause before a nacked message is
	// handed out again.
	DefaultResendInterval = time.Second
	// DefaultAckDeadline is how long a message may stay unacknowledged
	// before the subscriber gives it up and delivers it again (an Ack of
	// the first delivery still counts). It must outlast the whole handling
	// of a message (attempts × (timeout + delay)).
	DefaultAckDeadline = 5 * time.Minute
	// DefaultBatchSize is how many messages a subscription reads ahead of
	// those it hands out (its concurrency), and how many acknowledgements
	// it gathers before it writes its group's position. A larger batch
	// saves queries but redelivers more after a crash (see
	// docs/transports.md for the measurements). A read brings a batch's
	// worth of rows while the messages in flight are handled (make bench:
	// 10 gave 10.1k effects/s, a read every 10 rows; 64 gave 13k). A
	// subscription hands out no message while a read runs (a round trip
	// and a commit), so fewer reads drain faster: 128 drained the
	// ordering backlogs about a tenth faster than 64, unordered and under
	// strict order alike (three interleaved runs of each); 256 drained
	// unordered faster still, but strict order on many subjects gained
	// little (internal/tools/bench/findings.md).
	DefaultBatchSize = 128
)

// MaxUUIDLength is the longest message UUID the messages table holds
// (VARCHAR(36)); the publisher replaces a longer one, e.g. a long event id,
// by a UUID derived from it. The framework identifies events by their
// CloudEvent source and id, never by this UUID.
const MaxUUIDLength = 36

// maxIdentifier is PostgreSQL's limit on names (NAMEDATALEN - 1).
const maxIdentifier = 63

// TransportConfig configures a Transport: its publisher and its subscribers.
type TransportConfig struct {
	// URL is the transport's database, where New opens the subscribers'
	// pool of their own (see Transport). Required by Transport.Subscribe;
	// a Transport without it publishes and replays only.
	URL string
	// TablePrefix prefixes the names of the transport's tables, like those
	// of the stores. Defaults to none.
	TablePrefix string
	// PollInterval is how long an idle subscription waits before it looks
	// for new messages again, and a standby subscription (another holds
	// its group's lock) before it tries the lock again. Defaults to
	// DefaultPollInterval.
	PollInterval time.Duration
	// ResendInterval is the pause before a nacked message is handed out
	// again. Defaults to DefaultResendInterval.
	ResendInterval time.Duration
	// AckDeadline is how long a message may stay unacknowledged before it
	// is given up and delivered again. Defaults to DefaultAckDeadline.
	AckDeadline time.Duration
	// BatchSize is how many messages a subscription reads ahead of those
	// it hands out: it holds at most its concurrency + BatchSize messages
	// read and not acknowledged in order, which a crash delivers again.
	// It is also how many acknowledgements it gathers before it writes
	// its group's position. Defaults to DefaultBatchSize.
	BatchSize int
	// ApplicationName is the application_name of the subscribers' pool's
	// connections (see OpenConfig.ApplicationName). Defaults to the URL's,
	// if any.
	ApplicationName string
	// Logger receives the transport's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c TransportConfig) WithDefaults() TransportConfig {
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.ResendInterval = cmp.Or(c.ResendInterval, DefaultResendInterval)
	c.AckDeadline = cmp.Or(c.AckDeadline, DefaultAckDeadline)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first invalid field of c.
func (c TransportConfig) Validate() error {
	if err := migrate.ValidateTablePrefix(c.TablePrefix); err != nil {
		return fmt.Errorf("postgres: TransportConfig.TablePrefix: %w", err)
	}
	switch {
	case c.PollInterval < 0:
		return fmt.Errorf("postgres: TransportConfig.PollInterval must not be negative, got %s", c.PollInterval)
	case c.ResendInterval < 0:
		return fmt.Errorf("postgres: TransportConfig.ResendInterval must not be negative, got %s", c.ResendInterval)
	case c.AckDeadline < 0:
		return fmt.Errorf("postgres: TransportConfig.AckDeadline must not be negative, got %s", c.AckDeadline)
	case c.BatchSize < 1:
		return fmt.Errorf("postgres: TransportConfig.BatchSize must be at least 1, got %d", c.BatchSize)
	}
	return validApplicationName("TransportConfig.ApplicationName", c.ApplicationName)
}

// MessagesTable returns the quoted name of the table that holds the
// messages of topic: "<prefix>watermill_<topic>". A name longer than
// PostgreSQL's 63 bytes is cut and ends with a hash of the whole name.
func MessagesTable(prefix, topic string) string {
	return quoteIdent(identifier(prefix + "watermill_" + topic))
}

// OffsetsTable returns the quoted name of the table that holds the consumer
// groups' offsets in topic: "<prefix>watermill_offsets_<topic>", cut like
// MessagesTable's.
func OffsetsTable(prefix, topic string) string {
	return quoteIdent(identifier(prefix + "watermill_offsets_" + topic))
}

func identifier(name string) string {
	if len(name) <= maxIdentifier {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	suffix := "_" + hex.EncodeToString(sum[:5])
	cut := name[:maxIdentifier-len(suffix)]
	for len(cut) > 0 && !utf8Start(cut[len(cut)-1]) {
		cut = cut[:len(cut)-1]
	}
	return cut + suffix
}

// utf8Start reports whether b may end a valid cut (it is ASCII).
func utf8Start(b byte) bool { return b < 0x80 }

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func schemaAdapter(cfg TransportConfig) schema {
	return schema{wsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(topic string) string { return MessagesTable(cfg.TablePrefix, topic) },
		// The payload is the CloudEvent, a JSON object: JSON (not JSONB)
		// keeps its text as it was published and lets an operator read
		// and insert rows with plain SQL.
		SubscribeBatchSize: cfg.BatchSize,
	}}
}

// schema is watermill-sql's default PostgreSQL schema, reading every row.
type schema struct {
	wsql.DefaultPostgreSQLSchema
}

var _ wsql.SchemaAdapter = schema{}

// UnmarshalMessage reads a row as the default schema does, except that a
// row whose metadata is not a JSON object of strings (inserted by hand) is
// delivered marked unreadable (see framework.MetadataUnreadable), to be
// dead-lettered, instead of failing the query: watermill-sql would retry
// that query forever and the consumer group would never move past it.
func (s schema) UnmarshalMessage(p wsql.UnmarshalMessageParams) (wsql.Row, error) {
	var (
		r   wsql.Row
		xid wsql.XID8
	)
	if err := p.Row.Scan(&r.Offset, &xid, &r.UUID, &r.Payload, &r.Metadata); err != nil {
		return wsql.Row{}, fmt.Errorf("scan message row: %w", err)
	}
	r.Msg = storedmsg.Message(string(r.UUID), r.Payload, r.Metadata)
	r.ExtraData = map[string]any{"transaction_id": xid}
	return r, nil
}

func offsetsAdapter(cfg TransportConfig) wsql.DefaultPostgreSQLOffsetsAdapter {
	return wsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string { return OffsetsTable(cfg.TablePrefix, topic) },
	}
}

// publisher publishes messages into the topic's table, creating the table
// on first use. It may share the stores' pool.
type publisher struct {
	pub     *wsql.Publisher
	buckets *bucketTopics
	// insert bounds each insert (see bound.Statement): queryTimeout at
	// first, up to maxQueryTimeout.
	insert *bound.Statement
}

var _ message.Publisher = (*publisher)(nil)

// newPublisher returns a publisher on db.
func newPublisher(db *sqlx.DB, cfg TransportConfig) (*publisher, error) {
	if db == nil {
		return nil, errors.New("postgres: missing database (open it with postgres.Open)")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	buckets := &bucketTopics{db: db, cfg: cfg, topics: make(map[string]bucketState)}
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db.DB), wsql.PublisherConfig{
		SchemaAdapter:        publisherSchema{schema: schemaAdapter(cfg), buckets: buckets},
		AutoInitializeSchema: true,
	}, watermilllog.New(cfg.Logger))
	if err != nil {
		return nil, fmt.Errorf("postgres: publisher: %w", err)
	}
	return &publisher{pub: pub, buckets: buckets, insert: bound.New(queryTimeout, maxQueryTimeout)}, nil
}

// uuidNamespace derives the UUIDs that replace over-long message UUIDs.
var uuidNamespace = uuid.MustParse("6f1f3a52-4c0e-4b8e-9a57-6a3c2e4f9d10")

// Publish inserts msgs into topic's table in one statement, each row with
// its bucket (see publisherSchema), within the first message's context
// and a bound of its own: an insert whose request or answer was lost on
// its way (the connection still open) fails after 3 s, and each one cut
// short doubles the next one's bound, up to a minute, so that an insert
// slow on its own is not cut short for ever. A message UUID longer than
// MaxUUIDLength is replaced by a UUID derived from it, and the redelivery
// marker of an earlier delivery is dropped.
func (p *publisher) Publish(topic string, msgs ...*message.Message) error {
	ctx := contextOf(msgs)
	p.buckets.prepare(ctx, topic)
	if len(msgs) == 0 {
		return nil
	}
	// watermill-sql inserts within the first message's context: a copy
	// of it carries the bound, the caller's message keeps its own.
	ictx, cancel := p.insert.Context(ctx)
	defer cancel()
	out := make([]*message.Message, len(msgs))
	for i, msg := range msgs {
		_, marked := msg.Metadata[framework.MetadataRedelivered]
		if i > 0 && len(msg.UUID) <= MaxUUIDLength && !marked {
			out[i] = msg
			continue
		}
		m, mctx := msg.Copy(), msg.Context()
		if i == 0 {
			mctx = ictx
		}
		m.SetContext(mctx)
		if len(m.UUID) > MaxUUIDLength {
			m.UUID = uuid.NewSHA1(uuidNamespace, []byte(msg.UUID)).String()
		}
		delete(m.Metadata, framework.MetadataRedelivered)
		out[i] = m
	}
	if err := p.insert.Record(ctx, ictx, p.pub.Publish(topic, out...)); err != nil {
		return fmt.Errorf("postgres: publish to %s: %w", topic, err)
	}
	return nil
}

// Replay publishes msgs to the replay topic of consumer (pipeline.ReplayTopic).
func (p *publisher) Replay(ctx context.Context, consumer string, msgs ...*message.Message) error {
	topic := pipeline.ReplayTopic(consumer)
	return replay.Publish(ctx, func(m *message.Message) error { return p.Publish(topic, m) }, msgs...)
}

// Close closes the publisher; the pool stays open.
func (p *publisher) Close() error { return p.pub.Close() }
