package outbox

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/effectively-once/effectively/framework/internal/sqlstore"
)

// unroutable is what a relay knows of the event types that its broker
// routes nowhere (driver.ErrUnroutable: no queue bound to the type's
// exchange), or whose topic it refuses (driver.ErrTopicRefused: the
// exchange cannot be declared). The rows of such a type stay unsent and the relay's claims
// leave them out, so that they do not hold up the rows of other types,
// but for the oldest of each, tried again at the first batch of every
// poll: once a queue is bound it goes out, and the rest follow. A type
// of RelayConfig.DropUnroutable is dropped instead: its rows are marked
// sent, and counted. It is kept in memory: a relay that starts tries
// every unsent row once.
type unroutable struct {
	drop    map[string]bool
	metrics *Metrics
	logger  *slog.Logger

	mu       sync.Mutex
	types    map[string]struct{} // whose rows wait
	reported map[string]struct{} // whose gauge is not zero
}

func newUnroutable(drop []string, m *Metrics, logger *slog.Logger) *unroutable {
	u := &unroutable{drop: map[string]bool{}, metrics: m, logger: logger, types: map[string]struct{}{}, reported: map[string]struct{}{}}
	for _, t := range drop {
		u.drop[t] = true
	}
	return u
}

// skip returns the types a claim leaves out; with probe, the oldest row
// of each is claimed still.
func (u *unroutable) skip(probe bool) sqlstore.Skip {
	u.mu.Lock()
	defer u.mu.Unlock()
	return sqlstore.Skip{Types: slices.Sorted(maps.Keys(u.types)), Probe: probe}
}

// routed records that the broker routed a row of typ.
func (u *unroutable) routed(typ string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.types, typ)
}

// returned records that the broker routed a row of typ nowhere, and
// reports whether the row is dropped (marked sent) rather than left
// unsent.
func (u *unroutable) returned(typ string) (drop bool) {
	if u.drop[typ] {
		if u.metrics != nil {
			u.metrics.dropped.WithLabelValues(typ).Inc()
		}
		return true
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.types[typ] = struct{}{}
	return false
}

// refused records that the broker refused the topic of typ
// (driver.ErrTopicRefused): its rows wait as those of a type routed
// nowhere do, never dropped, and the first refusal is logged with err.
func (u *unroutable) refused(ctx context.Context, typ string, err error) {
	u.mu.Lock()
	_, known := u.types[typ]
	u.types[typ] = struct{}{}
	u.mu.Unlock()
	if !known {
		u.logger.WarnContext(ctx, "outbox relay: the broker refuses the topic of an event type; its rows wait, tried again at each poll, and the other types' rows go on",
			"type", typ, "error", err)
	}
}

// report counts the unsent rows of each type the broker routes nowhere,
// sets the gauge of each (zero for those it routes again), and logs them.
func (r *Relay) reportUnroutable(ctx context.Context) {
	u := r.unroutable
	types := u.skip(false).Types
	u.mu.Lock()
	stale := slices.Collect(maps.Keys(u.reported))
	u.mu.Unlock()
	if len(types) == 0 && len(stale) == 0 {
		return
	}
	counts, err := r.sql.UnsentOf(ctx, r.db, types)
	if err != nil {
		r.cfg.Logger.ErrorContext(ctx, "outbox relay: count the rows of event types no queue is bound to", "error", err)
		return
	}
	for _, typ := range types {
		r.cfg.Logger.WarnContext(ctx, "outbox relay: no queue is bound to the event type's exchange; its rows wait unsent and are tried again at each poll (RelayConfig.DropUnroutable drops them instead)",
			"type", typ, "rows", counts[typ])
	}
	m := r.cfg.Metrics
	if m == nil {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, typ := range stale {
		if _, ok := u.types[typ]; !ok {
			m.unroutable.WithLabelValues(typ).Set(0)
			delete(u.reported, typ)
		}
	}
	for _, typ := range types {
		m.unroutable.WithLabelValues(typ).Set(float64(counts[typ]))
		u.reported[typ] = struct{}{}
	}
}
