package app_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/postgres"
)

// TestRemoveGroupCommand runs the operator's commands on the postgres
// transport: the purge deletes no message of a topic while a group
// nobody reads any more ("old", at the first message) has not passed it;
// consumers remove-group refuses a declared consumer, prints with
// --dry-run what it would remove and removes nothing, then removes the
// group, and the next purge deletes the messages the declared consumer's
// group passed, older than transport_retention.
func TestRemoveGroupCommand(t *testing.T) {
	t.Parallel()
	cfg := postgresConfig(t)
	cfg.TransportRetention = app.Duration(time.Hour)
	opts := commandOptions(cfg)
	_, err := runCommand(t, opts, "migrate")
	require.NoError(t, err)
	db := openConfigured(t, cfg.DatabaseURL)
	ctx := context.Background()
	const topic = "widgets.widget.added"
	tr, err := postgres.New(ctx, db, postgres.TransportConfig{URL: cfg.TransportURL})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	for _, consumer := range []string{"old", consumerName} {
		sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: consumer, Types: []string{topic}})
		require.NoError(t, err)
		require.NoError(t, sub.Initialize())
		require.NoError(t, sub.Subscriber.Close())
	}
	for _, id := range []string{"m-1", "m-2", "m-3"} {
		require.NoError(t, tr.Publisher().Publish(topic, message.NewMessage(id, []byte(`{}`))))
	}
	messages, offsets := postgres.MessagesTable("", topic), postgres.OffsetsTable("", topic)
	// The declared consumer read everything, "old" nothing; every
	// message is two hours old.
	_, err = db.Exec(`UPDATE ` + offsets + ` AS o SET offset_acked = m."offset", last_processed_transaction_id = m.transaction_id
		FROM (SELECT "offset", transaction_id FROM ` + messages + ` ORDER BY transaction_id DESC, "offset" DESC LIMIT 1) AS m
		WHERE o.consumer_group = '` + consumerName + `'`)
	require.NoError(t, err)
	_, err = db.Exec(`UPDATE ` + messages + ` SET created_at = created_at - interval '2 hours'`)
	require.NoError(t, err)
	stored := func() int {
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM `+messages))
		return n
	}

	out, err := runCommand(t, opts, "purge")
	require.NoError(t, err)
	require.Regexp(t, `transport messages of `+topic+`\s+\S+\s+0\n`, out)
	require.Equal(t, 3, stored(), "old pins every message")

	_, err = runCommand(t, opts, "consumers", "remove-group", consumerName)
	require.ErrorContains(t, err, "is declared in this service")
	out, err = runCommand(t, opts, "consumers", "remove-group", "old", "--dry-run")
	require.NoError(t, err)
	require.Regexp(t, `watermill_offsets_`+topic+`\s+old\s+0\n`, out)
	require.Contains(t, out, "would remove (dry run; nothing removed) 1 consumer group rows of old")
	out, err = runCommand(t, opts, "purge", "--dry-run")
	require.NoError(t, err)
	require.Regexp(t, `transport messages of `+topic+`\s+\S+\s+0\n`, out, "the dry run removed nothing")

	out, err = runCommand(t, opts, "consumers", "remove-group", "old")
	require.NoError(t, err)
	require.Contains(t, out, "removed 1 consumer group rows of old")
	out, err = runCommand(t, opts, "consumers", "remove-group", "old")
	require.NoError(t, err)
	require.Contains(t, out, "nothing to do")

	out, err = runCommand(t, opts, "purge", "--dry-run")
	require.NoError(t, err)
	require.Regexp(t, `transport messages of `+topic+`\s+\S+\s+3\n`, out)
	out, err = runCommand(t, opts, "purge")
	require.NoError(t, err)
	require.Regexp(t, `transport messages of `+topic+`\s+\S+\s+3\n`, out)
	require.Zero(t, stored(), "nothing pins the messages any more")
}

// TestPurgerTransport runs a service on the postgres transport whose
// purge runs every 20 ms: a message its consumer handled, set back two
// hours by the test, is deleted from the transport's table in the
// background; one handled now stays (transport_retention 1h).
func TestPurgerTransport(t *testing.T) {
	t.Parallel()
	cfg := postgresConfig(t)
	cfg.TransportRetention = app.Duration(time.Hour)
	cfg.PurgeInterval = app.Duration(20 * time.Millisecond)
	b := setupRebound(t, cfg)
	b.publish(t, "e-1", "one")
	b.publish(t, "e-2", "two")
	waitFor(t, "the effects", func() bool { return b.count(t, `SELECT count(*) FROM widgets`) == 2 })
	messages := postgres.MessagesTable("", "widgets.widget.added")
	count := func(where string) int { return b.count(t, `SELECT count(*) FROM `+messages+` WHERE `+where) }
	require.Equal(t, 2, count("true"))
	_, err := b.db.Exec(`UPDATE ` + messages + ` SET created_at = created_at - interval '2 hours' WHERE payload::text LIKE '%"e-1"%'`)
	require.NoError(t, err)
	waitFor(t, "the old message purged", func() bool { return count(`payload::text LIKE '%"e-1"%'`) == 0 })
	require.Equal(t, 1, count(`payload::text LIKE '%"e-2"%'`), "the recent message stays")
}
