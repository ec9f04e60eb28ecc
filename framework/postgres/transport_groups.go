package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"

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
	tables, err := t.offsetsTables(ctx, tx, nil)
	if err != nil {
		return nil, fmt.Errorf("postgres: remove group %s: %w", consumer, err)
	}
	verb := `SELECT consumer_group, COALESCE(offset_acked, 0) FROM %s WHERE %s ORDER BY consumer_group`
	if !dryRun {
		verb = `DELETE FROM %s WHERE %s RETURNING consumer_group, COALESCE(offset_acked, 0)`
	}
	var out []driver.GroupPosition
	for _, table := range tables {
		var rows []groupRow
		if err := tx.SelectContext(ctx, &rows, fmt.Sprintf(verb, table.name, groupsOf("$1")), consumer); err != nil {
			return nil, fmt.Errorf("postgres: remove group %s from %s: %w", consumer, table.name, err)
		}
		out = appendPositions(out, table.name, rows)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("postgres: remove group %s: commit: %w", consumer, err)
	}
	return out, nil
}

var _ driver.GroupAdopter = (*Transport)(nil)

// AdoptGroup copies, in the offsets table of each of topics where
// consumer has no row, neither its group's nor its partitions', the rows
// of from's group and of its partitions' groups
// ("<from>#<p>/<n>" to "<consumer>#<p>/<n>"), every column as it is, in
// one transaction, and returns the positions copied. From's rows stay,
// and keep holding back the purge of the messages after them until
// removed (RemoveGroup). A partition count that differs from from's is
// then handled as any change of count (see partitionGroup).
func (t *Transport) AdoptGroup(ctx context.Context, consumer, from string, topics []string) ([]driver.GroupPosition, error) {
	if consumer == "" || from == "" || consumer == from {
		return nil, fmt.Errorf("postgres: adopt group %q for %q: want two different consumer names", from, consumer)
	}
	if t.db == nil {
		return nil, errors.New("postgres: adopt group: the transport has no database")
	}
	tx, err := t.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("postgres: adopt group %s for %s: begin: %w", from, consumer, err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	names := make([]string, len(topics))
	for i, topic := range topics {
		names[i] = OffsetsTable(t.cfg.TablePrefix, topic)
	}
	tables, err := t.offsetsTables(ctx, tx, names)
	if err != nil {
		return nil, fmt.Errorf("postgres: adopt group %s for %s: %w", from, consumer, err)
	}
	var out []driver.GroupPosition
	for _, table := range tables {
		cols := ""
		for _, c := range table.columns {
			cols += ", " + quoteIdent(c)
		}
		// The new group's names keep what follows the old name: "" or
		// "#<p>/<n>". Two processes of the renamed consumer starting at
		// once copy the same rows: the second's conflict is no error.
		q := fmt.Sprintf(`INSERT INTO %[1]s (consumer_group%[2]s)
SELECT $2 || substr(consumer_group, length($1) + 1)%[2]s FROM %[1]s
WHERE (%[3]s) AND NOT EXISTS (SELECT 1 FROM %[1]s WHERE %[4]s)
ON CONFLICT DO NOTHING
RETURNING consumer_group, COALESCE(offset_acked, 0)`, table.name, cols, groupsOf("$1"), groupsOf("$2"))
		var rows []groupRow
		if err := tx.SelectContext(ctx, &rows, q, from, consumer); err != nil {
			return nil, fmt.Errorf("postgres: adopt group %s for %s in %s: %w", from, consumer, table.name, err)
		}
		out = appendPositions(out, table.name, rows)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("postgres: adopt group %s for %s: commit: %w", from, consumer, err)
	}
	return out, nil
}

// groupsOf returns the condition that a row's consumer_group is the
// group of the consumer bound to param or one of its partitions' groups.
// A consumer name holds no '#': "<consumer>#" starts its partitions'
// groups only.
func groupsOf(param string) string {
	return fmt.Sprintf(`consumer_group = %[1]s OR left(consumer_group, length(%[1]s) + 1) = %[1]s || '#'`, param)
}

// groupRow is a group's row in an offsets table, as RemoveGroup and
// AdoptGroup return it.
type groupRow struct {
	Group  string `db:"consumer_group"`
	Offset int64  `db:"coalesce"`
}

// appendPositions appends the positions of rows, of the offsets table
// named table (quoted), to out.
func appendPositions(out []driver.GroupPosition, table string, rows []groupRow) []driver.GroupPosition {
	for _, r := range rows {
		out = append(out, driver.GroupPosition{Table: strings.Trim(table, `"`), Group: r.Group, Offset: r.Offset})
	}
	return out
}

// offsetsTable is an offsets table of the transport: its quoted name and
// its columns besides consumer_group.
type offsetsTable struct {
	name    string
	columns []string
}

// offsetsTables returns the offsets tables of the transport: the tables
// of the current schema whose name starts with
// "<prefix>watermill_offsets_" and that have a consumer_group column;
// with names, only those of these names (quoted, as OffsetsTable
// returns them; a table that does not exist is left out).
func (t *Transport) offsetsTables(ctx context.Context, tx *sqlx.Tx, names []string) ([]offsetsTable, error) {
	var rows []struct {
		Name    string `db:"name"`
		Columns string `db:"columns"` // a JSON array
	}
	err := tx.SelectContext(ctx, &rows, `SELECT c.oid::regclass::text AS name,
		COALESCE((SELECT json_agg(a.attname ORDER BY a.attnum) FROM pg_attribute AS a
			WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attname <> 'consumer_group'), '[]')::text AS columns
		FROM pg_class AS c
		WHERE c.relkind IN ('r', 'p') AND c.relnamespace = current_schema()::regnamespace
		AND starts_with(c.relname, $1)
		AND EXISTS (SELECT 1 FROM pg_attribute AS a WHERE a.attrelid = c.oid AND a.attname = 'consumer_group' AND NOT a.attisdropped)
		AND ($2::text[] IS NULL OR c.oid IN (SELECT to_regclass(n) FROM unnest($2::text[]) AS n))
		ORDER BY c.relname`, identifier(t.cfg.TablePrefix+"watermill_offsets_"), names)
	if err != nil {
		return nil, fmt.Errorf("find the offsets tables: %w", err)
	}
	out := make([]offsetsTable, len(rows))
	for i, r := range rows {
		out[i].name = r.Name
		if err := json.Unmarshal([]byte(r.Columns), &out[i].columns); err != nil {
			return nil, fmt.Errorf("the columns of %s: %w", r.Name, err)
		}
	}
	return out, nil
}
