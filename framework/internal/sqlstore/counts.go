package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/effectively-once/effectively/framework"
)

// maxCountsPerStatement bounds how many deliveries one statement counts.
const maxCountsPerStatement = 64

// counts gathers the delivery counts asked for at once into one statement
// (group commit of the delivery guard's counts): a transport that cannot
// tell a first delivery from a redelivery has every delivery counted, in a
// transaction of its own, before its attempt. Like the unit of work's
// batches it has no goroutine: the first caller to find no statement
// running runs one for every count waiting, then hands the next statement
// to a caller still waiting.
type counts struct {
	mu      sync.Mutex
	running bool
	waiting []*countCall
}

// countCall is one call of Count, and its result once counted.
type countCall struct {
	ctx      context.Context
	consumer string
	key      framework.Key
	first    int
	n        int
	err      error
	done     chan struct{}
	lead     chan []*countCall
}

// count counts c's delivery with s, in a statement shared with the other
// counts asked for meanwhile, and returns once it committed.
func (cs *counts) count(s *Store, c *countCall) {
	c.done, c.lead = make(chan struct{}), make(chan []*countCall, 1)
	cs.mu.Lock()
	cs.waiting = append(cs.waiting, c)
	var batch []*countCall
	if !cs.running {
		cs.running = true
		batch = cs.take()
	}
	cs.mu.Unlock()
	if batch != nil {
		batch[0].lead <- batch
	}
	for {
		select {
		case <-c.done:
			return
		case batch := <-c.lead:
			s.countAll(batch)
			for _, b := range batch {
				close(b.done)
			}
			cs.mu.Lock()
			next := cs.take()
			if next == nil {
				cs.running = false
			}
			cs.mu.Unlock()
			if next != nil {
				next[0].lead <- next
			}
		}
	}
}

// take removes the next statement's counts from the waiting ones: up to
// maxCountsPerStatement, each (consumer, key) once (a repeat waits for the
// next statement: one statement cannot update a row twice). Call it with
// cs.mu held.
func (cs *counts) take() []*countCall {
	if len(cs.waiting) == 0 {
		return nil
	}
	type id struct {
		consumer string
		key      framework.Key
	}
	seen := make(map[id]bool)
	var batch, rest []*countCall
	for _, c := range cs.waiting {
		k := id{c.consumer, c.key}
		if seen[k] || len(batch) == maxCountsPerStatement {
			rest = append(rest, c)
			continue
		}
		seen[k] = true
		batch = append(batch, c)
	}
	cs.waiting = rest
	return batch
}

// countAll counts batch's deliveries in one statement and sets each call's
// result. The statement runs under the first call's context, without its
// end: a caller that gives up does not fail the others'.
func (s *Store) countAll(batch []*countCall) {
	fail := func(err error) {
		for _, c := range batch {
			c.err = fmt.Errorf("count delivery of %s to %s: %w", c.key, c.consumer, err)
		}
	}
	// The statement runs without its callers' end, so on PostgreSQL
	// under the store's bound (see Store.bounded): one whose request or
	// answer the network lost would hold every count of the process
	// behind it for ever.
	type id struct {
		consumer string
		key      framework.Key
	}
	got := make(map[id]int, len(batch))
	err := s.bounded(context.WithoutCancel(batch[0].ctx), func(ctx context.Context) error {
		rows, err := s.countRows(ctx, batch)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				k id
				n int
			)
			if err := rows.Scan(&k.consumer, &k.key.Source, &k.key.ID, &n); err != nil {
				return err
			}
			got[k] = n
		}
		return rows.Err()
	})
	if err != nil {
		fail(err)
		return
	}
	for _, c := range batch {
		n, ok := got[id{c.consumer, c.key}]
		if !ok {
			c.err = fmt.Errorf("count delivery of %s to %s: no count returned", c.key, c.consumer)
			continue
		}
		c.n = n
	}
}

// countRows upserts the counts of batch and returns the rows counted
// (consumer, source, event_id, count). Like Store.markRows it runs one
// statement whatever the batch's size, with the counts as a JSON array on
// SQLite and as arrays on PostgreSQL, and a statement of the batch's own
// size on SQLite for keys JSON cannot carry.
func (s *Store) countRows(ctx context.Context, batch []*countCall) (*sql.Rows, error) {
	at := s.dialect.timeArg(s.now())
	if s.dialect == Postgres {
		consumers, sources, ids := make([]string, len(batch)), make([]string, len(batch)), make([]string, len(batch))
		firsts := make([]int64, len(batch))
		for i, c := range batch {
			consumers[i], sources[i], ids[i], firsts[i] = c.consumer, c.key.Source, c.key.ID, int64(max(c.first, 0))
		}
		return s.db.QueryContext(ctx, s.countMany, at, consumers, sources, ids, firsts)
	}
	if list, ok := jsonCounts(batch); ok {
		return s.db.QueryContext(ctx, s.countMany, at, list)
	}
	args := make([]any, 0, 5*len(batch))
	for _, c := range batch {
		args = append(args, c.consumer, c.key.Source, c.key.ID, max(c.first, 0), at)
	}
	q := qCountInto + " VALUES " + valueRows(len(batch), 5) + "\n" + qCountConflict
	return s.db.QueryContext(ctx, s.q.sql(q), args...)
}

// jsonCounts returns batch as a JSON array of [consumer, source, id,
// first] arrays, or false when a key is not storable text.
func jsonCounts(batch []*countCall) (string, bool) {
	items := make([][4]any, len(batch))
	for i, c := range batch {
		if !storableText(c.consumer, c.key.Source, c.key.ID) {
			return "", false
		}
		items[i] = [4]any{c.consumer, c.key.Source, c.key.ID, max(c.first, 0)}
	}
	b, err := json.Marshal(items)
	if err != nil {
		return "", false // strings and ints always marshal
	}
	return string(b), true
}
