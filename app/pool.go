package app

import (
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/driver"
)

// poolUse is one part of what may hold a connection of the stores' pool
// at once.
type poolUse struct {
	what  string
	conns int
}

// attempts is what a consumer's attempts may hold at once: a connection
// per message in flight (the transport's Subscription.Conns, summed over
// the consumer's subscriptions), or under group commit one per batch, and
// on PostgreSQL one per attempt that overlaps (middleware.Settings.Overlap).
type attempts struct {
	consumer string
	inFlight int
}

// subscriptions is the transport the runner subscribes the consumers
// through: it records what each subscription may hold of the stores'
// pool, as the transport says (driver.Subscription.Conns and
// SubscriberConns).
type subscriptions struct {
	driver.Transport
	shared   sharesDB
	attempts []attempts // in the order the consumers subscribed
	uses     []poolUse  // the subscribers'
}

// Subscribe subscribes through the transport and records the
// subscription's connections.
func (s *subscriptions) Subscribe(cfg driver.SubscribeConfig) (driver.Subscription, error) {
	sub, err := s.Transport.Subscribe(cfg)
	if err != nil {
		return sub, err
	}
	if n := len(s.attempts); n > 0 && s.attempts[n-1].consumer == cfg.Consumer {
		s.attempts[n-1].inFlight += sub.Conns
	} else {
		s.attempts = append(s.attempts, attempts{consumer: cfg.Consumer, inFlight: sub.Conns})
	}
	if s.shared && sub.SubscriberConns > 0 {
		s.uses = append(s.uses, poolUse{what: "consumer " + cfg.Consumer + "'s subscriber", conns: sub.SubscriberConns})
	}
	return sub, nil
}

// poolUses lists what may hold a connection of the stores' pool at once:
// the consumers' attempts and subscribers (recorded by subs), then the
// outbox relay,
// one, and one more for the transport's publisher when it writes to this
// database (the relay's batch transaction on PostgreSQL stays open while
// it publishes); the replay relay, one (it publishes between its
// statements); the readiness check's ping, when HTTP is on; the purger.
func (c Config) poolUses(subs *subscriptions) []poolUse {
	var uses []poolUse
	for _, a := range subs.attempts {
		conns := a.inFlight
		if cc := c.Settings(a.consumer); cc.BatchSize > 1 {
			held := cc.Batches
			if isPostgresURL(c.DatabaseURL) && cc.Overlap > 1 {
				// While its handlers wait outside the database, up to
				// Overlap attempts run alone beside the batches (see
				// driver.UnitOfWork).
				held += cc.Overlap
			}
			conns = min(conns, held)
		}
		uses = append(uses, poolUse{what: "consumer " + a.consumer, conns: conns})
	}
	uses = append(uses, subs.uses...)
	relay := 1
	if subs.shared {
		relay = 2
	}
	uses = append(uses, poolUse{what: "outbox relay", conns: relay}, poolUse{what: "replay relay", conns: 1})
	if c.HTTPAddr != "" {
		uses = append(uses, poolUse{what: "readiness check", conns: 1})
	}
	return append(uses, poolUse{what: "purger", conns: 1})
}

// sizePool sizes the pool of db, the stores' database, once the consumers
// subscribed through subs: DatabaseMaxConns when set, else what they and
// the background work may hold at once (see poolUses), or the pool db was
// opened with (the driver's default) when it is larger. A pool smaller
// than that need would starve itself: attempts beyond it wait for a
// connection, in no particular order, and may time out. So a
// DatabaseMaxConns below it is an error that names the key, the need and
// what makes it up.
func (c Config) sizePool(db *sqlx.DB, subs *subscriptions) error {
	uses := c.poolUses(subs)
	need := 0
	parts := make([]string, 0, len(uses))
	for _, u := range uses {
		need += u.conns
		parts = append(parts, fmt.Sprintf("%s %d", u.what, u.conns))
	}
	if c.DatabaseMaxConns != 0 {
		if c.DatabaseMaxConns < need {
			return fmt.Errorf("configuration: database_max_conns: %d is fewer than the %d connections the service may hold at once (%s): raise it, or lower the consumers' concurrency, batches or overlap",
				c.DatabaseMaxConns, need, strings.Join(parts, ", "))
		}
		return nil // db was opened with it
	}
	if size := db.Stats().MaxOpenConnections; need > size {
		db.SetMaxOpenConns(need)
		db.SetMaxIdleConns(need)
	}
	return nil
}
