package driver

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
)

// scanStatements reads query as its database splits it into statements,
// and reports whether one of them begins or ends a transaction (ends:
// its first word is BEGIN, START TRANSACTION, COMMIT, END, ROLLBACK but
// ROLLBACK TO a savepoint, ABORT or PREPARE TRANSACTION, in any case) and
// whether one may change a setting of the session (sets: it starts with
// SET or RESET, or query calls set_config; an UPDATE's SET does not
// count). pg selects PostgreSQL's lexical rules (nested
// /* */ comments, dollar quotes, E'...' strings with backslash escapes,
// BEGIN ATOMIC bodies), else SQLite's (flat comments, backquoted and [] quoted
// names, CREATE TRIGGER bodies). A statement's words are looked for
// outside string literals, quoted names and comments, so a COMMIT in a
// literal is never taken for one, and none hides behind a semicolon, a
// comment or white space of any kind. On PostgreSQL a backslash escapes
// a quote in a plain '...' string too where standard_conforming_strings
// is off (a setting of the server, the database, the role or the
// session), which moves where the strings end: a query with a backslash
// is read both ways, and what either reading finds counts (a write is one
// by both). It also reports whether query is a single write (write: one
// statement, whose first word is INSERT, UPDATE, DELETE or MERGE), which
// may wait in its batch's queue (see execQueuer). It does not allocate.
func scanStatements(query string, pg bool) scanned {
	r := scanAs(query, pg, false)
	if pg && strings.IndexByte(query, '\\') >= 0 {
		e := scanAs(query, pg, true)
		r.ends, r.sets, r.write = r.ends || e.ends, r.sets || e.sets, r.write && e.write
	}
	return r
}

// scanned is what scanStatements finds in a query.
type scanned struct {
	ends, sets, write bool
	stmts             int // the statements with words read so far
}

// scanAs is scanStatements under one reading of plain strings: with
// backslash escapes in them (PostgreSQL's standard_conforming_strings
// off), or without.
func scanAs(query string, pg, escapes bool) scanned {
	var (
		s stmtScan
		r scanned
	)
	for i := 0; i < len(query); {
		c := query[i]
		switch {
		case c == ';':
			if s.parens == 0 && s.depth == 0 {
				s.end(&r)
			}
			i++
		case c == '(':
			s.parens++
			i++
		case c == ')':
			s.parens = max(s.parens-1, 0)
			i++
		case c == '-' && i+1 < len(query) && query[i+1] == '-':
			j := strings.IndexByte(query[i:], '\n')
			if j < 0 {
				s.end(&r)
				return r
			}
			i += j + 1
		case c == '/' && i+1 < len(query) && query[i+1] == '*':
			i = skipComment(query, i, pg)
		case c == '\'':
			i = skipQuoted(query, i, c, escapes)
		case c == '"':
			i = skipQuoted(query, i, c, false)
		case !pg && c == '`':
			i = skipQuoted(query, i, c, false)
		case !pg && c == '[':
			j := strings.IndexByte(query[i:], ']')
			if j < 0 {
				s.end(&r)
				return r
			}
			i += j + 1
		case pg && c == '$':
			i = skipDollar(query, i)
		case isWordStart(c):
			j := i + 1
			for j < len(query) && (isIdentByte(query[j]) || pg && query[j] == '$') {
				j++
			}
			if pg && j == i+1 && c|0x20 == 'e' && j < len(query) && query[j] == '\'' {
				i = skipQuoted(query, j, '\'', true) // E'...': backslash escapes
				continue
			}
			s.word(query[i:j], pg)
			i = j
		default:
			i++ // white space of any kind, operators, numbers
		}
	}
	s.end(&r)
	r.sets = r.sets || callsSetConfig(query)
	return r
}

