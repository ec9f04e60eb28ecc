package sqlstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
)

// Skip is the event types whose rows a claim of the outbox (Claim, Lease)
// leaves out: types the broker routes nowhere, whose rows must not hold
// up the others. With Probe, the oldest unsent row of each is claimed
// still, to try whether the broker routes it now.
type Skip struct {
	Types []string
	Probe bool
}

// skipping returns the claim statement prepared, with its arguments, when
// skip leaves out no type; otherwise base (its SQL before prefixing and
// binding) with skip's condition, and args with the condition's after
// the first (the claim's and the lease's conditions on unsent rows come
// after their first placeholder).
func (o *Outbox) skipping(prepared, base string, skip Skip, args ...any) (string, []any, error) {
	if len(skip.Types) == 0 {
		return prepared, args, nil
	}
	cond, condArgs := qOutboxSkip, []any{skip.Types}
	if skip.Probe {
		cond, condArgs = qOutboxProbe, []any{skip.Types, skip.Types}
	}
	all := append(append([]any{args[0]}, condArgs...), args[1:]...)
	query, all, err := sqlx.In(strings.Replace(base, outboxUnsentRows, cond, 1), all...)
	if err != nil {
		return "", nil, fmt.Errorf("skip %d event types: %w", len(skip.Types), err)
	}
	return o.q.sql(query), all, nil
}

// UnsentOf returns how many unsent rows each of types has; a type
// without any is not in the map.
func (o *Outbox) UnsentOf(ctx context.Context, q sqlx.QueryerContext, types []string) (map[string]int, error) {
	counts := make(map[string]int, len(types))
	if len(types) == 0 {
		return counts, nil
	}
	query, args, err := sqlx.In(qOutboxUnsentOf, types)
	if err != nil {
		return nil, fmt.Errorf("count unsent outbox rows of %d types: %w", len(types), err)
	}
	rows, err := q.QueryxContext(ctx, o.q.sql(query), args...)
	if err != nil {
		return nil, fmt.Errorf("count unsent outbox rows of %d types: %w", len(types), err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			typ string
			n   int
		)
		if err := rows.Scan(&typ, &n); err != nil {
			return nil, fmt.Errorf("count unsent outbox rows: scan: %w", err)
		}
		counts[typ] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count unsent outbox rows: %w", err)
	}
	return counts, nil
}
