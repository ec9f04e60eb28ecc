package app

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/printable"
)

// maxQuotedBytes is how much of a value of the user's a configuration
// error quotes: enough to recognise it, and a value of megabytes (a
// table_prefix pasted from a file) no longer makes a line of megabytes.
const maxQuotedBytes = 64

// quoteValue returns v as configuration errors quote a value of the
// user's: Go-quoted (%q), so that a control character or an escape
// sequence shows as an escape (\n, \x1b) instead of reaching the terminal,
// and cut after maxQuotedBytes bytes, followed by "… (N bytes)".
func quoteValue(v string) string {
	head, tail := cutValue(v)
	return strconv.Quote(head) + tail
}

// printableKey returns a key of the file (a consumer's name under
// consumers:, an unknown key) as errors name it, unquoted: printable (see
// printable.String), and cut as quoteValue cuts a value.
func printableKey(k string) string {
	head, tail := cutValue(k)
	return printable.String(head) + tail
}

// cutValue splits v into what an error shows of it, at most
// maxQuotedBytes bytes without splitting a UTF-8 rune, and what follows
// it: "" when v is whole, else "… (N bytes)".
func cutValue(v string) (head, tail string) {
	if len(v) <= maxQuotedBytes {
		return v, ""
	}
	n := maxQuotedBytes
	for n > maxQuotedBytes-utf8.UTFMax && !utf8.RuneStart(v[n]) {
		n--
	}
	return v[:n], fmt.Sprintf("… (%d bytes)", len(v))
}

// spaceAround reports whether v begins or ends with white space (a space,
// a tab, a newline): a URL or an address copied with it is another one
// (SQLite took " postgres://..." for a path and created its folders).
func spaceAround(v string) bool {
	return v != strings.TrimFunc(v, unicode.IsSpace)
}

// errSpaceAround is the problem of a value that spaceAround reports. It
// does not quote the value, which may be a URL with a password.
const errSpaceAround = "begins or ends with white space (a space, tab or newline): remove it"

// validateURLs checks database_url and transport_url (transport_url once
// only, when it is database_url): no white space around them, a
// PostgreSQL URL that pgx reads, or a SQLite file (see checkSQLiteURL).
// The errors do not quote the URLs, which may hold a password.
func (c Config) validateURLs() []error {
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, fmt.Errorf("%s: empty", setting("database_url", EnvDatabaseURL)))
	}
	for _, u := range []struct{ key, env, url string }{
		{"database_url", EnvDatabaseURL, c.DatabaseURL},
		{"transport_url", EnvTransportURL, c.TransportURL},
	} {
		switch {
		case u.url == "": // database_url's said above; transport_url's is database_url
			continue
		case u.key == "transport_url" && c.TransportURL == c.DatabaseURL:
			continue // database_url's, said once
		}
		if err := checkDatabaseURL(u.url); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", setting(u.key, u.env), err))
		}
	}
	return errs
}

// checkDatabaseURL returns the problem of the URL of a database, without
// quoting it: white space around it, a PostgreSQL URL mistyped or that
// pgx cannot read, another database's scheme, or a SQLite URL that
// checkSQLiteURL refuses.
func checkDatabaseURL(u string) error {
	switch scheme, foreign := foreignScheme(u); {
	case spaceAround(u):
		return errors.New(errSpaceAround)
	case mistypedPostgresURL(u):
		return errors.New("begins as a PostgreSQL URL but is not one: want postgres://user:password@host:port/database (a SQLite file would be created at that path)")
	case foreign:
		return fmt.Errorf("a %s:// URL: want a SQLite file (a path or file: URI) or postgres://user:password@host:port/database (a SQLite file would be created at that path)", scheme)
	case isPostgresURL(u):
		return checkPostgresURL(u)
	default:
		return checkSQLiteURL(u)
	}
}

// checkSQLiteURL refuses a SQLite URL (a path or file: URI) that holds a
// NUL byte, which the driver cuts the path at, or that names an in-memory
// database (see sqlite.InMemory). Its errors do not quote the URL.
func checkSQLiteURL(u string) error {
	if strings.IndexByte(u, 0) >= 0 {
		return fmt.Errorf("holds a NUL byte (\\x00), at which SQLite would cut the path: want a SQLite file (a path or file: URI) or postgres://user:password@host:port/database")
	}
	if sqlite.InMemory(u) {
		return fmt.Errorf("an in-memory SQLite database (:memory:, mode=memory, vfs=memdb or an empty path): each of the service's connections would have one of its own, empty, and nothing would outlive the process; a service needs a file, e.g. %s", DefaultDatabaseURL)
	}
	return nil
}

// sqliteReserved is the prefix of the names that SQLite keeps for its own
// tables, in any case: creating one fails ("object name reserved for
// internal use").
const sqliteReserved = "sqlite_"