// stmtScan is what scanStatements knows of the statement it reads.
type stmtScan struct {
	words  [3]string // the statement's first words
	n      int       // how many words the statement has had
	parens int       // open parentheses
	// depth counts the open BEGIN ... END blocks (and CASE ... END within
	// them) of a CREATE TRIGGER's body on SQLite, or of a BEGIN ATOMIC
	// body on PostgreSQL, whose statements do not end the CREATE.
	depth   int
	trigger bool   // the statement is a CREATE ... TRIGGER
	prev    string // the word before
}

// word records w, the next word of the statement.
func (s *stmtScan) word(w string, pg bool) {
	if s.n < len(s.words) {
		s.words[s.n] = w
	}
	s.n++
	create := strings.EqualFold(s.words[0], "create")
	switch {
	case !create:
	case s.depth > 0 && (strings.EqualFold(w, "case") || strings.EqualFold(w, "begin")):
		s.depth++
	case s.depth > 0 && strings.EqualFold(w, "end"):
		s.depth--
	case !pg && strings.EqualFold(w, "trigger"):
		s.trigger = true
	case !pg && s.trigger && strings.EqualFold(w, "begin"),
		pg && strings.EqualFold(w, "atomic") && strings.EqualFold(s.prev, "begin"):
		s.depth = 1
	}
	s.prev = w
}

// end ends the statement: it adds what the statement does to r, and
// starts the next statement.
func (s *stmtScan) end(r *scanned) {
	w, words := s.words, s.n
	*s = stmtScan{}
	if words == 0 {
		return
	}
	r.stmts++
	r.write = r.stmts == 1 && (strings.EqualFold(w[0], "insert") || strings.EqualFold(w[0], "update") ||
		strings.EqualFold(w[0], "delete") || strings.EqualFold(w[0], "merge"))
	switch {
	case strings.EqualFold(w[0], "set"), strings.EqualFold(w[0], "reset"):
		r.sets = true
	case strings.EqualFold(w[0], "begin"), strings.EqualFold(w[0], "commit"),
		strings.EqualFold(w[0], "end"), strings.EqualFold(w[0], "abort"):
		r.ends = true
	case strings.EqualFold(w[0], "rollback"):
		next := w[1]
		if strings.EqualFold(next, "work") || strings.EqualFold(next, "transaction") {
			next = w[2]
		}
		r.ends = r.ends || !strings.EqualFold(next, "to")
	case strings.EqualFold(w[0], "start"), strings.EqualFold(w[0], "prepare"):
		r.ends = r.ends || strings.EqualFold(w[1], "transaction")
	}
}

// skipComment returns the index after the /* */ comment at i, nested on
// PostgreSQL; len(query) when it does not end.
func skipComment(query string, i int, pg bool) int {
	depth := 0
	for i < len(query)-1 {
		switch {
		case query[i] == '/' && query[i+1] == '*':
			depth++
			i += 2
		case query[i] == '*' && query[i+1] == '/':
			depth--
			i += 2
			if depth == 0 || !pg {
				return i
			}
		default:
			i++
		}
	}
	return len(query)
}

// skipQuoted returns the index after the literal or quoted name that
// opens with the quote at i (a doubled quote stays inside, and so does an
// escaped one when backslash is true); len(query) when it does not end.
func skipQuoted(query string, i int, quote byte, backslash bool) int {
	for i++; i < len(query); i++ {
		switch query[i] {
		case '\\':
			if backslash {
				i++
			}
		case quote:
			if i+1 < len(query) && query[i+1] == quote {
				i++
				continue
			}
			return i + 1
		}
	}
	return len(query)
}

// skipDollar returns the index after the dollar-quoted string at i
// ($$...$$, $tag$...$tag$) on PostgreSQL, or after the $ when none opens
// there (a parameter such as $1).
func skipDollar(query string, i int) int {
	j := i + 1
	if j < len(query) && isWordStart(query[j]) {
		for j < len(query) && isIdentByte(query[j]) {
			j++
		}
	}
	if j >= len(query) || query[j] != '$' {
		return i + 1
	}
	tag := query[i : j+1]
	k := strings.Index(query[j+1:], tag)
	if k < 0 {
		return len(query)
	}
	return j + 1 + k + len(tag)
}

