package keypath_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/keypath"
)

func TestPrefix(t *testing.T) {
	t.Parallel()
	err := errors.Join(
		keypath.Errorf("attempts", "want 1 or more, got %d", 0),
		keypath.Errorf("breaker.max_hold", "too long"),
		keypath.Errorf("", "attempts × timeout: too long"),
		errors.New("plain"),
	)
	got := keypath.Prefix("consumers.a", err)
	require.EqualError(t, got, "consumers.a.attempts: want 1 or more, got 0\n"+
		"consumers.a.breaker.max_hold: too long\n"+
		"consumers.a: attempts × timeout: too long\n"+
		"consumers.a: plain")
	require.EqualError(t, keypath.Prefix("Config", keypath.Prefix("Settings", keypath.Errorf("timeout", "bad"))), "Config.Settings.timeout: bad")
	require.NoError(t, keypath.Prefix("x", nil))
	require.Len(t, keypath.Split(got), 4)
	require.Nil(t, keypath.Split(nil))
}
