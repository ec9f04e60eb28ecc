package sqlite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

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
//
// Messages that other processes insert are seen by a watch that reads the
// newest offset of the messages table every SubscriberConfig.WatchInterval
// and wakes every subscription when it grew. The Subscribers that share a
// Notifier and a db share one watch, running while any of them has
// subscribed and is not closed.
//
// The zero value is not usable; a nil *Notifier is, and wakes nobody.
type Notifier struct {
	mu      sync.Mutex
	topics  map[string]map[chan struct{}]struct{}
	watches map[watchKey]*watch
}

// watchKey is what one watch reads: a messages table through a pool.
type watchKey struct {
	db    *sqlx.DB
	query string // reads the newest offset of the table
}

// watch is a running watch and the Subscribers that use it.
type watch struct {
	users int
	stop  context.CancelFunc
	done  chan struct{}
}

// NewNotifier returns a Notifier with no subscriptions.
func NewNotifier() *Notifier {
	return &Notifier{
		topics:  make(map[string]map[chan struct{}]struct{}),
		watches: make(map[watchKey]*watch),
	}
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

// notifyAll wakes every subscription registered with n.
func (n *Notifier) notifyAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, set := range n.topics {
		for ch := range set {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// watch starts the watch of the messages table whose newest offset query
// reads on db, or joins it when it runs already, and returns leave, which
// stops it (and waits for it) once every user left.
func (n *Notifier) watch(db *sqlx.DB, query string, interval time.Duration, log *slog.Logger) (leave func()) {
	key := watchKey{db: db, query: query}
	n.mu.Lock()
	defer n.mu.Unlock()
	w, ok := n.watches[key]
	if !ok {
		ctx, stop := context.WithCancel(context.Background())
		w = &watch{stop: stop, done: make(chan struct{})}
		n.watches[key] = w
		go func() {
			defer close(w.done)
			watchNewest(ctx, db, query, interval, log, n.notifyAll)
		}()
	}
	w.users++
	var once sync.Once
	return func() {
		once.Do(func() {
			n.mu.Lock()
			w.users--
			last := w.users == 0
			if last {
				delete(n.watches, key)
			}
			n.mu.Unlock()
			if last {
				w.stop()
				<-w.done
			}
		})
	}
}

// watchNewest reads the newest offset with query every interval until
// ctx ends, and calls wake when it grew: some process inserted a message.
// Offsets only grow (AUTOINCREMENT) and are given in commit order, so the
// first read after an insert's commit sees it. A failing read is logged
// once until one succeeds again; the subscriptions' poll finds the
// messages meanwhile.
func watchNewest(ctx context.Context, db *sqlx.DB, query string, interval time.Duration, log *slog.Logger, wake func()) {
	// Prepared once; each read uses a context without cancellation, so
	// that database/sql starts no goroutine to watch it: the read takes
	// microseconds, and the loop checks ctx between reads.
	var stmt *sqlx.Stmt
	defer func() {
		if stmt != nil {
			_ = stmt.Close()
		}
	}()
	read := context.WithoutCancel(ctx)
	t := time.NewTicker(interval)
	defer t.Stop()
	var seen int64
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var (
			newest int64
			err    error
		)
		if stmt == nil {
			stmt, err = db.PreparexContext(read, query)
		}
		if err == nil {
			err = stmt.QueryRowxContext(read).Scan(&newest)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !failing {
				log.Warn("sqlite pubsub: watch for new messages failed; subscriptions find them when they poll", slog.Any("error", err))
			}
			failing = true
			continue
		}
		failing = false
		if newest > seen {
			seen = newest
			wake()
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
