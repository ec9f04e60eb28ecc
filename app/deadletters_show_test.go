package app_test

import (
	"fmt"
	"os/user"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
)

// TestDeadLetterShowNotCloudEvent: a dead letter whose body is not a
// CloudEvent (a malformed message) shows that instead of "type - v0",
// its body escaped, and with --raw its body's exact bytes only.
func TestDeadLetterShowNotCloudEvent(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	b := setup(t, cfg)
	store := testStore(t, b.db)
	body := []byte("not a cloudevent\x00\xff\n\x1b[2J")
	require.NoError(t, store.PublishDeadLetter(t.Context(), driver.DeadLetter{
		Consumer: consumerName, Topic: widgetAdded.Type(), EventID: "m-1",
		Code: "malformed_envelope", Attempts: 1, Body: body,
	}))
	dls, err := store.DeadLetters(t.Context(), driver.DeadLetterFilter{Consumer: consumerName})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	id := fmt.Sprint(dls[0].ID)

	out, err := runCommand(t, commandOptions(cfg), "dead-letters", "show", id)
	require.NoError(t, err)
	require.Regexp(t, `(?m)^type\s+none: the body is not a CloudEvent the consumer could read$`, out)
	require.NotContains(t, out, "v0")
	require.Contains(t, out, `  "not a cloudevent\x00\xff\n\x1b[2J"`+"\n", "escaped")
	require.NotContains(t, out, "\x1b")

	out, err = runCommand(t, commandOptions(cfg), "dead-letters", "show", id, "--raw")
	require.NoError(t, err)
	require.Equal(t, string(body), out, "the exact bytes, nothing else")
}

// TestResolveByOSUser: without --by and without $USER (a container, a CI
// job), a resolution is recorded as the OS user's; an empty --by is
// refused in one line naming the flag.
func TestResolveByOSUser(t *testing.T) {
	t.Setenv("USER", "")
	cfg := testConfig(t)
	b := setup(t, cfg)
	id := fmt.Sprint(storeDeadLetter(t, b.db, consumerName, "w-by", "", 0))
	me, err := user.Current()
	require.NoError(t, err)

	_, err = runCommand(t, commandOptions(cfg), "dead-letters", "discard", id, "--by", "", "--reason", "test")
	require.EqualError(t, err, "--by: say who you are: the name is blank (--by, else $USER, else the OS user)")

	_, err = runCommand(t, commandOptions(cfg), "dead-letters", "discard", id, "--reason", "test")
	require.NoError(t, err)
	require.Equal(t, 1, b.count(t, b.db.Rebind(`SELECT count(*) FROM dead_letter_history WHERE kind = 'discarded' AND actor = ?`), me.Username))
}