// isWordStart reports whether b may begin an SQL identifier or keyword.
func isWordStart(b byte) bool {
	return b == '_' || b|0x20 >= 'a' && b|0x20 <= 'z' || b >= 0x80
}

// callsSetConfig reports whether query names set_config, in any case, as
// a word of its own (not offset_config), without allocating.
func callsSetConfig(query string) bool {
	const name = "set_config"
	for i := 0; i+len(name) <= len(query); i++ {
		if query[i]|0x20 != 's' || !strings.EqualFold(query[i:i+len(name)], name) {
			continue
		}
		if i == 0 || !isIdentByte(query[i-1]) {
			return true
		}
	}
	return false
}

// isIdentByte reports whether b may be part of an SQL identifier.
func isIdentByte(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b|0x20 >= 'a' && b|0x20 <= 'z' || b >= 0x80
}

// sqlStateError is a database driver's error that carries its SQLSTATE,
// as pgx's *pgconn.PgError and lib/pq's *pq.Error do.
type sqlStateError interface {
	error
	SQLState() string
}

// inFailedTransaction reports whether err is PostgreSQL's refusal of a
// statement in a transaction that the failure of an earlier statement
// aborted (SQLSTATE 25P02, in_failed_sql_transaction): under group
// commit, the earlier statement may have been a batch-mate's.
func inFailedTransaction(err error) bool {
	var s sqlStateError
	return errors.As(err, &s) && s.SQLState() == "25P02"
}

// dataException returns err, a handler's, as a permanent CodeDataException
// error when it is a database's refusal of a value (SQLSTATE class 22)
// that the handler did not classify itself (Permanent, Dependency);
// otherwise err.
func dataException(err error) error {
	var s sqlStateError
	if !errors.As(err, &s) || !strings.HasPrefix(s.SQLState(), "22") || framework.IsPermanent(err) || framework.IsDependency(err) {
		return err
	}
	return framework.Permanent(framework.CodeDataException, err)
}

// errTxEnded is the error of a batch whose transaction a statement of
// one of its attempts ended (see group.txEnded).
var errTxEnded = errors.New("the batch's transaction ended with a failed statement of an attempt")

// txEnded reports whether the batch's transaction tx ended, on SQLite,
// where a failed statement may end it (see Tx.failed): BEGIN fails
// within a transaction and succeeds only outside one, and the
// transaction it then begins rolls back with tx; on the framework's
// SQLite driver, which refuses every statement of a transaction SQLite
// rolled back, the BEGIN fails with SQLSTATE 25P02 (sqlite.ErrRolledBack).
// On PostgreSQL a failed statement aborts the transaction instead, which
// the next statement reports (SQLSTATE 25P02, see inFailedTransaction).
func (g *group) txEnded(ctx context.Context, tx sqlx.ExecerContext) bool {
	if g.u.db.DriverName() == "pgx" {
		return false
	}
	_, err := tx.ExecContext(ctx, "BEGIN")
	return err == nil || inFailedTransaction(err)
}

// resetSession undoes, on PostgreSQL, the settings an attempt made in the
// batch's transaction (SET LOCAL, set_config(..., true); a plain SET too)
// before the next attempt runs: RESET ALL returns every setting to the
// session's default (the server's, the role's, the database's and the
// connection string's), then the batch's statement timeout is set again.
// SQLite has no such settings.
func (g *group) resetSession(ctx context.Context, tx sqlx.ExecerContext, timeout string) error {
	if g.u.db.DriverName() != "pgx" {
		return nil
	}
	if _, err := tx.ExecContext(ctx, "RESET ALL"); err != nil {
		return fmt.Errorf("reset the settings of the attempt before: %w", err)
	}
	if timeout != "" {
		if _, err := tx.ExecContext(ctx, timeout); err != nil {
			return fmt.Errorf("statement timeout: %w", err)
		}
	}
	return nil
}
