package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// The relay over the AMQP transport's publisher, on a real RabbitMQ: each
// test uses event types (so exchanges) of its own.

type otherV1 struct {
	N int `json:"n"`
}

func suffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// transport returns a connected AMQP transport on url, closed at the end.
func transport(t testing.TB, url string) *amqp.Transport {
	t.Helper()
	tr, err := amqp.New(amqp.TransportConfig{URL: url, ConnectInterval: 50 * time.Millisecond, MaxConnectInterval: 500 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	require.NoError(t, tr.Connect(ctx))
	return tr
}

// broker is a plain amqp091 connection of the test's own, to set up
// exchanges and queues and read them.
type broker struct {
	conn *amqp091.Connection
	ch   *amqp091.Channel
}

func dialBroker(t testing.TB, url string) *broker {
	t.Helper()
	conn, err := amqp091.Dial(url)
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	b := &broker{conn: conn, ch: ch}
	t.Cleanup(func() { _ = conn.Close() })
	return b
}

// queue declares the exchange of typ as the transport does (durable
// fanout) and a queue bound to it with args, deleted at the end.
func (b *broker) queue(t testing.TB, typ string, durable bool, args amqp091.Table) string {
	t.Helper()
	require.NoError(t, b.ch.ExchangeDeclare(typ, "fanout", true, false, false, false, nil))
	name := typ + ".q." + suffix()
	_, err := b.ch.QueueDeclare(name, durable, false, false, false, args)
	require.NoError(t, err)
	require.NoError(t, b.ch.QueueBind(name, "", typ, false, nil))
	t.Cleanup(func() {
		if ch, err := b.conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
			_ = ch.ExchangeDelete(typ, false, false)
		}
	})
	return name
}

// drain returns the deliveries waiting in queue, in order.
func (b *broker) drain(t testing.TB, queue string) []amqp091.Delivery {
	t.Helper()
	var out []amqp091.Delivery
	for {
		d, ok, err := b.ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

func deliveryIDs(ds []amqp091.Delivery) []string {
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.MessageId
	}
	return ids
}

func (bd *bundle) unsentIDs(t *testing.T) []string {
	t.Helper()
	var ids []string
	require.NoError(t, bd.db.Select(&ids, `SELECT event_id FROM outbox WHERE sent_at IS NULL ORDER BY id`))
	return ids
}

// add records envs in one committed transaction.
func (bd *bundle) add(t *testing.T, envs ...framework.Envelope) {
	t.Helper()
	require.NoError(t, bd.attempt(t, "in-"+suffix(), func(ctx context.Context) error { return bd.box.Add(ctx, envs...) }))
}

func TestRelayAMQP(t *testing.T) {
	t.Parallel()
	url := testenv.Require(t, testenv.AMQPURLVar)
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			testRelayAMQP(t, b, url)
		})
	}
}

