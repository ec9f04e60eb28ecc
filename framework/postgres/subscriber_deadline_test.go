package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv"
)

// deadlineSubscription publishes ids to topic and returns the messages
// that a subscriber of a group of the topic's name hands out, up to four
// at once, on a transport whose ack deadline is deadline.
func deadlineSubscription(ctx context.Context, t *testing.T, topic string, deadline time.Duration, ids ...string) <-chan *message.Message {
	t.Helper()
	url := testenv.PostgresURL(t)
	cfg := fastTransport
	cfg.URL = url
	cfg.AckDeadline = deadline
	tr, err := postgres.New(context.Background(), open(t, url, 4), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	ch, err := concurrentSubscriber(t, tr, topic, topic, 4).Subscribe(ctx, topic)
	require.NoError(t, err)
	// In one Publish, one transaction: published one by one, on a loaded
	// machine the first message's deadline passed before the second
	// was in the table, and the first came again before it.
	msgs := make([]*message.Message, len(ids))
	for i, id := range ids {
		msgs[i] = message.NewMessage(id, []byte(`{"id":"`+id+`"}`))
	}
	require.NoError(t, tr.Publisher().Publish(topic, msgs...))
	return ch
}

// TestSubscriberAckDeadline hands out four messages at once and settles
// two of them, and a fifth: the two left are handed out again once their
// ack deadline passed, oldest first, as redeliveries, while the settled
// ones are not. A late Ack of a delivery given up still acknowledges its
// message: nothing comes after.
func TestSubscriberAckDeadline(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const deadline = time.Second
	ch := deadlineSubscription(ctx, t, "deadline", deadline, "a", "b", "c", "d", "e")

	first := map[string]time.Time{}
	held := map[string]*message.Message{}
	for _, id := range []string{"a", "b", "c", "d"} {
		before := time.Now() // see TestSubscriberAckDeadlineBehindMany
		msg := receive(ctx, t, ch, id)
		require.Equal(t, id, msg.UUID)
		first[id], held[id] = before, msg
	}
	receivedA := held["a"]
	for _, id := range []string{"b", "c"} {
		held[id].Ack()
	}
	e := receive(ctx, t, ch, "e, in the place b and c left")
	require.Equal(t, "e", e.UUID)
	e.Ack()

	for _, id := range []string{"a", "d"} {
		msg := receive(ctx, t, ch, id+" again, past its ack deadline")
		require.Equal(t, id, msg.UUID, "the deliveries given up come again oldest first, and only they")
		require.GreaterOrEqual(t, time.Since(first[id]), deadline, "%s came again before its deadline", id)
		require.Equal(t, "true", redeliveredSaid(msg))
		if id == "d" {
			msg.Ack()
		}
	}
	receivedA.Ack() // late: a was given up and handed out again
	select {
	case msg := <-ch:
		t.Fatalf("%s came again, acknowledged", msg.UUID)
	case <-time.After(3 * deadline):
	}
}

// TestSubscriberAckDeadlineBehindMany holds the first message while a
// hundred after it are handed out and acknowledged: the first still comes
// again once its deadline passed, and nothing else does.
func TestSubscriberAckDeadlineBehindMany(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const deadline = 5 * time.Second // a hundred go by long before it
	ids := []string{"held"}
	for i := range 100 {
		ids = append(ids, fmt.Sprintf("m%d", i))
	}
	ch := deadlineSubscription(ctx, t, "deadlinemany", deadline, ids...)

	// Before the receive: the subscription takes the time of its
	// delivery once the channel took it, which may be before this
	// goroutine runs again.
	first := time.Now()
	held := receive(ctx, t, ch, "held")
	require.Equal(t, "held", held.UUID)
	seen := map[string]int{}
	for len(seen) < len(ids) {
		msg := receive(ctx, t, ch, "the others, then held again")
		seen[msg.UUID]++
		require.Equal(t, 1, seen[msg.UUID], "%s came twice", msg.UUID)
		if msg.UUID == "held" {
			require.GreaterOrEqual(t, time.Since(first), deadline, "held came again before its deadline")
		}
		msg.Ack()
	}
	select {
	case msg := <-ch:
		t.Fatalf("%s came again, acknowledged", msg.UUID)
	case <-time.After(2 * time.Second):
	}
}