// validateTablePrefix checks table_prefix: migrate.ValidateTablePrefix's
// rules, and, when one of the framework's tables is in a SQLite file (the
// stores' or the sqlite transport's), not a prefix that SQLite reserves.
// A long prefix is quoted cut (quoteValue).
func (c Config) validateTablePrefix() error {
	key := setting("table_prefix", EnvTablePrefix)
	p := c.TablePrefix
	if err := migrate.ValidateTablePrefix(p); err != nil {
		if len(p) > migrate.MaxTablePrefixBytes { // the framework's error quotes it whole
			return fmt.Errorf("%s: want at most %d bytes, got %s", key, migrate.MaxTablePrefixBytes, quoteValue(p))
		}
		return fmt.Errorf("%s: %w", key, err)
	}
	onSQLite := !isPostgresURL(c.DatabaseURL) || c.Transport == TransportSQLite
	if onSQLite && len(p) >= len(sqliteReserved) && strings.EqualFold(p[:len(sqliteReserved)], sqliteReserved) {
		return fmt.Errorf("%s: SQLite reserves the names that begin with %s for its own tables, so the migrations would fail, got %s: choose another prefix, e.g. effectively_",
			key, sqliteReserved, quoteValue(p))
	}
	return nil
}

// durationBound is a duration setting of Config with its least value
// and its greatest (0: none).
type durationBound struct {
	key      string
	d        Duration
	min, max time.Duration
}

// validateDurations checks the purge's and the outbox's durations: zero
// is the default, a negative one or one past its bounds is refused,
// naming the key and the bound.
func (c Config) validateDurations() []error {
	var errs []error
	for _, b := range []durationBound{
		{"purge_interval", c.PurgeInterval, MinPurgeInterval, 0},
		{"outbox_retention", c.OutboxRetention, MinRetention, 0},
		{"outbox_batch_timeout", c.OutboxBatchTimeout, MinOutboxBatchTimeout, outbox.MaxBatchTimeout},
		{"replay_retention", c.ReplayRetention, MinRetention, 0},
		{"dead_letter_retention", c.DeadLetterRetention, MinRetention, 0},
		{"transport_retention", c.TransportRetention, MinRetention, 0},
	} {
		switch d := time.Duration(b.d); {
		case d < 0:
			errs = append(errs, fmt.Errorf("%s: must not be negative (zero is the default), got %s", b.key, d))
		case d > 0 && d < b.min:
			errs = append(errs, fmt.Errorf("%s: want at least %s (or nothing: the default), got %s", b.key, b.min, d))
		case b.max > 0 && d > b.max:
			errs = append(errs, fmt.Errorf("%s: want at most %s (or nothing: the default), got %s", b.key, b.max, d))
		}
	}
	return errs
}

// readConfigFile reads the configuration file at path, which must be a
// regular file (or a link to one) of at most MaxConfigFileBytes: a device
// such as /dev/zero never ends, and a named pipe blocks until another
// process writes to it. An error of the operating system is wrapped.
func readConfigFile(path string) ([]byte, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if err := regularFile(path, info); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if opened, err := f.Stat(); err != nil || !os.SameFile(info, opened) {
		return nil, fmt.Errorf("%s changed while it was opened: want a regular file", path)
	}
	raw, err := io.ReadAll(io.LimitReader(f, MaxConfigFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(raw) > MaxConfigFileBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes (16 MiB): want the service's settings", path, MaxConfigFileBytes)
	}
	return raw, nil
}

// regularFile returns an error, naming what it is, when info (of the
// file at path) is not a regular file or is larger than
// MaxConfigFileBytes.
func regularFile(path string, info fs.FileInfo) error {
	switch mode := info.Mode(); {
	case mode.IsRegular() && info.Size() > MaxConfigFileBytes:
		return fmt.Errorf("%s is %d bytes, larger than %d (16 MiB): want the service's settings", path, info.Size(), MaxConfigFileBytes)
	case mode.IsRegular():
		return nil
	default:
		return fmt.Errorf("%s is %s, not a regular file: want a YAML file", path, fileKind(mode))
	}
}

// fileKind names the kind of file that mode, not a regular file's,
// describes.
func fileKind(mode fs.FileMode) string {
	switch {
	case mode.IsDir():
		return "a directory"
	case mode&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case mode&fs.ModeSocket != 0:
		return "a socket"
	case mode&fs.ModeDevice != 0:
		return "a device"
	default:
		return "a special file"
	}
}

// envBool reads the boolean setting of the variable name: the words that
// its key in the YAML file takes (true, false, yes, no, on, off, y, n)
// and those of strconv.ParseBool (1, 0, t, f), in any case, so that a
// value written in either place reads the same in the other.
func envBool(name, v string) (bool, error) {
	switch strings.ToLower(v) {
	case "true", "t", "1", "yes", "y", "on":
		return true, nil
	case "false", "f", "0", "no", "n", "off":
		return false, nil
	}
	return false, fmt.Errorf("%s: want true or false, got %s", name, quoteValue(v))
}
