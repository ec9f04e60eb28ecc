package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv"
)

// purgeTopic runs tr's purge of topic in batches of two until a batch
// deletes fewer, as the service's purge does, and returns how many rows
// it deleted.
func purgeTopic(ctx context.Context, t *testing.T, tr *postgres.Transport, topic string) int64 {
	t.Helper()
	var total int64
	for {
		n, err := tr.PurgeTopicBatch(ctx, topic, time.Hour, 2)
		require.NoError(t, err)
		total += n
		if n < 2 {
			return total
		}
	}
}

// storedUUIDs returns the uuids left in topic's messages table, in order.
func storedUUIDs(t *testing.T, db *sqlx.DB, topic string) []string {
	t.Helper()
	var ids []string
	require.NoError(t, db.Select(&ids, `SELECT uuid FROM `+postgres.MessagesTable("", topic)+` ORDER BY transaction_id, "offset"`))
	return ids
}

// TestTransportPurge publishes, consumes and purges several times, with
// an unpartitioned group ("plain"), a group of two partitions ("parts")
// and one that stops reading ("gone"). The purge deletes the rows older
// than the retention (their created_at set back by the test) that every
// group, and every partition of "parts", has passed; it keeps the rows a
// partition or a group has not passed, and the young ones. Removing
// "gone" lets the purge go on, and the table stays bounded.
func TestTransportPurge(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic, n = "purged.topic", 2
	tr := newTransport(t, db, url)
	s0, s1 := subjectsOf(0, n, 1)[0], subjectsOf(1, n, 1)[0]

	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	plain, gone, parts := newReceiver(), newReceiver(), newReceiver()
	plainCh, err := concurrentSubscriber(t, tr, "plain", topic, 4).Subscribe(ctx, topic)
	require.NoError(t, err)
	plain.consume(t, &wg, 0, plainCh)
	goneSub := concurrentSubscriber(t, tr, "gone", topic, 4)
	goneCh, err := goneSub.Subscribe(ctx, topic)
	require.NoError(t, err)
	gone.consume(t, &wg, 0, goneCh)
	assigner, _, partsCh := partitioned(ctx, t, tr, "parts", topic, n)
	parts.consume(t, &wg, 0, partsCh)
	require.NoError(t, assigner.Assign(ctx, []int{0}))

	// publish publishes count events of round, alternately of s0
	// (partition 0) and s1 (partition 1), and returns their uuids.
	publish := func(round string, count int) []string {
		ids := make([]string, count)
		for i := range ids {
			ids[i] = fmt.Sprintf("%s-%d", round, i)
			subject := []string{s0, s1}[i%2]
			require.NoError(t, tr.Publisher().Publish(topic, message.NewMessage(ids[i], event(ids[i], subject))))
		}
		return ids
	}
	age := func(ids []string) {
		_, err := db.Exec(`UPDATE `+postgres.MessagesTable("", topic)+` SET created_at = created_at - interval '2 hours' WHERE uuid = ANY($1)`, ids)
		require.NoError(t, err)
	}
	// acked waits until each partition of "parts" has acknowledged its
	// last message of ids, and the unpartitioned groups their last.
	acked := func(ids []string, groups ...string) {
		for _, g := range groups {
			waitAcked(t, db, topic, g, ids[len(ids)-1])
		}
		waitAcked(t, db, topic, "parts#0/2", ids[len(ids)-2])
		waitAcked(t, db, topic, "parts#1/2", ids[len(ids)-1])
	}

	// Round 1: everything is old; every group but partition 1 of
	// "parts", not assigned yet, has read it all.
	r1 := publish("r1", 6)
	plain.wait(t, r1...)
	gone.wait(t, r1...)
	waitAcked(t, db, topic, "plain", r1[5])
	waitAcked(t, db, topic, "gone", r1[5])
	waitAcked(t, db, topic, "parts#0/2", r1[4])
	age(r1)
	require.Zero(t, purgeTopic(ctx, t, tr, topic), "partition 1 of parts has read nothing: it pins every row")
	require.Equal(t, r1, storedUUIDs(t, db, topic))

	// Partition 1 reads on: the rows up to the lowest partition's
	// position (r1-4, the last of partition 0) go; r1-5 stays, after
	// partition 0's position.
	require.NoError(t, assigner.Assign(ctx, []int{0, 1}))
	parts.wait(t, r1...)
	waitAcked(t, db, topic, "parts#1/2", r1[5])
	require.Equal(t, int64(5), purgeTopic(ctx, t, tr, topic))
	require.Equal(t, r1[5:], storedUUIDs(t, db, topic))

	// "gone" stops reading. Round 2 is young: r1-5 goes (every group
	// passed it), round 2 stays; once old, "gone" still pins it.
	require.NoError(t, goneSub.Close())
	r2 := publish("r2", 4)
	plain.wait(t, r2...)
	parts.wait(t, r2...)
	acked(r2, "plain")
	require.Equal(t, int64(1), purgeTopic(ctx, t, tr, topic))
	require.Equal(t, r2, storedUUIDs(t, db, topic), "round 2 is younger than the retention")
	age(r2)
	require.Zero(t, purgeTopic(ctx, t, tr, topic), "gone has not passed round 2")
	require.Equal(t, r2, storedUUIDs(t, db, topic))

	// The group nobody reads is removed: a dry run deletes nothing, then
	// the purge goes on up to partition 0's position (r2-2).
	removed, err := tr.RemoveGroup(ctx, "gone", true)
	require.NoError(t, err)
	require.Equal(t, []driver.GroupPosition{{Table: "watermill_offsets_" + topic, Group: "gone", Offset: removed[0].Offset}}, removed)
	require.Positive(t, removed[0].Offset)
	require.Zero(t, purgeTopic(ctx, t, tr, topic), "a dry run removes nothing")
	again, err := tr.RemoveGroup(ctx, "gone", false)
	require.NoError(t, err)
	require.Equal(t, removed, again)
	none, err := tr.RemoveGroup(ctx, "gone", false)
	require.NoError(t, err)
	require.Empty(t, none, "removed already")
	require.Equal(t, int64(3), purgeTopic(ctx, t, tr, topic))
	require.Equal(t, r2[3:], storedUUIDs(t, db, topic))

	// More rounds: the table holds what is young or not passed, no more.
	for round := 3; round < 6; round++ {
		left := storedUUIDs(t, db, topic)
		ids := publish(fmt.Sprintf("r%d", round), 4)
		plain.wait(t, ids...)
		parts.wait(t, ids...)
		acked(ids, "plain")
		age(append(left, ids[:2]...))
		purgeTopic(ctx, t, tr, topic)
		require.Equal(t, ids[2:], storedUUIDs(t, db, topic),
			"round %d: the rows left before it, aged since, and its first two are old and passed by all; the others are young", round)
	}
	n2, err := tr.PurgeableTopic(ctx, topic, time.Hour)
	require.NoError(t, err)
	require.Zero(t, n2)
}
