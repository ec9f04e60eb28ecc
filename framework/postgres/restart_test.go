package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver/transporttest"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// TestServerRestart restarts a private PostgreSQL cluster, which holds
// the transport's tables, while a subscriber drains a backlog: the
// subscriber and the publisher's pool reconnect by themselves and nothing
// is lost.
func TestServerRestart(t *testing.T) {
	t.Parallel()
	c := testserver.StartPostgres(t)
	env := postgresEnv(t, c.URL)
	env.Timeout = 90 * time.Second
	transporttest.ExerciseServerRestart(t, env, func(t *testing.T) {
		c.Stop(t)
		time.Sleep(time.Second)
		c.Start(t)
	})
}

// TestFailoverLostRows fails over to an asynchronous standby that missed
// the last messages, which the subscriber had read and acknowledged: the
// promoted standby assigns their transactions' ids again, so the messages
// published next sort before the subscriber's cursor. The subscriber,
// given both servers in one URL, reads on from its group's stored
// position: it delivers every message published after the failover, and
// never the lost ones, whose rows are gone. It skipped the new ones.
func TestFailoverLostRows(t *testing.T) {
	t.Parallel()
	const topic, group = "failover", "failover"
	p, db, tr, ctx, ch := subscribeOnPair(t, topic, group)
	ackAll := func(uuids ...string) {
		t.Helper()
		want := make(map[string]bool)
		for _, id := range uuids {
			want[id] = true
		}
		for range uuids {
			msg := receive(ctx, t, ch, "the messages "+strings.Join(uuids, ", "))
			require.True(t, want[msg.UUID], "%s delivered, want one of %v", msg.UUID, uuids)
			delete(want, msg.UUID)
			msg.Ack()
		}
		waitAcked(t, db, topic, group, uuids[len(uuids)-1])
	}
	publishUUIDs(t, tr.Publisher(), topic, "a1", "a2")
	ackAll("a1", "a2")
	p.WaitReplayed(t)

	p.Standby.Stop(t) // it misses what comes next
	publishUUIDs(t, tr.Publisher(), topic, "l1", "l2", "l3")
	ackAll("l1", "l2", "l3")
	p.Primary.Kill(t)
	p.Standby.Start(t)
	p.Standby.Promote(t)

	for _, id := range []string{"b1", "b2"} {
		require.Eventually(t, func() bool {
			return tr.Publisher().Publish(topic, message.NewMessage(id, []byte(`{"id":"`+id+`"}`))) == nil
		}, 30*time.Second, 50*time.Millisecond, "publish %s on the new primary", id)
	}
	ackAll("b1", "b2")
	var lost int
	require.NoError(t, db.Get(&lost, `SELECT count(*) FROM `+postgres.MessagesTable("", topic)+` WHERE uuid LIKE 'l%'`))
	require.Zero(t, lost, "the lost messages' rows are gone")
	select {
	case msg := <-ch:
		t.Fatalf("%s delivered after the failover's messages", msg.UUID)
	case <-time.After(500 * time.Millisecond):
	}
}

// TestFailoverLostAcks fails over to an asynchronous standby that has
// the last messages' rows but not their acknowledgements (as it may lack
// their effects, committed just before): the subscriber, which had
// acknowledged them, delivers them again from its group's position on
// the new primary, so that their effects, if lost, take place again.
func TestFailoverLostAcks(t *testing.T) {
	t.Parallel()
	const topic, group = "failover", "failover"
	p, db, tr, ctx, ch := subscribeOnPair(t, topic, group)
	publishUUIDs(t, tr.Publisher(), topic, "a1")
	receive(ctx, t, ch, "a1").Ack()
	waitAcked(t, db, topic, group, "a1")
	publishUUIDs(t, tr.Publisher(), topic, "r1", "r2")
	held := []*message.Message{receive(ctx, t, ch, "r1 or r2"), receive(ctx, t, ch, "r1 or r2")}
	p.WaitReplayed(t)

	p.Standby.Stop(t) // it misses the acknowledgements
	for _, msg := range held {
		msg.Ack()
	}
	waitAcked(t, db, topic, group, "r2")
	p.Primary.Kill(t)
	p.Standby.Start(t)
	p.Standby.Promote(t)

	got := make(map[string]bool)
	for range 2 {
		msg := receive(ctx, t, ch, "r1 and r2 again")
		got[msg.UUID] = true
		msg.Ack()
	}
	require.Equal(t, map[string]bool{"r1": true, "r2": true}, got, "the messages whose acknowledgements the failover lost come again")
}

// subscribeOnPair starts a primary with an asynchronous standby, and a
// transport given both in one URL, subscribed to topic as group four at
// a time; the context to wait for its messages in lasts a minute.
func subscribeOnPair(t *testing.T, topic, group string) (*testserver.Pair, *sqlx.DB, *postgres.Transport, context.Context, <-chan *message.Message) {
	t.Helper()
	p := testserver.StartPair(t, false)
	url := p.URL("postgres")
	db := open(t, url, 4)
	tr := newTransport(t, db, url)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	ch, err := concurrentSubscriber(t, tr, group, topic, 4).Subscribe(ctx, topic)
	require.NoError(t, err)
	return p, db, tr, ctx, ch
}
