package sqlite

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/effectively-once/effectively/framework/internal/sqlstore"
)

// The SQLite Pub/Sub is the embedded default transport: a watermill
// Publisher and Subscriber over the tables of one SQLite file. Publishers
// append rows to a messages table; each consumer group of a topic claims
// messages with leases (one row per group and message in flight), hands
// them to the router, and deletes the lease when the message is acked. No
// transaction stays open while a handler runs, so the handler's own
// BEGIN IMMEDIATE transaction on the same file never waits for the
// transport. docs/transports.md describes the tables so that another
// program can publish by hand.

// ErrPublisherClosed is returned by Publish after Close.
var ErrPublisherClosed = errors.New("sqlite: publisher is closed")

// ErrSubscriberClosed is returned by Subscribe after Close.
var ErrSubscriberClosed = errors.New("sqlite: subscriber is closed")

// ErrEmptyTopic is returned by Publish and Subscribe for an empty topic.
var ErrEmptyTopic = errors.New("sqlite: empty topic name")

// validatePubSubPrefix checks a TablePrefix as the stores' prefix is
// checked: the two share a file.
func validatePubSubPrefix(config, prefix string) error {
	if err := sqlstore.ValidatePrefix(prefix); err != nil {
		return fmt.Errorf("sqlite: %s.TablePrefix: %w", config, err)
	}
	return nil
}

// pubsubLogger returns l, or a logger that discards everything when l is
// nil.
func pubsubLogger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// Notifier wakes the subscriptions of this process as soon as a publisher
// of this process commits messages to their topic, so that they need not
// wait for their next poll. Give the same Notifier to the PublisherConfig
// and SubscriberConfig of every Publisher and Subscriber on one file.
// Messages published by other processes are found by polling.
//
// The zero value is not usable; a nil *Notifier is, and wakes nobody.
type Notifier struct {
	mu     sync.Mutex
	topics map[string]map[chan struct{}]struct{}
}

// NewNotifier returns a Notifier with no subscriptions.
func NewNotifier() *Notifier {
	return &Notifier{topics: make(map[string]map[chan struct{}]struct{})}
}

// Notify wakes every subscription of topic registered with n. It never
// blocks: a subscription that has a wake-up pending is not woken twice.
func (n *Notifier) Notify(topic string) {
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch := range n.topics[topic] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// listen registers a subscription of topic. The returned channel receives a
// value after each Notify of topic; stop unregisters it.
func (n *Notifier) listen(topic string) (wake <-chan struct{}, stop func()) {
	ch := make(chan struct{}, 1)
	if n == nil {
		return ch, func() {}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	set, ok := n.topics[topic]
	if !ok {
		set = make(map[chan struct{}]struct{})
		n.topics[topic] = set
	}
	set[ch] = struct{}{}
	return ch, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		delete(n.topics[topic], ch)
		if len(n.topics[topic]) == 0 {
			delete(n.topics, topic)
		}
	}
}
