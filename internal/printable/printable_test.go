package printable_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/printable"
)

// TestString: plain text, accents and emoji are shown as they are;
// control and format characters and bytes that are not UTF-8 as escapes.
func TestString(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain /tmp/a b.db": "plain /tmp/a b.db",
		"café 😀":            "café 😀",
		"x\x1b[31m.db":      `x\x1b[31m.db`,
		"a\nb\tc":           `a\nb\tc`,
		"\u202eevil":        `\u202eevil`,
		"bad\xffbyte":       `bad\xffbyte`,
	} {
		require.Equal(t, want, printable.String(in), "%q", in)
	}
}
