package app

import (
	"fmt"
	"strings"

	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/handlers"
)

// poolUse is one part of what may hold a connection of the stores' pool
// at once.
type poolUse struct {
	what  string
	conns int
}

// poolUses lists what may hold a connection of the pool of DatabaseURL at
// once, with the consumers declared:
//   - each message in flight holds one at a time: its attempt's
//     transaction, and before it the delivery guard's count, after it its
//     dead letter. How many are in flight depends on the transport (see
//     Transport): amqp, concurrency; sqlite, concurrency per subscription;
//     postgres and memory, one per subscription. A consumer has one
//     subscription per route (handlers.On, handlers.Upcast) and one for
//     its replay topic;
//   - the outbox relay, one, and one more for the SQL transport's
//     publisher when it writes to this database (the relay's batch
//     transaction on PostgreSQL stays open while it publishes);
//   - the SQLite transport in this database: one per subscription for its
//     claims and acks, one per consumer for its cleanup, one for the watch
//     of new messages;
//   - the readiness check's ping, when HTTP is on; the purger, when
//     processed marks are purged.
//
// The PostgreSQL transport's subscribers have a pool of their own.
func (c Config) poolUses(declared []handlers.Declaration) []poolUse {
	var uses []poolUse
	sqlTransportHere := (c.Transport == TransportSQLite || c.Transport == TransportPostgres) && c.TransportURL == c.DatabaseURL
	for _, d := range declared {
		cc := c.Consumer(d.Name)
		subscriptions := d.Handlers + 1
		var n int
		switch c.Transport {
		case TransportAMQP:
			n = max(cc.Concurrency, 1)
		case TransportSQLite:
			n = subscriptions * cc.Concurrency
		default:
			n = subscriptions
		}
		uses = append(uses, poolUse{what: "consumer " + d.Name, conns: n})
		if c.Transport == TransportSQLite && sqlTransportHere {
			uses = append(uses, poolUse{what: "consumer " + d.Name + "'s claims, acks and cleanup", conns: subscriptions + 1})
		}
	}
	if c.Transport == TransportSQLite && sqlTransportHere {
		uses = append(uses, poolUse{what: "watch of new messages", conns: 1})
	}
	relay := 1
	if sqlTransportHere {
		relay = 2
	}
	uses = append(uses, poolUse{what: "outbox relay", conns: relay})
	if c.HTTPAddr != "" {
		uses = append(uses, poolUse{what: "readiness check", conns: 1})
	}
	if c.ProcessedRetention > 0 {
		uses = append(uses, poolUse{what: "purger", conns: 1})
	}
	return uses
}

// DatabasePoolSize returns the size of the connection pool of DatabaseURL
// with the consumers declared: DatabaseMaxConns when set, else what they
// and the background work may hold at once (a message in flight holds
// one connection, its attempt's transaction; the outbox relay, the
// readiness check, the purger and the SQLite transport's claims hold the
// others), or the driver's default pool (postgres.DefaultMaxOpenConns,
// sqlite.DefaultMaxOpenConns) when it is larger. A pool smaller than that
// need would starve itself: attempts beyond it wait for a connection, in
// no particular order, and may time out. So a DatabaseMaxConns below it
// is an error that names the key, the need and what makes it up.
func (c Config) DatabasePoolSize(declared []handlers.Declaration) (int, error) {
	uses := c.poolUses(declared)
	need := 0
	parts := make([]string, 0, len(uses))
	for _, u := range uses {
		need += u.conns
		parts = append(parts, fmt.Sprintf("%s %d", u.what, u.conns))
	}
	if c.DatabaseMaxConns == 0 {
		return max(need, c.driverPoolSize()), nil
	}
	if c.DatabaseMaxConns < need {
		return 0, fmt.Errorf("database_max_conns: %d is fewer than the %d connections the service may hold at once (%s): raise it, or lower the consumers' concurrency",
			c.DatabaseMaxConns, need, strings.Join(parts, ", "))
	}
	return c.DatabaseMaxConns, nil
}

// driverPoolSize is the default pool of DatabaseURL's driver.
func (c Config) driverPoolSize() int {
	if isPostgresURL(c.DatabaseURL) {
		return postgres.DefaultMaxOpenConns
	}
	return sqlite.DefaultMaxOpenConns
}
