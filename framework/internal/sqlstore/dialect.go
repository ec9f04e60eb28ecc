package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// Dialect names a supported SQL database.
type Dialect string

// The supported dialects.
const (
	Postgres Dialect = "postgres"
	SQLite   Dialect = "sqlite"
)

// DialectOf derives the dialect from a database/sql driver name.
func DialectOf(driverName string) (Dialect, error) {
	switch strings.ToLower(driverName) {
	case "pgx", "pgx/v5", "pgx/v4", "postgres", "postgresql", "cloudsqlpostgres":
		return Postgres, nil
	case "sqlite", "sqlite3":
		return SQLite, nil
	}
	return "", fmt.Errorf("unknown database driver %q: set the dialect to %q or %q", driverName, Postgres, SQLite)
}

// Validate reports whether d is a supported dialect.
func (d Dialect) Validate() error {
	switch d {
	case Postgres, SQLite:
		return nil
	}
	return fmt.Errorf("unknown dialect %q: use %q or %q", d, Postgres, SQLite)
}

// bindType returns the placeholder style of d for sqlx.Rebind.
func (d Dialect) bindType() int {
	if d == Postgres {
		return sqlx.DOLLAR
	}
	return sqlx.QUESTION
}

// pick returns the one of postgres and sqlite that is d's: a statement
// written for each dialect.
func (d Dialect) pick(postgres, sqlite string) string {
	if d == Postgres {
		return postgres
	}
	return sqlite
}

// timeArg returns t as the dialect stores it: UTC for timestamptz, Unix
// nanoseconds for SQLite, held to what an int64 holds (1677 to 2262):
// UnixNano wraps around outside, so that a bound of 9999-12-31 compared
// as a date before 1970.
func (d Dialect) timeArg(t time.Time) any {
	if d == SQLite {
		switch {
		case t.Before(minNano):
			t = minNano
		case t.After(maxNano):
			t = maxNano
		}
		return t.UnixNano()
	}
	return t.UTC()
}

// minNano and maxNano are the earliest and latest times of int64
// nanoseconds since 1970.
var (
	minNano = time.Unix(0, math.MinInt64)
	maxNano = time.Unix(0, math.MaxInt64)
)

// MaxPrefixBytes is the longest table prefix.
const MaxPrefixBytes = 30

var prefixPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// ValidatePrefix reports whether prefix can prefix the framework's table
// names: empty, or at most MaxPrefixBytes bytes matching
// ^[a-z_][a-z0-9_]*$. The prefix is written into SQL as it is, so it must
// pass this check first.
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if len(prefix) > MaxPrefixBytes {
		return fmt.Errorf("table prefix %q is %d bytes long, at most %d allowed", prefix, len(prefix), MaxPrefixBytes)
	}
	if !prefixPattern.MatchString(prefix) {
		return fmt.Errorf("table prefix %q is malformed: use lower-case letters, digits and underscores, not starting with a digit, e.g. effectively_", prefix)
	}
	return nil
}

// MaxTableNameBytes is the longest table name: PostgreSQL cuts an
// identifier to 63 bytes.
const MaxTableNameBytes = 63

// ValidateTableName reports whether name can name a table, as a version
// table of migrations does: at most MaxTableNameBytes bytes matching
// ^[a-z_][a-z0-9_]*$. The name is written into SQL as it is, so it must
// pass this check first. Unlike a prefix, it may be as long as a table's
// name: a prefix of MaxPrefixBytes leaves room for the longest table name
// after it.
func ValidateTableName(name string) error {
	if len(name) > MaxTableNameBytes {
		return fmt.Errorf("table name %q is %d bytes long, at most %d allowed", name, len(name), MaxTableNameBytes)
	}
	if !prefixPattern.MatchString(name) {
		return fmt.Errorf("table name %q is malformed: use lower-case letters, digits and underscores, not starting with a digit", name)
	}
	return nil
}

// timeValue scans a time stored by either dialect: a time.Time, Unix
// nanoseconds, or NULL (the zero time).
type timeValue struct{ t time.Time }

// Scan implements sql.Scanner.
func (v *timeValue) Scan(src any) error {
	switch x := src.(type) {
	case nil:
		v.t = time.Time{}
	case time.Time:
		v.t = x.UTC()
	case int64:
		v.t = time.Unix(0, x).UTC()
	default:
		return fmt.Errorf("scan time: unsupported type %T", src)
	}
	return nil
}

// sqlState returns the SQLSTATE of err (PostgreSQL's, through pgx), or "".
func sqlState(err error) string {
	var state interface{ SQLState() string }
	if errors.As(err, &state) {
		return state.SQLState()
	}
	return ""
}

// listMax is how many ids one statement binds as a list (sqlx.In):
// SQLite takes at most 32,766 variables a statement, and a list may be
// longer (a relay's batch of small events, a purge of many rows).
const listMax = 10000

// execList runs query, in SQLite's placeholders with its last one a list
// that sqlx.In expands, on ids, in statements of d of at most listMax of
// them; args are the arguments before the list.
func execList(ctx context.Context, ex sqlx.ExecerContext, d Dialect, query string, ids []int64, args ...any) error {
	for chunk := range slices.Chunk(ids, listMax) {
		q, all, err := sqlx.In(query, append(slices.Clip(args), chunk)...)
		if err != nil {
			return err
		}
		if _, err := ex.ExecContext(ctx, sqlx.Rebind(d.bindType(), q), all...); err != nil {
			return err
		}
	}
	return nil
}
