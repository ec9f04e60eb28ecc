package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// TablePrefix is put before the name of every table of the Pub/Sub. It
	// must match ^[a-z_][a-z0-9_]*$. Defaults to empty.
	TablePrefix string
	// SkipSchemaInit leaves creating the tables to InitializePubSubSchema
	// or a migration. Defaults to false: the first Publish creates them
	// when they are missing.
	SkipSchemaInit bool
	// Notifier, when set, wakes the subscriptions of this process that
	// share it as soon as a Publish commits. Defaults to nil: subscribers
	// find new messages when they poll.
	Notifier *Notifier
	// Logger receives the publisher's logs. Defaults to nil: quiet.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c PublisherConfig) WithDefaults() PublisherConfig {
	c.Logger = pubsubLogger(c.Logger)
	return c
}

// Validate reports the first invalid field of c.
func (c PublisherConfig) Validate() error {
	return validatePubSubPrefix("PublisherConfig", c.TablePrefix)
}

// Publisher appends messages to the messages table of a SQLite file. It is
// safe for concurrent use. It starts no goroutines.
type Publisher struct {
	db     *sqlx.DB
	cfg    PublisherConfig
	q      pubsubQueries
	schema *pubsubSchemaOnce

	mu     sync.RWMutex // held for reading by every Publish, for writing by Close
	closed bool
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher that writes to db, which should come
// from Open (WAL, busy timeout, BEGIN IMMEDIATE).
func NewPublisher(db *sqlx.DB, cfg PublisherConfig) (*Publisher, error) {
	if db == nil {
		return nil, ErrMissingDB
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Publisher{
		db:     db,
		cfg:    cfg,
		q:      newPubSubQueries(cfg.TablePrefix),
		schema: newPubSubSchemaOnce(cfg.SkipSchemaInit),
	}, nil
}

// Publish appends msgs to topic in one transaction: all of them are stored,
// or none. The context of the first message bounds the write. Each
// message's UUID, payload and metadata are stored as they are.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if topic == "" {
		return ErrEmptyTopic
	}
	if len(msgs) == 0 {
		return nil
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrPublisherClosed
	}
	ctx := msgs[0].Context()
	if err := p.schema.ensure(ctx, p.db, p.q); err != nil {
		return err
	}
	if err := p.insert(ctx, topic, msgs); err != nil {
		return fmt.Errorf("publish to %s: %w", topic, err)
	}
	p.cfg.Notifier.Notify(topic)
	return nil
}

func (p *Publisher) insert(ctx context.Context, topic string, msgs []*message.Message) error {
	tx, err := p.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	stmt, err := tx.PrepareContext(ctx, p.q.insert)
	if err != nil {
		return fmt.Errorf("prepare insert: %w", err)
	}
	defer stmt.Close()
	now := time.Now().UnixMilli()
	for _, msg := range msgs {
		metadata, err := json.Marshal(msg.Metadata)
		if err != nil {
			return fmt.Errorf("encode metadata of %s: %w", msg.UUID, err)
		}
		if msg.Metadata == nil {
			metadata = []byte("{}")
		}
		payload := msg.Payload
		if payload == nil {
			payload = []byte{}
		}
		if _, err := stmt.ExecContext(ctx, topic, msg.UUID, payload, string(metadata), now); err != nil {
			return fmt.Errorf("insert %s: %w", msg.UUID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// Close makes later Publish calls fail and waits for the running ones. It
// is idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}
