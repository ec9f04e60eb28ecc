package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib" // also registers the "pgx" database/sql driver
	"github.com/jmoiron/sqlx"
)

// DriverName is the database/sql driver name of pgx v5.
const DriverName = "pgx"

// Defaults of OpenConfig.
const (
	// DefaultMaxOpenConns bounds the pool: each in-flight attempt holds a
	// connection for its transaction, and PostgreSQL's own default limit
	// is 100 connections for every client together.
	DefaultMaxOpenConns = 10
	// DefaultConnMaxIdleTime closes connections idle that long.
	DefaultConnMaxIdleTime = 5 * time.Minute
	// DefaultConnectTimeout bounds the making of a connection. pgx, like
	// libpq, waits for ever by default: a server that took the TCP
	// connection and never answered (hung, or a proxy in front of one
	// that is down) held the service's start and every operator command
	// without a word.
	DefaultConnectTimeout = 10 * time.Second
)

// OpenConfig configures Open.
type OpenConfig struct {
	// MaxOpenConns bounds the connection pool. Give it at least the
	// number of attempts that may run at once, plus one for the delivery
	// counts and dead letters. Defaults to DefaultMaxOpenConns.
	MaxOpenConns int
	// MaxIdleConns is how many idle connections the pool keeps. Defaults
	// to MaxOpenConns.
	MaxIdleConns int
	// ConnMaxIdleTime closes a connection idle that long. Defaults to
	// DefaultConnMaxIdleTime.
	ConnMaxIdleTime time.Duration
	// ConnMaxLifetime closes a connection that old; zero keeps it.
	// Defaults to zero.
	ConnMaxLifetime time.Duration
	// ConnectTimeout bounds the making of each connection: the dial, TLS,
	// authentication and the server's first answer, so that a server that
	// takes the connection and never answers fails the ping, and every
	// later connection, instead of holding them for ever. The URL's own
	// connect_timeout (or PGCONNECT_TIMEOUT), when above zero, takes
	// precedence. Defaults to DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// ApplicationName is the application_name of every connection (as
	// pg_stat_activity shows it), over the URL's own: the app names a
	// process's connections after its member in the partitioned
	// consumers' groups, so that the process that takes over a partition
	// from a stale owner can end its sessions (see
	// driver.SessionEnder). At most MaxApplicationName bytes of
	// printable ASCII. Defaults to the URL's, if any.
	ApplicationName string
}

// MaxApplicationName is the longest application_name PostgreSQL keeps
// (NAMEDATALEN - 1): it cuts a longer one.
const MaxApplicationName = maxIdentifier

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c OpenConfig) WithDefaults() OpenConfig {
	c.MaxOpenConns = cmp.Or(c.MaxOpenConns, DefaultMaxOpenConns)
	c.MaxIdleConns = cmp.Or(c.MaxIdleConns, c.MaxOpenConns)
	c.ConnMaxIdleTime = cmp.Or(c.ConnMaxIdleTime, DefaultConnMaxIdleTime)
	c.ConnectTimeout = cmp.Or(c.ConnectTimeout, DefaultConnectTimeout)
	return c
}

// Validate reports the first invalid field of c.
func (c OpenConfig) Validate() error {
	switch {
	case c.MaxOpenConns < 1:
		return fmt.Errorf("postgres: MaxOpenConns must be at least 1, got %d", c.MaxOpenConns)
	case c.MaxIdleConns < 0 || c.MaxIdleConns > c.MaxOpenConns:
		return fmt.Errorf("postgres: MaxIdleConns must be between 0 and MaxOpenConns (%d), got %d", c.MaxOpenConns, c.MaxIdleConns)
	case c.ConnMaxIdleTime < 0:
		return fmt.Errorf("postgres: ConnMaxIdleTime must not be negative, got %s", c.ConnMaxIdleTime)
	case c.ConnMaxLifetime < 0:
		return fmt.Errorf("postgres: ConnMaxLifetime must not be negative, got %s", c.ConnMaxLifetime)
	case c.ConnectTimeout < 0:
		return fmt.Errorf("postgres: ConnectTimeout must not be negative, got %s", c.ConnectTimeout)
	}
	return validApplicationName("OpenConfig.ApplicationName", c.ApplicationName)
}

// validApplicationName reports an application_name that PostgreSQL would
// not keep as it is: longer than MaxApplicationName, or with a byte
// outside printable ASCII (which it replaces by '?').
func validApplicationName(field, name string) error {
	if len(name) > MaxApplicationName {
		return fmt.Errorf("postgres: %s must be at most %d bytes, got %d (%q)", field, MaxApplicationName, len(name), name)
	}
	for i := range len(name) {
		if name[i] < 0x20 || name[i] > 0x7e {
			return fmt.Errorf("postgres: %s must be printable ASCII, got %q", field, name)
		}
	}
	return nil
}

// ErrEmptyURL is returned by Open without a URL.
var ErrEmptyURL = errors.New("postgres: empty database URL (e.g. postgres://user:password@host:5432/db?sslmode=disable)")

// Open opens a bounded pool of connections to the PostgreSQL database at
// url (a postgres:// URL or a key=value DSN, as pgx reads it) with the pgx
// v5 driver, and pings it before it returns. Each connection is made
// within cfg.ConnectTimeout, unless the URL gives a connect_timeout of its
// own.
func Open(ctx context.Context, url string, cfg OpenConfig) (*sqlx.DB, error) {
	if url == "" {
		return nil, ErrEmptyURL
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	conn, err := pgx.ParseConfig(url)
	if err != nil {
		// pgx's error quotes the URL with its password left out.
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	if conn.ConnectTimeout == 0 {
		conn.ConnectTimeout = cfg.ConnectTimeout
	}
	if cfg.ApplicationName != "" {
		conn.RuntimeParams["application_name"] = cfg.ApplicationName
	}
	db := sqlx.NewDb(stdlib.OpenDB(*conn), DriverName)
	db.SetMaxOpenConns(cfg.MaxOpenConns)
	db.SetMaxIdleConns(cfg.MaxIdleConns)
	db.SetConnMaxIdleTime(cfg.ConnMaxIdleTime)
	db.SetConnMaxLifetime(cfg.ConnMaxLifetime)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("postgres: ping: %w", err)
	}
	return db, nil
}
