// Package printable shows text that someone else wrote (a message's
// metadata, an operator's reason, a path or value from the
// configuration) on a terminal without letting it act there.
package printable

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// String returns s as it is when it is valid UTF-8 without a hidden rune
// (see hidden), else quoted as Go quotes a string, without the quotes, so
// that a byte that is not UTF-8 or a hidden rune shows as an escape (\n,
// \x1b, \u202e). Such text then cannot move the cursor, start a new line
// that looks like a line of the program's own, or send the terminal an
// escape sequence.
func String(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, hidden) {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// hidden reports a rune that would not show as itself on a terminal: a
// control character (newline and tab included) or a format character,
// such as a bidirectional override.
func hidden(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r)
}
