package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/effectively-once/effectively/framework/driver"
)

var _ driver.GroupRemover = (*Transport)(nil)

// RemoveGroup deletes, from every offsets table of the transport (the
// tables of the current schema whose name starts with
// "<prefix>watermill_offsets_" and that have a consumer_group column),
// the rows of consumer's group and of its partitions' groups
// ("<consumer>#<p>/<n>"), in one transaction, and returns them; with
// dryRun it returns them and deletes nothing. A consumer whose processes
// still run writes its rows again: stop them first.
func (t *Transport) RemoveGroup(ctx context.Context, consumer string, dryRun bool) ([]driver.GroupPosition, error) {
	if consumer == "" {
		return nil, errors.New("postgres: remove group: empty consumer")
	}
	if t.db == nil {
		return nil, errors.New("postgres: remove group: the transport has no database")
	}
	tx, err := t.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("postgres: remove group %s: begin: %w", consumer, err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	var tables []string
	err = tx.SelectContext(ctx, &tables, `SELECT c.oid::regclass::text FROM pg_class AS c
		WHERE c.relkind IN ('r', 'p') AND c.relnamespace = current_schema()::regnamespace
		AND starts_with(c.relname, $1)
		AND EXISTS (SELECT 1 FROM pg_attribute AS a WHERE a.attrelid = c.oid AND a.attname = 'consumer_group' AND NOT a.attisdropped)
		ORDER BY c.relname`, identifier(t.cfg.TablePrefix+"watermill_offsets_"))
	if err != nil {
		return nil, fmt.Errorf("postgres: remove group %s: find the offsets tables: %w", consumer, err)
	}
	verb := `SELECT consumer_group, COALESCE(offset_acked, 0) FROM %s WHERE %s ORDER BY consumer_group`
	if !dryRun {
		verb = `DELETE FROM %s WHERE %s RETURNING consumer_group, COALESCE(offset_acked, 0)`
	}
	// A consumer name holds no '#': "<consumer>#" starts its partitions'
	// groups only.
	const mine = `consumer_group = $1 OR left(consumer_group, length($1) + 1) = $1 || '#'`
	var out []driver.GroupPosition
	for _, table := range tables {
		var rows []struct {
			Group  string `db:"consumer_group"`
			Offset int64  `db:"coalesce"`
		}
		if err := tx.SelectContext(ctx, &rows, fmt.Sprintf(verb, table, mine), consumer); err != nil {
			return nil, fmt.Errorf("postgres: remove group %s from %s: %w", consumer, table, err)
		}
		for _, r := range rows {
			out = append(out, driver.GroupPosition{Table: strings.Trim(table, `"`), Group: r.Group, Offset: r.Offset})
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("postgres: remove group %s: commit: %w", consumer, err)
	}
	return out, nil
}