func testRelayAMQP(t *testing.T, b backend, url string) {
	ctx := context.Background()

	t.Run("SameMessageAsPublish", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		typ := "outbox.test.same." + suffix()
		ev := framework.Define[noteV1](typ, 1)
		tr := transport(t, url)
		br := dialBroker(t, url)
		q := br.queue(t, typ, false, nil)
		// One event without a subject, one with: the relay sets the
		// partition header from its row (the id, the subject), where
		// Publish decodes the body; the two must agree.
		var envs []framework.Envelope
		for _, a := range []framework.Attributes{
			{ID: "e-1", Source: "notes"},
			{ID: "e-2", Source: "notes", Subject: "appointment-é\"7", SubjectSeq: 3},
		} {
			e, err := ev.Envelope(noteV1{Text: "x"}, a)
			require.NoError(t, err)
			envs = append(envs, e)
		}
		bd.add(t, envs...)
		relay, err := outbox.NewRelay(bd.db, tr.Publisher(), outbox.RelayConfig{})
		require.NoError(t, err)
		n, err := relay.PublishUnsent(ctx)
		require.NoError(t, err)
		require.Equal(t, len(envs), n)
		// The same events through the transport's Publish, as before.
		for _, e := range envs {
			msg, err := framework.NewMessage(e)
			require.NoError(t, err)
			require.NoError(t, tr.Publisher().Publish(typ, msg))
		}

		got := br.drain(t, q)
		require.Len(t, got, 2*len(envs))
		for i, e := range envs {
			relayed, published := got[i], got[len(envs)+i]
			require.Equal(t, published.Body, relayed.Body)
			require.Equal(t, published.Headers, relayed.Headers)
			require.Equal(t, driver.PartitionKey(e.Subject, e.ID), relayed.Headers[amqp.PartitionHeader])
			require.Equal(t, published.ContentType, relayed.ContentType)
			require.Equal(t, amqp091.Persistent, relayed.DeliveryMode)
			require.Equal(t, published.MessageId, relayed.MessageId)
			require.Equal(t, published.Exchange, relayed.Exchange)
			require.Equal(t, published.RoutingKey, relayed.RoutingKey)
		}
		require.Zero(t, bd.unsent(t))
	})

	t.Run("PublishesInIDOrder", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		typ := "outbox.test.order." + suffix()
		ev := framework.Define[noteV1](typ, 1)
		tr := transport(t, url)
		br := dialBroker(t, url)
		q := br.queue(t, typ, false, nil)
		var want []string
		for i := range 3 {
			var envs []framework.Envelope
			for j := range 40 {
				id := fmt.Sprintf("e-%d-%02d", i, j)
				e, err := ev.Envelope(noteV1{Text: id}, framework.Attributes{ID: id, Source: "notes"})
				require.NoError(t, err)
				envs = append(envs, e)
				want = append(want, id)
			}
			bd.add(t, envs...)
		}
		relay, err := outbox.NewRelay(bd.db, tr.Publisher(), outbox.RelayConfig{BatchSize: 50})
		require.NoError(t, err)
		n, err := relay.PublishUnsent(ctx)
		require.NoError(t, err)
		require.Equal(t, len(want), n)
		require.Equal(t, want, deliveryIDs(br.drain(t, q)))
		require.Zero(t, bd.unsent(t))
	})

	// A queue that rejects every publish makes RabbitMQ nack the rows
	// routed to it: they stay unsent, while the rows confirmed around them
	// in the same batch are marked sent. A relay that waits for each
	// confirm before the next publish stops at the first nack instead.
	t.Run("NackedRowStaysUnsentConfirmedAreMarked", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		id := suffix()
		okType, rejType := "outbox.test.ok."+id, "outbox.test.rejected."+id
		okEv, rejEv := framework.Define[otherV1](okType, 1), framework.Define[otherV1](rejType, 1)
		tr := transport(t, url)
		br := dialBroker(t, url)
		okQ := br.queue(t, okType, false, nil)
		rejQ := br.queue(t, rejType, false, amqp091.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"})
		var envs []framework.Envelope
		for i, def := range []framework.Definition[otherV1]{okEv, rejEv, okEv, okEv} {
			e, err := def.Envelope(otherV1{N: i}, framework.Attributes{ID: fmt.Sprintf("e-%d", i), Source: "notes"})
			require.NoError(t, err)
			envs = append(envs, e)
		}
		bd.add(t, envs...)
		relay, err := outbox.NewRelay(bd.db, tr.Publisher(), outbox.RelayConfig{})
		require.NoError(t, err)
		n, err := relay.PublishUnsent(ctx)
		require.ErrorIs(t, err, amqp.ErrNotConfirmed)
		require.Equal(t, 3, n)
		require.Equal(t, []string{"e-1"}, bd.unsentIDs(t), "only the nacked row waits")
		require.Equal(t, []string{"e-0", "e-2", "e-3"}, deliveryIDs(br.drain(t, okQ)))

		// Once the queue takes messages, the row goes out.
		_, err = br.ch.QueueDelete(rejQ, false, false, false)
		require.NoError(t, err)
		rejQ = br.queue(t, rejType, false, nil)
		n, err = relay.PublishUnsent(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Empty(t, bd.unsentIDs(t))
		require.Equal(t, []string{"e-1"}, deliveryIDs(br.drain(t, rejQ)))
	})
}

