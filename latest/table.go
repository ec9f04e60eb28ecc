package latest

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
)

// MaxIdentifierBytes is the longest table or column name New accepts:
// PostgreSQL's limit (longer names are cut short there).
const MaxIdentifierBytes = 63

// Config names a projection table and its columns. The names are the
// handler author's identifiers, never data: New checks and quotes each of
// them. The values of a row always travel as bind parameters.
type Config struct {
	// Table is the table's name: lower-case letters, digits and
	// underscores, starting with a letter or an underscore, at most
	// MaxIdentifierBytes bytes (the form PostgreSQL folds unquoted names
	// to, so the quoted name New writes is the table the migration
	// created). No schema: PostgreSQL finds it on the search_path.
	Table string
	// Key names the columns of the row's key, at least one: the table's
	// primary key or a unique index on exactly these columns (the
	// conflict target). A row's state is one subject's: key the table by
	// the subject, since only one subject's sequences are ordered.
	Key []string
	// Version names the column that holds the sequence of the stamp of
	// the stored state: an integer column (BIGINT on PostgreSQL), NOT
	// NULL, since NULL compares as unknown and would never be replaced.
	Version string
	// Columns names the state columns that Upsert writes, in the order of
	// Row.Values. Columns outside Key, Version and Columns keep their
	// value on update (their default on insert). Defaults to none.
	Columns []string
}

// Validate reports the first field of c that New refuses: a name that is
// not a lower-case identifier, no key column, no version column, or a
// column named twice.
func (c Config) Validate() error {
	if err := checkIdentifier("Table", c.Table); err != nil {
		return err
	}
	if len(c.Key) == 0 {
		return errors.New("latest: Config.Key: missing (name the columns of the table's primary key or unique index)")
	}
	seen := make(map[string]string)
	check := func(field, name string) error {
		if err := checkIdentifier(field, name); err != nil {
			return err
		}
		if other, ok := seen[name]; ok {
			return fmt.Errorf("latest: Config.%s: column %q is named in %s already", field, name, other)
		}
		seen[name] = field
		return nil
	}
	for i, name := range c.Key {
		if err := check(fmt.Sprintf("Key[%d]", i), name); err != nil {
			return err
		}
	}
	if err := check("Version", c.Version); err != nil {
		return err
	}
	for i, name := range c.Columns {
		if err := check(fmt.Sprintf("Columns[%d]", i), name); err != nil {
			return err
		}
	}
	return nil
}

// checkIdentifier reports a name that is not a lower-case SQL identifier.
func checkIdentifier(field, name string) error {
	if name == "" {
		return fmt.Errorf("latest: Config.%s: missing", field)
	}
	if len(name) > MaxIdentifierBytes {
		return fmt.Errorf("latest: Config.%s: %d bytes, at most %d allowed", field, len(name), MaxIdentifierBytes)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if (c >= 'a' && c <= 'z') || c == '_' || (i > 0 && c >= '0' && c <= '9') {
			continue
		}
		return fmt.Errorf("latest: Config.%s: %q is not a lower-case identifier ([a-z_][a-z0-9_]*)", field, name)
	}
	return nil
}

// Table writes the latest state of each key of one projection table: a
// row is inserted, or updated only when the incoming stamp is newer than
// the stored one. Build it once with New, when the handler is built; it
// is safe for concurrent use.
type Table struct {
	cfg   Config
	query string // with ? placeholders
}

// New checks cfg and returns the table, with its statement built once.
func New(cfg Config) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Key = append([]string(nil), cfg.Key...)
	cfg.Columns = append([]string(nil), cfg.Columns...)
	return &Table{cfg: cfg, query: upsertSQL(cfg)}, nil
}

// upsertSQL returns the statement of cfg, with ? placeholders: the key,
// the version, then the state columns.
func upsertSQL(cfg Config) string {
	table := quote(cfg.Table)
	version := quote(cfg.Version)
	cols := make([]string, 0, len(cfg.Key)+1+len(cfg.Columns))
	for _, name := range cfg.Key {
		cols = append(cols, quote(name))
	}
	cols = append(cols, version)
	sets := []string{version + " = excluded." + version}
	for _, name := range cfg.Columns {
		cols = append(cols, quote(name))
		sets = append(sets, quote(name)+" = excluded."+quote(name))
	}
	marks := strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ")
	return "INSERT INTO " + table + " (" + strings.Join(cols, ", ") + ") VALUES (" + marks + ")" +
		" ON CONFLICT (" + strings.Join(cols[:len(cfg.Key)], ", ") + ")" +
		" DO UPDATE SET " + strings.Join(sets, ", ") +
		" WHERE excluded." + version + " > " + table + "." + version
}

// quote quotes a name that checkIdentifier accepted.
func quote(name string) string { return `"` + name + `"` }

// SQL returns the statement Upsert runs, with ? placeholders (Upsert
// rebinds them for the connection's driver), the same on PostgreSQL and
// SQLite:
//
//	INSERT INTO "t" ("key", "version", "col") VALUES (?, ?, ?)
//	ON CONFLICT ("key") DO UPDATE SET "version" = excluded."version", "col" = excluded."col"
//	WHERE excluded."version" > "t"."version"
func (t *Table) SQL() string { return t.query }

// Row is one key's state as an event carries it.
type Row struct {
	// Key holds the values of Config.Key, in its order.
	Key []any
	// Stamp is the event's stamp (see StampOf); its Seq is stored in the
	// version column.
	Stamp Stamp
	// Values holds the values of Config.Columns, in its order.
	Values []any
}

// Upsert writes row when its key has no row yet, or when row.Stamp's
// sequence is greater than the stored version; otherwise it changes
// nothing. It reports whether the row was written. conn is the attempt's
// transaction, framework.Conn(ctx, db), so the write commits or rolls back
// with the event's processed mark.
//
// A stamp without a subject or sequence is refused with Stamp.Validate's
// permanent error (code CodeUnsequenced): the event is dead-lettered
// instead of being applied in no order, or silently dropped. A row whose
// Key or Values do not match the Config is refused with a plain error.
func (t *Table) Upsert(ctx context.Context, conn sqlx.ExtContext, row Row) (applied bool, err error) {
	if err := row.Stamp.Validate(); err != nil {
		return false, fmt.Errorf("latest: upsert into %s: %w", t.cfg.Table, err)
	}
	if len(row.Key) != len(t.cfg.Key) {
		return false, fmt.Errorf("latest: upsert into %s: %d key values for %d key columns", t.cfg.Table, len(row.Key), len(t.cfg.Key))
	}
	if len(row.Values) != len(t.cfg.Columns) {
		return false, fmt.Errorf("latest: upsert into %s: %d values for %d columns", t.cfg.Table, len(row.Values), len(t.cfg.Columns))
	}
	args := make([]any, 0, len(row.Key)+1+len(row.Values))
	args = append(args, row.Key...)
	args = append(args, row.Stamp.Seq)
	args = append(args, row.Values...)
	res, err := conn.ExecContext(ctx, conn.Rebind(t.query), args...)
	if err != nil {
		return false, fmt.Errorf("latest: upsert into %s: %w", t.cfg.Table, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("latest: upsert into %s: rows affected: %w", t.cfg.Table, err)
	}
	return n > 0, nil
}
