package sqlstore

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
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

// inIDs is the token of a query's condition that a column is one of a
// list of ids, bound as one argument of any length (see idList):
// "WHERE id {in_ids}".
const inIDs = "{in_ids}"

// withIDList returns query with its inIDs token in d's form: = ANY of an
// array on PostgreSQL, IN the values of a JSON array (json_each) on
// SQLite, which binds at most 32,766 variables a statement. One
// statement, of one text, whatever the number of ids.
func (d Dialect) withIDList(query string) string {
	return strings.Replace(query, inIDs, d.pick("= ANY(?::bigint[])", "IN (SELECT value FROM json_each(?))"), 1)
}

// idList returns ids as the argument of a list of d (see withIDList):
// the slice on PostgreSQL, its JSON text on SQLite.
func (d Dialect) idList(ids []int64) any {
	if d == Postgres {
		return ids
	}
	return JSONIDs(ids)
}

// JSONIDs returns ids as a JSON array: a list that SQLite binds as one
// argument and reads with json_each, whatever its length.
func JSONIDs(ids []int64) string {
	b := make([]byte, 0, 2+8*len(ids))
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return string(append(b, ']'))
}
