package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/subscribers"
)

// spareSubscriberConns is how many connections the subscribers' pool
// holds beyond one per subscription.
const spareSubscriberConns = 2

// Transport is the PostgreSQL transport (driver.Transport):
// watermill-sql's publisher on the database handed to New, and a
// subscriber per consumer, of this package, on a pool of their own.
//
// A consumer has one subscription per event type and one for its replay
// topic, each handing out up to its concurrency of messages at once. Each
// subscription holds one connection of the subscribers' pool (for its
// group's lock, its reads and its acknowledgements; no transaction stays
// open while a message is handled), so that pool grows by a connection
// per subscription (two to spare), and the handlers' transactions and the
// dead-letter writes on the stores' pool never wait for them.
type Transport struct {
	cfg   TransportConfig
	db    *sqlx.DB // the publisher's, where the purge deletes
	pub   *publisher
	subDB *sqlx.DB // nil without TransportConfig.URL

	mu    sync.Mutex
	conns int // subscriptions so far, plus the spare
	subs  subscribers.Set
}

var _ driver.Transport = (*Transport)(nil)

// New returns the transport that publishes on db, which may be the
// stores' pool, and, when cfg.URL is set, opens the subscribers' pool
// there. Close closes that pool and leaves db open.
func New(ctx context.Context, db *sqlx.DB, cfg TransportConfig) (*Transport, error) {
	pub, err := newPublisher(db, cfg)
	if err != nil {
		return nil, err
	}
	t := &Transport{cfg: cfg.WithDefaults(), db: db, pub: pub, conns: spareSubscriberConns}
	if cfg.URL != "" {
		t.subDB, err = Open(ctx, cfg.URL, OpenConfig{MaxOpenConns: t.conns, ApplicationName: cfg.ApplicationName})
		if err != nil {
			_ = pub.Close()
			return nil, fmt.Errorf("postgres: TransportConfig.URL: subscribers' pool: %w", err)
		}
	}
	return t, nil
}

// Publisher returns the transport's publisher.
func (t *Transport) Publisher() message.Publisher { return t.pub }

// Subscribe returns a new subscriber of sc.Consumer's group, with the
// ack deadline ackDeadlineFor(sc.HandlingTime) when that is set, and
// grows the subscribers' pool by its subscriptions. With sc.Partitions
// above 1 the subscriber is a driver.Assigner: each subscription reads
// the partitions assigned, all of them on its one connection.
func (t *Transport) Subscribe(sc driver.SubscribeConfig) (driver.Subscription, error) {
	sc = sc.WithDefaults()
	if err := sc.Validate(); err != nil {
		return driver.Subscription{}, fmt.Errorf("postgres: %w", err)
	}
	if t.subDB == nil {
		return driver.Subscription{}, errors.New("postgres: Subscribe: TransportConfig.URL: required to subscribe")
	}
	cfg := t.cfg
	if sc.HandlingTime > 0 {
		cfg.AckDeadline = ackDeadlineFor(sc.HandlingTime)
	}
	sub, err := newSubscriber(t.subDB, sc.Consumer, sc.Concurrency, cfg)
	if err != nil {
		return driver.Subscription{}, fmt.Errorf("postgres: consumer %s: %w", sc.Consumer, err)
	}
	sub.settles = sc.Settles
	sub.hold = sc.Hold
	sub.partitions = sc.Partitions
	var subscriber message.Subscriber = sub
	if sub.partitioned() {
		subscriber = partitionedSubscriber{sub}
	}
	topics := append(append([]string(nil), sc.Types...), sc.ReplayTopics()...)
	t.subs.Add(sub)
	t.mu.Lock()
	t.conns += len(topics)
	t.subDB.SetMaxOpenConns(t.conns)
	t.subDB.SetMaxIdleConns(t.conns)
	t.mu.Unlock()
	// Each topic's subscription hands out up to sc.Concurrency messages,
	// each holding its attempt's connection; the subscribers' own
	// connections are in their pool, not the database given to New.
	return driver.Subscription{Subscriber: subscriber, Topics: topics, Bind: sc.Types, Conns: len(topics) * sc.Concurrency}, nil
}

// Replay publishes msgs to the replay topic of consumer (see
// pipeline.ReplayTopic).
func (t *Transport) Replay(ctx context.Context, consumer string, msgs ...*message.Message) error {
	return t.pub.Replay(ctx, consumer, msgs...)
}

// Ready reports true: the pools reconnect by themselves.
func (t *Transport) Ready() bool { return true }

// Close closes the subscribers, the publisher and the subscribers' pool.
func (t *Transport) Close() error {
	if t.subDB == nil {
		return t.subs.Close(t.pub)
	}
	return t.subs.Close(t.pub, t.subDB)
}

// ackDeadlineFor returns the ack deadline of a consumer's messages whose
// healthy handling takes at most handling (attempts × (timeout + delay)).
// It is not renewed, so it outlasts that by a quarter and a second. It
// runs from the message's hand-out, so the concurrency does not count.
func ackDeadlineFor(handling time.Duration) time.Duration {
	return handling + handling/4 + time.Second
}