// TestRelayAMQPBrokerAway: rows published but not yet confirmed when the
// broker goes away stay unsent, and are published once the transport
// reconnected; rows confirmed before are marked sent and are in the
// broker's durable queue after its restart.
//
// The private node's memory alarm (a watermark of 0) blocks publishing
// connections: the relay's batch goes out but no confirm comes back, and
// the node is stopped while the relay waits for them. watermill-amqp races
// on a reconnection by itself, so under -race the test runs again in a
// child `go test` without it.
func TestRelayAMQPBrokerAway(t *testing.T) {
	t.Parallel()
	if testserver.RaceEnabled {
		testserver.RerunWithoutRace(t, "TestRelayAMQPBrokerAway")
		return
	}
	node := testserver.StartRabbitMQ(t)
	ctx := context.Background()
	bd := setup(t, backends[1]) // PostgreSQL: the batch holds its rows' locks while it waits
	typ := "outbox.test.away." + suffix()
	ev := framework.Define[noteV1](typ, 1)
	events := func(prefix string, n int) []framework.Envelope {
		var envs []framework.Envelope
		for i := range n {
			e, err := ev.Envelope(noteV1{Text: "x"}, framework.Attributes{ID: fmt.Sprintf("%s-%02d", prefix, i), Source: "notes"})
			require.NoError(t, err)
			envs = append(envs, e)
		}
		return envs
	}
	tr := transport(t, node.URL)
	br := dialBroker(t, node.URL)
	q := br.queue(t, typ, true, nil)
	relay, err := outbox.NewRelay(bd.db, tr.Publisher(), outbox.RelayConfig{BatchSize: 100})
	require.NoError(t, err)

	bd.add(t, events("before", 20)...)
	n, err := relay.PublishUnsent(ctx)
	require.NoError(t, err)
	require.Equal(t, 20, n)

	node.Ctl(t, "set_vm_memory_high_watermark", "0")
	bd.add(t, events("during", 20)...)
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := relay.PublishUnsent(ctx)
		done <- result{n, err}
	}()
	// The broker blocks the transport's connection once it publishes.
	require.Eventually(t, func() bool {
		return strings.Contains(node.Ctl(t, "list_connections", "state"), "blocked\n")
	}, waitLimit, 50*time.Millisecond)
	require.NoError(t, br.conn.Close())
	node.Stop(t)
	res := <-done
	require.ErrorIs(t, res.err, amqp.ErrNotConfirmed)
	require.Zero(t, res.n)
	require.Len(t, bd.unsentIDs(t), 20, "the unconfirmed batch waits")

	node.Start(t) // the alarm's watermark is not kept
	require.Eventually(t, tr.Ready, waitLimit, 50*time.Millisecond)
	deadline := time.Now().Add(waitLimit)
	for len(bd.unsentIDs(t)) > 0 && time.Now().Before(deadline) {
		_, _ = relay.PublishUnsent(ctx) // fails until the transport reconnected
		time.Sleep(20 * time.Millisecond)
	}
	require.Empty(t, bd.unsentIDs(t), "published after the reconnection")

	br = dialBroker(t, node.URL)
	got := map[string]bool{}
	for _, id := range deliveryIDs(br.drain(t, q)) {
		got[id] = true
	}
	for _, e := range append(events("before", 20), events("during", 20)...) {
		require.True(t, got[e.ID], "%s is in the durable queue", e.ID)
	}
}

// BenchmarkRelay drains b.N rows of a PostgreSQL outbox to RabbitMQ
// (a queue bound to the type's exchange, its length capped so that it
// holds no backlog), through the AMQP transport's publisher with pipelined
// confirms, and, for comparison, through its Publish alone (each row
// waits for its confirm, the relay's path before pipelining), and
// watermill-amqp's confirming publisher with no database at all.
func BenchmarkRelay(b *testing.B) {
	url := testenv.Require(b, testenv.AMQPURLVar)
	type onlyPublish struct{ message.Publisher }
	for _, run := range []struct {
		name string
		pub  func(*amqp.Transport) message.Publisher
	}{
		{"Pipelined", func(tr *amqp.Transport) message.Publisher { return tr.Publisher() }},
		{"ConfirmEach", func(tr *amqp.Transport) message.Publisher { return onlyPublish{tr.Publisher()} }},
	} {
		b.Run(run.name, func(b *testing.B) {
			bd := setupBench(b)
			typ := "outbox.bench." + suffix()
			ev := framework.Define[noteV1](typ, 1)
			tr := transport(b, url)
			br := dialBroker(b, url)
			br.queue(b, typ, false, amqp091.Table{"x-max-length": int32(1000)})
			add := func(n int) {
				for n > 0 {
					m := min(n, 500)
					tx, err := bd.db.BeginTxx(context.Background(), nil)
					require.NoError(b, err)
					for range m {
						e, err := ev.Envelope(noteV1{Text: "benchmark"}, framework.Attributes{ID: suffix() + suffix(), Source: "bench"})
						require.NoError(b, err)
						require.NoError(b, bd.box.AddTx(context.Background(), tx, e))
					}
					require.NoError(b, tx.Commit())
					n -= m
				}
			}
			relay, err := outbox.NewRelay(bd.db, run.pub(tr), outbox.RelayConfig{})
			require.NoError(b, err)
			add(b.N)
			b.ResetTimer()
			n, err := relay.PublishUnsent(context.Background())
			b.StopTimer()
			require.NoError(b, err)
			require.Equal(b, b.N, n)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
	b.Run("WatermillConfirmNoDB", func(b *testing.B) {
		typ := "outbox.bench." + suffix()
		tr := transport(b, url)
		br := dialBroker(b, url)
		br.queue(b, typ, false, amqp091.Table{"x-max-length": int32(1000)})
		msgs := make([]*message.Message, b.N)
		for i := range msgs {
			msgs[i] = message.NewMessage(suffix(), []byte(`{"benchmark":true}`))
		}
		b.ResetTimer()
		for _, m := range msgs {
			require.NoError(b, tr.Publisher().Publish(typ, m))
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}

// setupBench is setup on PostgreSQL for a benchmark.
func setupBench(b *testing.B) *bundle {
	b.Helper()
	db, s := backends[1].open(b)
	require.NoError(b, migrate.Up(context.Background(), db, migrate.Config{}))
	box, err := outbox.New(db, outbox.Config{})
	require.NoError(b, err)
	return &bundle{backend: backends[1], db: db, store: s, box: box}
}
