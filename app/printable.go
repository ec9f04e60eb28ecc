package app

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// printable returns s as the operator's commands print it: as it is when
// it is valid UTF-8 without a hidden rune (see hidden), else quoted as Go
// quotes a string, without the quotes, so that a byte that is not UTF-8
// or a hidden rune shows as an escape (\n, \x1b, \u202e). Text that a
// producer or another operator wrote (a message's metadata, a reason)
// then cannot move the cursor, start a new line that looks like a field
// of the command's own, or send the terminal an escape sequence.
func printable(s string) string {
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
