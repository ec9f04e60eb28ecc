// Package jsonescape decodes the escapes of JSON strings as they are
// written, without decoding the text around them: the framework's reader
// of envelopes refuses what encoding/json would quietly replace (a lone
// surrogate), and the PostgreSQL transport finds the payloads that jsonb
// refuses.
package jsonescape

import "unicode/utf16"

// Unescape decodes the escape at the start of raw (a backslash and what
// follows) and returns its rune and the bytes it took; 0 bytes when it is
// not a valid escape. A surrogate pair of \u escapes is one rune; a lone
// surrogate (U+D800 to U+DFFF) is returned as it is, for the caller to
// refuse.
func Unescape(raw []byte) (rune, int) {
	if len(raw) < 2 || raw[0] != '\\' {
		return 0, 0
	}
	switch raw[1] {
	case '"', '\\', '/':
		return rune(raw[1]), 2
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
	default:
		return 0, 0
	}
	r := hex4(raw[2:])
	if r < 0 {
		return 0, 0
	}
	if utf16.IsSurrogate(r) && r < 0xdc00 && len(raw) >= 12 && raw[6] == '\\' && raw[7] == 'u' {
		if lo := hex4(raw[8:]); lo >= 0xdc00 && lo <= 0xdfff {
			return utf16.DecodeRune(r, lo), 12
		}
	}
	return r, 6
}

// hex4 returns the value of the four hex digits at the start of b, or -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return -1
		}
	}
	return r
}
