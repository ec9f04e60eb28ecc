package app

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/framework/sqlite"
)

// Transport is the broker side of the application: one publisher, and a
// subscriber per consumer.
type Transport struct {
	// Publisher publishes events to their type's topic.
	Publisher message.Publisher

	subscriber func(consumer string, cc ConsumerConfig) (message.Subscriber, error)
	// subscriptions is how many router handlers each event type of a
	// consumer gets.
	subscriptions func(cc ConsumerConfig) int
}

// Subscriber returns the subscriber of consumer, whose consumer group (or
// queue) is named after it.
func (t *Transport) Subscriber(consumer string, cc ConsumerConfig) (message.Subscriber, error) {
	return t.subscriber(consumer, cc)
}

// TransportParams are what NewTransport takes from fx.
type TransportParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Config    Config
	DB        *sqlx.DB
	Logger    *slog.Logger `optional:"true"`
}

// NewTransport builds the configured transport and closes it when the
// application stops.
func NewTransport(p TransportParams) (*Transport, error) {
	logger := p.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	switch p.Config.Transport {
	case TransportMemory:
		ch := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NewSlogLogger(logger))
		p.Lifecycle.Append(fx.StopHook(ch.Close))
		return &Transport{
			Publisher:     ch,
			subscriber:    func(string, ConsumerConfig) (message.Subscriber, error) { return ch, nil },
			subscriptions: func(ConsumerConfig) int { return 1 },
		}, nil
	case TransportSQLite:
		return newSQLiteTransport(p, logger)
	}
	return nil, fmt.Errorf("EFFECTIVELY_TRANSPORT: %q is not available", p.Config.Transport)
}

func newSQLiteTransport(p TransportParams, logger *slog.Logger) (*Transport, error) {
	db := p.DB
	if p.Config.TransportURL != p.Config.DatabaseURL {
		var err error
		db, err = sqlite.Open(context.Background(), p.Config.TransportURL, sqlite.OpenConfig{})
		if err != nil {
			return nil, fmt.Errorf("transport database: %w", err)
		}
		p.Lifecycle.Append(fx.StopHook(db.Close))
	}
	notifier := sqlite.NewNotifier()
	pub, err := sqlite.NewPublisher(db, sqlite.PublisherConfig{TablePrefix: p.Config.TablePrefix, Notifier: notifier, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	p.Lifecycle.Append(fx.StopHook(pub.Close))
	return &Transport{
		Publisher: pub,
		subscriber: func(consumer string, cc ConsumerConfig) (message.Subscriber, error) {
			sub, err := sqlite.NewSubscriber(db, sqlite.SubscriberConfig{
				ConsumerGroup: consumer,
				TablePrefix:   p.Config.TablePrefix,
				Notifier:      notifier,
				LeaseDuration: leaseFor(cc),
				MaxInFlight:   cc.Concurrency,
				Logger:        logger,
			})
			if err != nil {
				return nil, fmt.Errorf("transport: consumer %s: %w", consumer, err)
			}
			p.Lifecycle.Append(fx.StopHook(sub.Close))
			return sub, nil
		},
		// One subscription per type; the subscriber holds Concurrency
		// leases in flight.
		subscriptions: func(ConsumerConfig) int { return 1 },
	}, nil
}

// leaseFor returns a lease that outlasts the whole handling of a healthy
// message, including the wait for the file's write lock behind the other
// messages in flight: concurrency × attempts × (timeout + delay), plus a
// quarter and a second.
func leaseFor(cc ConsumerConfig) time.Duration {
	budget := time.Duration(cc.Concurrency*cc.Attempts) * (time.Duration(cc.Timeout) + time.Duration(cc.RetryDelay))
	return budget + budget/4 + time.Second
}
