package jsonescape_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/jsonescape"
)

func TestUnescape(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		r    rune
		size int
	}{
		{`\"rest`, '"', 2},
		{`\\`, '\\', 2},
		{`\/`, '/', 2},
		{`\n`, '\n', 2},
		{`\u0041B`, 'A', 6},
		{`\u00e9`, 'é', 6},
		{`\u0000`, 0, 6},
		{`\ud83c\udf89`, '🎉', 12},   // a pair: one rune
		{`\ud83c\u0041`, 0xd83c, 6}, // a high surrogate, then no low one
		{`\ud83c`, 0xd83c, 6},       // a high surrogate at the end
		{`\udf89\ud83c`, 0xdf89, 6}, // a low surrogate first
		{`\uD83C\uDF89`, '🎉', 12},   // upper-case digits
		{`\u12`, 0, 0},              // too short
		{`\u12g4`, 0, 0},            // not hex
		{`\x`, 0, 0},                // no such escape
		{`\`, 0, 0},                 // nothing after the backslash
		{`u0041`, 0, 0},             // no backslash
	} {
		r, size := jsonescape.Unescape([]byte(tc.raw))
		require.Equal(t, tc.size, size, "%s", tc.raw)
		if size > 0 {
			require.Equal(t, tc.r, r, "%s", tc.raw)
		}
	}
}
